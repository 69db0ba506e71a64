"""Schema revisions (store/versioning.py): upgrade a real 0.1.0 database, check, SQL, refusals.

The 0.1.0 database is built from a frozen copy of that release's DDL (tests/fixtures), and
filled with a row in every state. The upgrade assertions are data-driven over the 0.1.0
columns, so they keep holding as revisions are added on top.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import Engine, MetaData, Table, create_engine, inspect, select, text
from sqlalchemy.exc import IntegrityError

from flask_defer import Defer, Job, SchemaMismatch
from flask_defer.migrations import VERSION_TABLE
from flask_defer.store import versioning
from flask_defer.store.schema import SchemaNames
from flask_defer.store.schema_diff import differences

from ..conftest import AppKit

FIXTURES = Path(__file__).parent.parent / "fixtures"
NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
#: Every shipped revision, oldest first: what an upgrade from nothing applies.
REVISIONS = [f"flask_defer_{n:04d}" for n in range(1, 17)]


def build_0_1_0(engine: Engine) -> None:
    """The defer_jobs table exactly as flask_defer 0.1.0 created it (no version recorded)."""
    ddl = (FIXTURES / f"schema_0_1_0_{engine.dialect.name}.sql").read_text()
    body = "\n".join(line for line in ddl.splitlines() if not line.startswith("--"))
    with engine.begin() as conn:
        for statement in body.split(";"):
            if statement.strip():
                conn.exec_driver_sql(statement)


def _at(engine: Engine, minutes: float) -> datetime:
    moment = NOW + timedelta(minutes=minutes)
    # 0.1.0 stored naive UTC on SQLite and timestamptz on PostgreSQL.
    return moment.replace(tzinfo=None) if engine.dialect.name == "sqlite" else moment


def legacy_rows(engine: Engine) -> list[dict[str, Any]]:
    """One 0.1.0 row per state: pending, due, running, done, failed, cancelled, keyed, owned."""

    def row(job_id: int, status: str, run_in: float, **extra: Any) -> dict[str, Any]:
        values: dict[str, Any] = {
            "id": job_id,
            "name": "send_email",
            "queue": "default",
            "key": None,
            "payload": {"message_id": job_id, "nested": {"list": [1, 2]}},
            "status": status,
            "run_at": _at(engine, run_in),
            "due_at": _at(engine, run_in),
            "attempts": 0,
            "max_attempts": 3,
            "owner": None,
            "label": None,
            "undo_until": None,
            "last_error": None,
            "result": None,
            "claim_token": None,
            "lease_expires_at": None,
            "created_at": _at(engine, -60),
            "updated_at": _at(engine, -30),
            "finished_at": None,
        }
        values.update(extra)
        return values

    return [
        row(1, "pending", 60),
        row(2, "pending", -5),  # due
        row(3, "running", -10, attempts=1, claim_token="tok-3", lease_expires_at=_at(engine, 30)),
        row(4, "done", -20, attempts=1, result={"sent": True}, finished_at=_at(engine, -19)),
        row(5, "failed", -40, attempts=3, last_error="SMTP said no", finished_at=_at(engine, -39)),
        row(6, "cancelled", 10, finished_at=_at(engine, -1)),
        row(7, "pending", -1, key="message:7:send", queue="mail"),  # keyed, due
        row(8, "pending", 5, owner="user-8", label="Message sent", undo_until=_at(engine, 4.5)),
    ]


def fill(engine: Engine, rows: list[dict[str, Any]]) -> None:
    with engine.begin() as conn:
        table = Table("defer_jobs", MetaData(), autoload_with=conn)
        conn.execute(table.insert(), rows)
        if engine.dialect.name == "postgresql":
            conn.execute(text("SELECT setval('defer_jobs_id_seq', 100)"))


def read_back(engine: Engine) -> dict[int, dict[str, Any]]:
    with engine.connect() as conn:
        table = Table("defer_jobs", MetaData(), autoload_with=conn)
        return {r["id"]: dict(r) for r in conn.execute(select(table)).mappings()}


@pytest.fixture
def legacy_engine(database_url: str) -> Any:
    engine = create_engine(database_url)
    build_0_1_0(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def legacy_kit(legacy_engine: Engine, make_app: Callable[..., AppKit]) -> AppKit:
    """An app on a 0.1.0 database holding a row in every state."""
    fill(legacy_engine, legacy_rows(legacy_engine))
    kit = make_app()

    @kit.defer.job("send_email")
    def send_email(job: Job) -> None:
        pass

    return kit


def cli(kit: AppKit, *args: str) -> tuple[int, str]:
    result = kit.app.test_cli_runner().invoke(args=["defer", *args])
    return result.exit_code, result.output


# -- upgrading a 0.1.0 database ---------------------------------------------------------


def test_upgrade_of_a_0_1_0_database_keeps_every_row_and_field(legacy_engine: Engine) -> None:
    rows = legacy_rows(legacy_engine)
    fill(legacy_engine, rows)
    before = read_back(legacy_engine)
    assert versioning.check(legacy_engine).state == "behind"

    applied = versioning.upgrade(legacy_engine)

    assert applied[0] == versioning.FIRST_REVISION
    assert applied[-1] == versioning.head_revision()
    after = read_back(legacy_engine)
    assert set(after) == set(before) == {r["id"] for r in rows}
    for job_id, old in before.items():
        for column, value in old.items():  # every 0.1.0 column, whatever revisions add
            assert after[job_id][column] == value, (job_id, column)
    assert versioning.check(legacy_engine).ok


def test_upgrade_of_a_0_1_0_database_creates_the_schedules_table_through_0002(
    legacy_engine: Engine,
) -> None:
    fill(legacy_engine, legacy_rows(legacy_engine))
    applied = versioning.upgrade(legacy_engine)
    assert applied == REVISIONS
    inspector = inspect(legacy_engine)
    assert "defer_schedules" in inspector.get_table_names()
    [index] = inspector.get_indexes("defer_schedules")
    assert index["name"] == "ix_defer_schedules_active_next_run_at"
    with legacy_engine.connect() as conn:
        assert differences(conn, SchemaNames()) == []


def test_unique_live_key_is_still_enforced_after_upgrade(legacy_engine: Engine) -> None:
    fill(legacy_engine, legacy_rows(legacy_engine))
    versioning.upgrade(legacy_engine)
    duplicate = legacy_rows(legacy_engine)[6] | {"id": 50}
    with pytest.raises(IntegrityError), legacy_engine.begin() as conn:
        conn.execute(Table("defer_jobs", MetaData(), autoload_with=conn).insert(), [duplicate])
    settled_reuse = duplicate | {"id": 51, "status": "done"}
    with legacy_engine.begin() as conn:
        conn.execute(Table("defer_jobs", MetaData(), autoload_with=conn).insert(), [settled_reuse])


def test_db_check_fails_before_and_passes_after_upgrade_and_a_worker_drains_due_jobs(
    legacy_kit: AppKit,
) -> None:
    code, output = cli(legacy_kit, "db", "check")
    assert code == 1
    assert "0.1.0" in output and "flask defer db upgrade" in output

    code, output = cli(legacy_kit, "db", "upgrade")
    assert code == 0, output
    assert versioning.FIRST_REVISION in output

    code, output = cli(legacy_kit, "db", "check")
    assert code == 0, output
    assert "current" in output
    with legacy_kit.context():
        legacy_kit.defer.worker(burst=True, clock=lambda: NOW).run()
        statuses = {j.id: j.status.value for j in legacy_kit.defer.list(limit=100)}
    assert statuses[2] == statuses[7] == "done"  # the due ones ran
    assert statuses[1] == statuses[8] == "pending"  # the future ones wait
    assert statuses[3] == "running" and statuses[5] == "failed" and statuses[6] == "cancelled"


def test_worker_refuses_a_0_1_0_schema_naming_the_command(legacy_kit: AppKit) -> None:
    with legacy_kit.context(), pytest.raises(SchemaMismatch) as refused:
        legacy_kit.defer.worker(burst=True)
    assert "flask defer db upgrade" in str(refused.value)
    assert refused.value.status.state == "behind"
    code, output = cli(legacy_kit, "worker", "--burst")
    assert code == 1
    assert "flask defer db upgrade" in output


def test_worker_refuses_a_schema_ahead_of_the_code(legacy_kit: AppKit) -> None:
    cli(legacy_kit, "db", "upgrade")
    with legacy_kit.context():
        with legacy_kit.db.engine.begin() as conn:
            conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = 'flask_defer_9999'"))
        with pytest.raises(SchemaMismatch) as refused:
            legacy_kit.defer.worker(burst=True)
    assert refused.value.status.state == "ahead"
    assert "flask_defer_9999" in str(refused.value)
    assert cli(legacy_kit, "db", "check")[0] == 1
    assert cli(legacy_kit, "db", "upgrade")[0] == 1  # never "upgrades" past the code


def test_web_logs_one_warning_on_an_old_schema_and_keeps_serving(
    legacy_kit: AppKit, caplog: pytest.LogCaptureFixture
) -> None:
    client = legacy_kit.app.test_client()
    with caplog.at_level(logging.WARNING, logger="flask_defer"):
        first = client.get("/no-such-page")
        second = client.get("/no-such-page")
    assert first.status_code == second.status_code == 404
    warnings = [r for r in caplog.records if "behind this code" in r.getMessage()]
    assert len(warnings) == 1
    assert "flask defer db upgrade" in warnings[0].getMessage()


def test_db_sql_prints_the_pending_steps_without_running_them(legacy_kit: AppKit) -> None:
    code, output = cli(legacy_kit, "db", "sql")
    assert code == 0, output
    assert "flask_defer_0001" in output and "INSERT INTO defer_alembic_version" in output
    assert cli(legacy_kit, "db", "check")[0] == 1  # nothing ran
    cli(legacy_kit, "db", "upgrade")
    code, output = cli(legacy_kit, "db", "sql")
    assert code == 0 and "nothing to run" in output


# -- fresh databases --------------------------------------------------------------------


def test_create_all_on_a_fresh_database_records_the_newest_revision(kit: AppKit) -> None:
    status = kit.defer.schema_status()
    assert status.ok and status.database == versioning.head_revision()
    # The same schema the revisions build, schedules table included.
    with kit.db.engine.connect() as conn:
        assert differences(conn, SchemaNames()) == []


def test_sql_on_an_empty_database_is_the_create_table(make_app: Callable[..., AppKit]) -> None:
    kit = make_app()
    code, output = cli(kit, "db", "sql")
    assert code == 0
    assert "CREATE TABLE defer_jobs" in output
    assert "CREATE UNIQUE INDEX uq_defer_jobs_live_key" in output
    code, output = cli(kit, "db", "check")
    assert code == 1 and "does not exist" in output


def test_install_creates_the_schema_at_head_and_records_it(make_app: Callable[..., AppKit]) -> None:
    kit = make_app()
    code, output = cli(kit, "install")
    assert code == 0, output
    with kit.context():
        names = inspect(kit.db.engine).get_table_names()
        assert {"defer_jobs", "defer_schedules", "defer_jobs_pauses", VERSION_TABLE} <= set(names)
        assert kit.defer.schema_status().ok
    assert cli(kit, "install")[0] == 0  # idempotent


def test_install_upgrades_a_0_1_0_database(legacy_kit: AppKit) -> None:
    code, output = cli(legacy_kit, "install")
    assert code == 0, output
    assert cli(legacy_kit, "db", "check")[0] == 0
    with legacy_kit.context():
        assert len(legacy_kit.defer.list(limit=100)) == 8


def test_install_refuses_a_database_managed_by_alembic(make_app: Callable[..., AppKit]) -> None:
    kit = make_app()
    with kit.context(), kit.db.engine.begin() as conn:
        conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)"))
    code, output = cli(kit, "install")
    assert code == 1
    assert "flask db upgrade" in output
    code, output = cli(kit, "db", "check")
    assert code == 1 and "flask db upgrade" in output


# -- downgrade --------------------------------------------------------------------------


def _alembic_downgrade(engine: Engine, target: str) -> None:
    from alembic import command

    with versioning._connected(engine, SchemaNames()) as (conn, config):
        command.downgrade(config, target)
        conn.commit()


def test_downgrade_of_the_first_revision_refuses_while_jobs_are_live(
    legacy_engine: Engine,
) -> None:
    fill(legacy_engine, legacy_rows(legacy_engine))
    versioning.upgrade(legacy_engine)
    with pytest.raises(RuntimeError, match="still pending or running"):
        _alembic_downgrade(legacy_engine, "flask_defer@base")
    assert len(read_back(legacy_engine)) == 8


def test_downgrade_of_the_first_revision_drops_a_table_of_settled_jobs(
    legacy_engine: Engine,
) -> None:
    fill(legacy_engine, [r for r in legacy_rows(legacy_engine) if r["id"] in (4, 5, 6)])
    versioning.upgrade(legacy_engine)
    _alembic_downgrade(legacy_engine, "flask_defer@base")
    assert "defer_jobs" not in inspect(legacy_engine).get_table_names()
    assert versioning.check(legacy_engine).state == "missing"
    versioning.upgrade(legacy_engine)
    assert versioning.check(legacy_engine).ok


def test_downgrade_of_the_schedules_revision_drops_only_that_table(
    legacy_engine: Engine,
) -> None:
    fill(legacy_engine, legacy_rows(legacy_engine))
    versioning.upgrade(legacy_engine)
    _alembic_downgrade(legacy_engine, "flask_defer_0001")
    names = inspect(legacy_engine).get_table_names()
    assert "defer_schedules" not in names and "defer_jobs" in names
    assert len(read_back(legacy_engine)) == 8
    status = versioning.check(legacy_engine)
    assert status.state == "behind" and status.database == "flask_defer_0001"
    assert versioning.upgrade(legacy_engine) == REVISIONS[1:]
    assert versioning.check(legacy_engine).ok


def _alembic_upgrade(engine: Engine, target: str) -> None:
    """Upgrade a 0.1.0 database (recorded as flask_defer_0001, as upgrade does) to *target*."""
    from alembic import command

    with versioning._connected(engine, SchemaNames()) as (conn, config):
        command.stamp(config, "flask_defer_0001")
        command.upgrade(config, target)
        conn.commit()


JOINED = "Message sent\x1fSending…\x1fSent\x1f\x1fSending undone."


def test_the_state_texts_revision_moves_joined_labels_into_their_columns_and_back(
    legacy_engine: Engine,
) -> None:
    fill(legacy_engine, legacy_rows(legacy_engine))
    _alembic_upgrade(legacy_engine, "flask_defer_0003")
    with legacy_engine.begin() as conn:
        conn.execute(text("UPDATE defer_jobs SET label = :label WHERE id = 1"), {"label": JOINED})
        conn.execute(text("UPDATE defer_jobs SET label = :label WHERE id = 2"), {"label": "Plain"})
    assert versioning.upgrade(legacy_engine) == REVISIONS[3:]
    columns = "label, waiting_label, done_label, failed_label, undone_label"
    with legacy_engine.connect() as conn:
        rows = {
            r[0]: tuple(r[1:])
            for r in conn.execute(text(f"SELECT id, {columns} FROM defer_jobs WHERE id IN (1, 2)"))
        }
    assert rows[1] == ("Message sent", "Sending…", "Sent", None, "Sending undone.")
    assert rows[2] == ("Plain", None, None, None, None)
    _alembic_downgrade(legacy_engine, "flask_defer_0003")
    assert "done_label" not in {c["name"] for c in inspect(legacy_engine).get_columns("defer_jobs")}
    with legacy_engine.connect() as conn:
        labels = dict(
            conn.execute(text("SELECT id, label FROM defer_jobs WHERE id IN (1, 2)")).all()
        )
    assert labels == {1: JOINED, 2: "Plain"}
    assert versioning.upgrade(legacy_engine) == REVISIONS[3:]
    assert versioning.check(legacy_engine).ok


def test_the_declared_at_revision_starts_each_schedules_grace_at_its_last_change(
    legacy_engine: Engine,
) -> None:
    _alembic_upgrade(legacy_engine, "flask_defer_0005")
    changed = NOW - timedelta(hours=3)
    with legacy_engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO defer_schedules (id, job_name, cron, tz, catch_up, paused, "
                "orphaned, next_run_at, created_at, updated_at) VALUES ('nightly', "
                "'send_email', '0 3 * * *', 'UTC', 'latest', :no, :no, :at, :at, :changed)"
            ),
            {"no": False, "at": NOW, "changed": changed},
        )
    assert versioning.upgrade(legacy_engine) == REVISIONS[5:]
    table = Table("defer_schedules", MetaData(), autoload_with=legacy_engine)
    with legacy_engine.connect() as conn:
        declared, updated = conn.execute(select(table.c.declared_at, table.c.updated_at)).one()
    assert declared == updated
    assert versioning.check(legacy_engine).ok
    _alembic_downgrade(legacy_engine, "flask_defer_0005")
    columns = {c["name"] for c in inspect(legacy_engine).get_columns("defer_schedules")}
    assert "declared_at" not in columns and "updated_at" in columns
    assert versioning.upgrade(legacy_engine) == REVISIONS[5:]


def test_the_pauses_revision_adds_an_empty_table_and_its_downgrade_lifts_every_pause(
    legacy_engine: Engine,
) -> None:
    fill(legacy_engine, legacy_rows(legacy_engine))
    _alembic_upgrade(legacy_engine, "flask_defer_0006")
    assert "defer_jobs_pauses" not in inspect(legacy_engine).get_table_names()
    assert versioning.upgrade(legacy_engine) == REVISIONS[6:]
    assert versioning.check(legacy_engine).ok
    columns = {c["name"] for c in inspect(legacy_engine).get_columns("defer_jobs_pauses")}
    assert columns == {"kind", "value", "paused_at", "actor"}
    with legacy_engine.begin() as conn:
        conn.execute(
            text("INSERT INTO defer_jobs_pauses VALUES ('queue', 'mail', :at, 'ops')"), {"at": NOW}
        )
    _alembic_downgrade(legacy_engine, "flask_defer_0006")
    assert "defer_jobs_pauses" not in inspect(legacy_engine).get_table_names()
    assert len(read_back(legacy_engine)) == 8  # every job kept; job 7 (queue mail) unpaused
    assert versioning.upgrade(legacy_engine) == REVISIONS[6:]
    with legacy_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM defer_jobs_pauses")).scalar() == 0


def test_the_workflow_revisions_upgrade_and_downgrade_keeping_every_job(
    legacy_engine: Engine,
) -> None:
    # 0011 (dependencies), 0012 (abort) and 0013 (rate limits), up and down with data.
    fill(legacy_engine, legacy_rows(legacy_engine))
    _alembic_upgrade(legacy_engine, "flask_defer_0010")
    assert versioning.upgrade(legacy_engine) == REVISIONS[10:]
    assert versioning.check(legacy_engine).ok
    names = set(inspect(legacy_engine).get_table_names())
    assert {"defer_jobs_after", "defer_jobs_starts"} <= names
    with legacy_engine.begin() as conn:
        # Job 1 (pending) waits for job 3 (running), which someone asked to abort;
        # a start counts in a rate bucket.
        conn.execute(text("UPDATE defer_jobs SET waiting_for = 1 WHERE id = 1"))
        conn.execute(text("UPDATE defer_jobs SET dependents = :t WHERE id = 3"), {"t": True})
        conn.execute(text("UPDATE defer_jobs SET abort_requested_by = 'ops' WHERE id = 3"))
        conn.execute(
            text("INSERT INTO defer_jobs_after (child_id, parent_id, policy, open)"
                 " VALUES (1, 3, 'done', :t)"), {"t": True},
        )  # fmt: skip
        conn.execute(
            text("INSERT INTO defer_jobs_starts (bucket, until) VALUES ('rate:x', :at)"),
            {"at": NOW},
        )
    before = read_back(legacy_engine)
    _alembic_downgrade(legacy_engine, "flask_defer_0010")
    names = set(inspect(legacy_engine).get_table_names())
    assert not {"defer_jobs_after", "defer_jobs_starts"} & names
    columns = {c["name"] for c in inspect(legacy_engine).get_columns("defer_jobs")}
    assert not {"waiting_for", "dependents", "abort_requested_by", "rate_limit"} & columns
    after = read_back(legacy_engine)
    assert sorted(after) == sorted(before)  # every job kept
    assert after[1]["status"] == "pending"  # released: claimable under the older code
    assert versioning.upgrade(legacy_engine) == REVISIONS[10:]
    with legacy_engine.connect() as conn:
        assert differences(conn, SchemaNames()) == []
        assert conn.execute(text("SELECT count(*) FROM defer_jobs_after")).scalar() == 0
        waiting = conn.execute(text("SELECT waiting_for FROM defer_jobs WHERE id = 1")).scalar()
    assert waiting is None


def test_an_app_without_db_on_an_older_schema_leaves_the_schedules_table_to_the_upgrade(
    legacy_engine: Engine, database_url: str
) -> None:
    fill(legacy_engine, legacy_rows(legacy_engine))
    versioning.upgrade(legacy_engine)
    _alembic_downgrade(legacy_engine, "flask_defer_0001")  # as an older release left it
    app = Flask("own_database")
    app.config.update(DEFER_DATABASE_URI=database_url, SECRET_KEY="test-secret")
    defer = Defer()

    @defer.job("send_email")
    def send_email(job: Job) -> None:
        pass

    defer.init_app(app)
    try:
        # Creating the tables at init_app would make revisions 0002 and 0007 fail on them.
        tables = inspect(legacy_engine).get_table_names()
        assert "defer_schedules" not in tables and "defer_jobs_pauses" not in tables
        with app.app_context():
            assert defer.upgrade_schema() == REVISIONS[1:]
            assert defer.schema_status().ok
            defer.recurring("nightly", "send_email", cron="0 3 * * *")
            defer.run_due(now=NOW)
            assert [row.id for row in defer.list_recurring()] == ["nightly"]
    finally:
        app.extensions["defer"].store.engine.dispose()


# -- the revisions and the schema code agree ---------------------------------------------


def test_revisions_build_exactly_the_schema_code_including_index_predicates(
    engine: Engine,
) -> None:
    versioning.upgrade(engine)
    with engine.connect() as conn:
        assert differences(conn, SchemaNames()) == []


def test_renamed_tables_are_created_by_the_revisions_under_their_names(
    engine: Engine,
) -> None:
    renamed = SchemaNames(jobs="app_jobs", schedules="app_schedules")
    applied = versioning.upgrade(engine, renamed)
    assert applied == REVISIONS
    names = set(inspect(engine).get_table_names())
    assert {"app_jobs", "app_schedules"} <= names
    assert not {"defer_jobs", "defer_schedules"} & names
    indexes = {ix["name"] for ix in inspect(engine).get_indexes("app_schedules")}
    assert indexes == {"ix_app_schedules_active_next_run_at"}
    with engine.connect() as conn:
        assert differences(conn, renamed) == []
    assert versioning.check(engine, renamed).ok
    assert "app_jobs_history" in names and renamed.history == "app_jobs_history"
    assert "app_jobs_pauses" in names and renamed.pauses == "app_jobs_pauses"


def as_managed_by_the_apps_own_revisions(engine: Engine) -> None:
    """The schema at head, as the app's own autogenerated revisions would have built it:
    recorded in the app's alembic_version, with no flask_defer row."""
    versioning.upgrade(engine)
    with engine.begin() as conn:
        conn.execute(text(f"DROP TABLE {VERSION_TABLE}"))
        conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)"))
        conn.execute(text("INSERT INTO alembic_version VALUES ('a1b2c3d4e5f6')"))


