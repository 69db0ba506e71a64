"""``flask defer ...`` commands, run through Flask's CLI runner against a real database."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta

import pytest
from sqlalchemy import inspect

from flask_defer import Job, JobStatus
from flask_defer.timeutil import utcnow

from ..conftest import AppKit


@pytest.fixture
def cli_kit(make_app: Callable[..., AppKit]) -> AppKit:
    kit = make_app()

    @kit.defer.job("send_email")
    def send_email(job: Job) -> None:
        pass

    return kit


def invoke(kit: AppKit, *args: str) -> tuple[int, str]:
    result = kit.app.test_cli_runner().invoke(args=["defer", *args])
    return result.exit_code, result.output


def schedule(kit: AppKit, **kwargs: object) -> Job:
    with kit.context():
        job = kit.defer.schedule("send_email", **kwargs)  # type: ignore[arg-type]
        kit.db.session.commit()
        return job


def test_install_creates_the_table(cli_kit: AppKit) -> None:
    code, output = invoke(cli_kit, "install")
    assert code == 0, output
    assert "defer_jobs is ready" in output
    with cli_kit.context():
        assert "defer_jobs" in inspect(cli_kit.db.engine).get_table_names()
    assert invoke(cli_kit, "install")[0] == 0  # idempotent


def test_list_shows_jobs_and_filters(cli_kit: AppKit) -> None:
    invoke(cli_kit, "install")
    schedule(cli_kit, key="booking:1:close", delay=60)
    schedule(cli_kit, key="other", delay=60)
    code, output = invoke(cli_kit, "list", "--key-prefix", "booking:")
    assert code == 0 and "booking:1:close" in output and "other" not in output
    code, output = invoke(cli_kit, "list", "--json", "--status", "pending")
    rows = json.loads(output)
    assert {row["key"] for row in rows} == {"booking:1:close", "other"}


def test_list_json_of_no_jobs_prints_an_empty_array(cli_kit: AppKit) -> None:
    invoke(cli_kit, "install")
    assert invoke(cli_kit, "list", "--json") == (0, "[]\n")
    schedule(cli_kit, key="booking:1:close", delay=60)
    code, output = invoke(cli_kit, "list", "--json", "--status", "done")
    assert (code, json.loads(output)) == (0, [])


def test_schedules_json_of_no_schedules_prints_an_empty_array(cli_kit: AppKit) -> None:
    invoke(cli_kit, "install")
    assert invoke(cli_kit, "schedules", "--json") == (0, "[]\n")


def test_cancel_by_id_key_and_prefix_with_exit_codes(cli_kit: AppKit) -> None:
    invoke(cli_kit, "install")
    first = schedule(cli_kit, delay=60)
    schedule(cli_kit, key="message:2:send", delay=60)
    schedule(cli_kit, key="booking:9:a", delay=60)
    schedule(cli_kit, key="booking:9:b", delay=60)
    assert invoke(cli_kit, "cancel", str(first.id)) == (0, f"cancelled job {first.id}\n")
    code, output = invoke(cli_kit, "cancel", str(first.id))
    assert code == 1 and f"not cancelled: job {first.id} is cancelled" in output
    assert invoke(cli_kit, "cancel", "--key", "message:2:send") == (
        0,
        "cancelled the job with key 'message:2:send'\n",
    )
    code, output = invoke(cli_kit, "cancel", "--key-prefix", "booking:9:")
    assert code == 0 and "cancelled 2, still running 0" in output
    code, output = invoke(cli_kit, "cancel", "99999")
    assert code == 1 and "no job with id 99999" in output


def test_cancel_runs_the_jobs_undo_hooks_as_the_cli(cli_kit: AppKit) -> None:
    invoke(cli_kit, "install")
    undone: list[int] = []
    cli_kit.defer.on_undo("send_email")(lambda job: undone.append(job.id))
    job = schedule(cli_kit, delay=60)
    assert invoke(cli_kit, "cancel", str(job.id))[0] == 0
    assert undone == [job.id]
    with cli_kit.context():
        assert cli_kit.defer.history(job.id)[-1].actor == "cli"


def test_cancel_without_arguments_names_the_cli_options_and_exits_2(cli_kit: AppKit) -> None:
    invoke(cli_kit, "install")
    code, output = invoke(cli_kit, "cancel")
    assert code == 2
    assert "give a JOB_ID, --key KEY or --key-prefix PREFIX" in output
    assert "key=" not in output  # the Python API's wording is not the CLI's
    code, output = invoke(cli_kit, "cancel", "1", "--key", "k")
    assert code == 2 and "a JOB_ID or --key, not both" in output


def test_retry_of_a_done_job_says_only_a_failed_job_can_be_retried(cli_kit: AppKit) -> None:
    invoke(cli_kit, "install")
    job = schedule(cli_kit)
    assert invoke(cli_kit, "run-due")[0] == 0
    code, output = invoke(cli_kit, "retry", str(job.id))
    assert code == 1
    assert f"not retried: job {job.id} is done; only a failed job can be retried" in output
    assert "only a waiting job" not in output
    code, output = invoke(cli_kit, "retry", "99999")
    assert code == 1 and "no job with id 99999" in output


def test_list_pads_every_column_to_its_widest_cell(cli_kit: AppKit) -> None:
    invoke(cli_kit, "install")
    schedule(cli_kit, key="booking:1:close-the-booking-window", delay=60)
    schedule(cli_kit, key="k", delay=60)
    code, output = invoke(cli_kit, "list")
    assert code == 0
    header, *rows = output.splitlines()
    assert len(rows) == 2
    key_column = header.index("KEY")
    name_column = header.index("NAME")
    for row in rows:
        assert row[name_column:].startswith("send_email"), (header, row)
        assert row[key_column - 2 : key_column] == "  " and row[key_column] != " ", (header, row)


def test_help_summaries_are_whole_sentences_and_every_option_is_explained(
    cli_kit: AppKit,
) -> None:
    code, output = invoke(cli_kit, "--help")
    assert code == 0
    commands = output.split("Commands:", 1)[1]
    assert "..." not in commands, commands
    code, output = invoke(cli_kit, "list", "--help")
    assert "Only jobs in this status" in output
    code, output = invoke(cli_kit, "worker", "--help")
    assert "[debug|info|warning|error]" in output and "[default: info]" in output
    assert "INFO" not in output


def test_run_due_runs_what_is_due(cli_kit: AppKit) -> None:
    invoke(cli_kit, "install")
    job = schedule(cli_kit)
    schedule(cli_kit, delay=3600)
    code, output = invoke(cli_kit, "run-due")
    assert code == 0 and "ran 1 job(s): done 1" in output
    with cli_kit.context():
        assert cli_kit.defer.get(job.id).status is JobStatus.DONE  # type: ignore[union-attr]
    assert "ran 1 job(s)" in invoke(cli_kit, "run-due", "--ahead", "7200")[1]


def test_run_due_from_the_cli_is_recorded_as_the_cli_in_the_job_history(cli_kit: AppKit) -> None:
    invoke(cli_kit, "install")
    job = schedule(cli_kit)
    assert invoke(cli_kit, "run-due")[0] == 0
    with cli_kit.context():
        events = [(e.event, e.actor) for e in cli_kit.defer.history(job.id)]
    assert events == [("scheduled", "app"), ("started", "cli"), ("done", "cli")]


def test_status_prints_counts_and_exits_3_past_a_threshold(cli_kit: AppKit) -> None:
    invoke(cli_kit, "install")
    schedule(cli_kit)
    schedule(cli_kit, delay=3600)
    code, output = invoke(cli_kit, "status")
    assert code == 0 and "scheduled" in output and "owed" in output
    assert "send_email" in output.split("NAME", 1)[1]
    code, output = invoke(cli_kit, "status", "--json")
    data = json.loads(output)
    assert data["scheduled"] == 1 and data["owed"] == 1 and data["counts"]["pending"] == 2
    code, output = invoke(cli_kit, "status", "--max-owed", "0")
    assert code == 3 and "threshold crossed: owed 1 > 0" in output


def test_run_due_max_seconds_stops_starting_jobs(cli_kit: AppKit) -> None:
    import time

    cli_kit.defer.job("slow")(lambda job: time.sleep(1.2))
    with cli_kit.context():
        cli_kit.db.create_all()
        for _ in range(2):
            cli_kit.defer.schedule("slow")
        cli_kit.db.session.commit()
    code, output = invoke(cli_kit, "run-due", "--max-seconds", "1")
    assert code == 0, output
    assert "ran 1 job(s): done 1" in output
    assert "stopped after --max-seconds 1; more may be due" in output
    with cli_kit.context():
        assert cli_kit.defer.count(status="pending") == 1


@pytest.mark.parametrize("bad", ["0", "-5", "soon", "nan"])
def test_run_due_max_seconds_must_be_positive(cli_kit: AppKit, bad: str) -> None:
    code, output = invoke(cli_kit, "run-due", "--max-seconds", bad)
    assert code == 2, output
    assert "max-seconds" in output or "max_seconds" in output  # click's check, or ours


def test_schedules_lists_pauses_and_resumes(cli_kit: AppKit) -> None:
    cli_kit.defer.recurring("digest", "send_email", cron="0 9 * * MON", tz="Europe/Berlin")
    invoke(cli_kit, "install")
    code, output = invoke(cli_kit, "schedules")
    assert code == 0, output
    assert "digest  send_email  0 9 * * MON (Europe/Berlin)  active" in output
    code, output = invoke(cli_kit, "schedules", "pause", "digest")
    assert (code, output.strip()) == (0, "schedule digest paused")
    assert invoke(cli_kit, "schedules", "pause", "digest")[1].strip() == (
        "schedule digest was already paused"
    )
    (row,) = json.loads(invoke(cli_kit, "schedules", "--json")[1])
    assert row["id"] == "digest" and row["paused"] is True and row["tz"] == "Europe/Berlin"
    code, output = invoke(cli_kit, "schedules", "resume", "digest")
    assert (code, output.strip()) == (0, "schedule digest resumed")
    code, output = invoke(cli_kit, "schedules", "pause", "nope")
    assert code == 1 and "no recurring schedule has the id 'nope'" in output


def test_schedules_forget_stops_a_schedule_no_code_declares_and_status_names_it(
    make_app: Callable[..., AppKit],
) -> None:
    old = make_app()

    @old.defer.job("send_email")
    def send_email(job: Job) -> None:
        pass

    old.defer.recurring("old-report", "send_email", cron="0 9 * * *")
    invoke(old, "install")
    with old.app.app_context():
        old.defer.list_recurring()  # the old release synced it
        with old.db.engine.begin() as conn:  # ... and last ran a day and a half ago
            ticker = old.app.extensions["defer"].recurring
            table = ticker.store.table
            conn.execute(table.update().values(declared_at=utcnow() - timedelta(hours=36)))
    new = make_app(DEFER_SCHEDULE_ORPHAN_GRACE=timedelta(days=7))
    code, output = invoke(new, "status")
    assert code == 0 and "schedules not declared by running code: old-report" in output
    code, output = invoke(new, "schedules", "forget", "old-report")
    assert (code, output.strip()) == (
        0,
        "schedule old-report forgotten: orphaned, it no longer ticks",
    )
    code, output = invoke(new, "schedules", "forget", "old-report")
    assert (code, output.strip()) == (0, "schedule old-report was already orphaned")
    assert "old-report  send_email  0 9 * * * (UTC)  orphaned" in invoke(new, "schedules")[1]
    assert "not declared" not in invoke(new, "status")[1]
    code, output = invoke(old, "schedules", "forget", "old-report")
    assert code == 2 and "declared by this code" in output


def test_pause_resume_and_paused_of_a_queue_and_a_name(cli_kit: AppKit) -> None:
    invoke(cli_kit, "install")
    assert invoke(cli_kit, "paused") == (0, "nothing is paused\n")
    assert invoke(cli_kit, "paused", "--json") == (0, "[]\n")
    assert invoke(cli_kit, "pause", "--queue", "emails") == (0, "queue emails paused\n")
    assert invoke(cli_kit, "pause", "--queue", "emails") == (0, "queue emails was already paused\n")
    assert invoke(cli_kit, "pause", "--name", "send_email") == (0, "job name send_email paused\n")
    job = schedule(cli_kit)
    assert invoke(cli_kit, "run-due") == (0, "ran 0 job(s)\n")
    code, output = invoke(cli_kit, "paused")
    assert code == 0 and output.splitlines()[0].startswith("queue emails  paused ")
    assert output.splitlines()[1].endswith(" by cli")
    rows = json.loads(invoke(cli_kit, "paused", "--json")[1])
    assert [(r["kind"], r["value"], r["actor"]) for r in rows] == [
        ("queue", "emails", "cli"),
        ("name", "send_email", "cli"),
    ]
    assert "paused: queue:emails, name:send_email" in invoke(cli_kit, "status")[1]
    resumed = invoke(cli_kit, "resume", "--name", "send_email")
    assert resumed == (0, "job name send_email resumed\n")
    again = invoke(cli_kit, "resume", "--name", "send_email")
    assert again == (0, "job name send_email was not paused\n")
    assert invoke(cli_kit, "run-due")[1].startswith("ran 1 job(s)")
    with cli_kit.context():
        assert cli_kit.defer.get(job.id).status is JobStatus.DONE  # type: ignore[union-attr]


@pytest.mark.parametrize("args", [[], ["--queue", "a", "--name", "b"], ["--queue", ""]])
def test_pause_and_resume_exit_2_naming_the_option_on_bad_input(
    cli_kit: AppKit, args: list[str]
) -> None:
    invoke(cli_kit, "install")
    for command in ("pause", "resume"):
        code, output = invoke(cli_kit, command, *args)
        assert code == 2 and "queue" in output, output