def test_structural_check_of_an_app_managed_database_sees_a_missing_schedules_table(
    legacy_engine: Engine,
) -> None:
    # The app's own revisions created the 0.1.0 jobs table, and none the schedules table.
    with legacy_engine.begin() as conn:
        conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)"))
        conn.execute(text("INSERT INTO alembic_version VALUES ('a1b2c3d4e5f6')"))
    status = versioning.check(legacy_engine)
    assert status.state == "behind" and status.managed_by == "alembic"
    assert "add_table defer_schedules" in status.message


def test_structural_check_sees_a_changed_predicate_of_the_schedules_index(
    legacy_engine: Engine,
) -> None:
    as_managed_by_the_apps_own_revisions(legacy_engine)
    assert versioning.check(legacy_engine).ok
    with legacy_engine.begin() as conn:
        conn.execute(text("DROP INDEX ix_defer_schedules_active_next_run_at"))
        conn.execute(
            text(
                "CREATE INDEX ix_defer_schedules_active_next_run_at "
                "ON defer_schedules (next_run_at) WHERE paused = true"
            )
        )
    status = versioning.check(legacy_engine)
    assert status.state == "behind"
    assert "predicate of ix_defer_schedules_active_next_run_at" in status.message


def test_structural_check_of_an_app_managed_table_sees_a_changed_index_predicate(
    legacy_engine: Engine,
) -> None:
    as_managed_by_the_apps_own_revisions(legacy_engine)
    status = versioning.check(legacy_engine)
    assert status.ok and status.managed_by == "alembic"

    with legacy_engine.begin() as conn:
        conn.execute(text("DROP INDEX ix_defer_jobs_pending_run_at_name"))
        conn.execute(
            text(
                "CREATE INDEX ix_defer_jobs_pending_run_at_name "
                "ON defer_jobs (run_at, name, due_at, status) WHERE status = 'running'"
            )
        )
    status = versioning.check(legacy_engine)
    assert status.state == "behind"
    assert "predicate of ix_defer_jobs_pending_run_at_name" in status.message
