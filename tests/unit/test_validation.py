"""Input the databases would refuse is refused first, naming the argument, on both backends.

PostgreSQL stores neither NUL nor lone surrogates, Python raises raw OverflowError and
RecursionError on extreme numbers and nesting; each would otherwise surface as a
driver error that aborts the caller's transaction, or as a 500.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import func, select

from flask_defer import InvalidArgument, Job, JobNotFound, JobSpec
from flask_defer.validation import payload_text

from ..conftest import AppKit

#: The documented depth limit (docs/guarantees.md).
MAX_PAYLOAD_DEPTH = 100

UNSTORABLE = ["nul\x00byte", "lone \ud800 high", "lone \udfff low"]


@pytest.fixture
def handlers(kit: AppKit) -> AppKit:
    @kit.defer.job("send_email")
    def send_email(job: Job) -> None:
        pass

    @kit.defer.job("digest")
    def digest(job: Job) -> None:
        pass

    return kit


def rows(kit: AppKit) -> int:
    with kit.db.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(kit.defer.store.table)).scalar())


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("text", UNSTORABLE)
@pytest.mark.parametrize("argument", ["key", "owner", "label"])
def test_unstorable_strings_in_text_arguments_are_refused_by_name(
    handlers: AppKit, argument: str, text: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        handlers.defer.schedule("send_email", **{argument: text})
    assert caught.value.argument == argument
    # Refused before the INSERT: the caller's transaction is intact and can commit.
    handlers.defer.schedule("send_email", key="fine")
    handlers.db.session.commit()
    assert rows(handlers) == 1


@pytest.mark.parametrize("text", UNSTORABLE)
def test_unstorable_strings_anywhere_in_a_payload_are_refused(
    handlers: AppKit, text: str
) -> None:
    for payload in ({"body": text}, {text: 1}, {"a": [{"b": [text]}]}):
        with pytest.raises(InvalidArgument, match="cannot store") as caught:
            handlers.defer.schedule("send_email", payload)
        assert caught.value.argument == "payload"
    with pytest.raises(InvalidArgument) as bulk:
        handlers.defer.schedule_many("send_email", [{"ok": 1}, {"body": text}])
    assert bulk.value.argument == "payloads[1]"
    with pytest.raises(InvalidArgument) as batched:
        handlers.defer.batch("digest", key="post:1", item={"body": text})
    assert batched.value.argument == "item"
    handlers.db.session.commit()
    assert rows(handlers) == 0


def test_emoji_and_escaped_lookalikes_are_stored_unchanged(handlers: AppKit) -> None:
    # An emoji is a surrogate pair in JSON's escapes, and "\\u0000" is six harmless
    # characters: neither may be mistaken for what PostgreSQL refuses.
    payload = {"text": "héllo 😀", "escaped": "\\u0000 and \\ud800", "\u00e9": "ok"}
    job = handlers.defer.schedule("send_email", payload, label="Sent 😀")
    handlers.db.session.commit()
    stored = handlers.defer.get(job.id)
    assert stored is not None and stored.payload == payload and stored.label == "Sent 😀"


def test_deep_payloads_are_refused_with_the_depth_limit(handlers: AppKit) -> None:
    handlers.defer.schedule("send_email", {"v": nested(MAX_PAYLOAD_DEPTH - 1)})
    for depth in (MAX_PAYLOAD_DEPTH + 1, 5000):
        with pytest.raises(InvalidArgument, match=f"deeper than {MAX_PAYLOAD_DEPTH}") as caught:
            handlers.defer.schedule("send_email", {"v": nested(depth)})
        assert caught.value.argument == "payload"
    handlers.db.session.commit()
    assert rows(handlers) == 1


def test_payloads_over_the_size_limit_are_refused(make_app: Any) -> None:
    kit: AppKit = make_app(DEFER_MAX_PAYLOAD_BYTES=1000)

    @kit.defer.job("send_email")
    def send_email(job: Job) -> None:
        pass

    with kit.app.app_context():
        kit.db.create_all()
        kit.defer.schedule("send_email", {"body": "x" * 900})
        with pytest.raises(InvalidArgument, match="DEFER_MAX_PAYLOAD_BYTES") as caught:
            kit.defer.schedule("send_email", {"body": "x" * 1000})
        assert caught.value.argument == "payload"
        with pytest.raises(InvalidArgument, match="DEFER_MAX_PAYLOAD_BYTES"):
            kit.defer.schedule_many("send_email", [{"body": "x" * 1000}])
        kit.db.session.commit()
        assert rows(kit) == 1


def test_the_size_limit_counts_utf8_bytes_not_json_escapes(make_app: Any) -> None:
    kit: AppKit = make_app(DEFER_MAX_PAYLOAD_BYTES=1000)

    @kit.defer.job("send_email")
    def send_email(job: Job) -> None:
        pass

    with kit.app.app_context():
        kit.db.create_all()
        # 300 "é" are 600 bytes of UTF-8 (1,800 as \u00e9 escapes): within the limit.
        job = kit.defer.schedule("send_email", {"body": "é" * 300})
        kit.db.session.commit()
        stored = kit.defer.get(job.id)
        assert stored is not None and stored.payload == {"body": "é" * 300}
        with pytest.raises(InvalidArgument, match=r"1\d{3} bytes as JSON \(UTF-8\)"):
            kit.defer.schedule("send_email", {"body": "é" * 600})


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 1e300, 10**30])
def test_bad_numbers_for_durations_are_refused_by_name(handlers: AppKit, value: Any) -> None:
    defer = handlers.defer
    calls = {
        "delay": lambda: defer.schedule("send_email", delay=value),
        "window": lambda: defer.undoable("send_email", window=value, owner="alice"),
        "max_wait": lambda: defer.batch(
            "digest", key="k", item=1, mode="debounce", window=1, max_wait=value
        ),
        "timeout": lambda: defer.schedule_http("https://example.com/hook", timeout=value),
        "payloads": lambda: defer.schedule_many("send_email", [JobSpec(delay=value)]),
    }
    for argument, call in calls.items():
        with pytest.raises(InvalidArgument) as caught:
            call()
        assert caught.value.argument.split(".")[0].startswith(argument.split(".")[0])
        # A ValueError, so an app mapping ValueError to 400 does not answer 500.
        assert isinstance(caught.value, ValueError)
    job = defer.schedule("send_email", delay=60)
    handlers.db.session.commit()
    with pytest.raises(InvalidArgument) as moved:
        defer.reschedule(job.id, delay=value)
    assert moved.value.argument == "delay"
    assert rows(handlers) == 1


def test_a_huge_timedelta_is_refused_rather_than_overflowing(handlers: AppKit) -> None:
    with pytest.raises(InvalidArgument) as caught:
        handlers.defer.schedule("send_email", delay=timedelta.max)
    assert caught.value.argument == "delay"


def test_run_at_at_the_end_of_time_in_a_negative_offset_is_refused(handlers: AppKit) -> None:
    end = datetime(9999, 12, 31, 23, 0, tzinfo=timezone(timedelta(hours=-5)))
    with pytest.raises(InvalidArgument, match="out of range") as caught:
        handlers.defer.schedule("send_email", run_at=end)
    assert caught.value.argument == "run_at"
    # The same instant's neighbour that fits is stored and read back exactly.
    far = datetime(9999, 12, 30, tzinfo=UTC)
    job = handlers.defer.schedule("send_email", run_at=far)
    handlers.db.session.commit()
    assert handlers.defer.get(job.id).run_at == far  # type: ignore[union-attr]


@pytest.mark.parametrize("job_id", [0, -1, 2**63, 2**63 + 1, 2**80])
def test_ids_no_row_can_have_are_not_found(handlers: AppKit, job_id: int) -> None:
    defer = handlers.defer
    with pytest.raises(JobNotFound):
        defer.cancel(job_id)
    with pytest.raises(JobNotFound):
        defer.reschedule(job_id, delay=5)
    with pytest.raises(JobNotFound):
        defer.retry(job_id)
    with pytest.raises(JobNotFound):
        defer.undo(job_id)
    assert defer.get(job_id) is None  # get() answers None for any unknown id


def test_the_largest_id_is_an_ordinary_unknown_id(handlers: AppKit) -> None:
    with pytest.raises(JobNotFound):
        handlers.defer.cancel(2**63 - 1)
    assert handlers.defer.get(2**63 - 1) is None


@pytest.mark.parametrize(
    "value",
    [
        {}, [], "text", 7, -2.5, 1e300, True, None, 2**70,
        {"n": 1, "nested": {"list": [1, 2.5, "x", None, False]}},
        {"é": "ünïcödé", "emoji": "😀", "quote": 'a "b" \\ c\n\t'},
        {"b": 1, "a": 2},  # key order kept, not sorted
        [[[[["deep"]]]]],
    ],
)  # fmt: skip
def test_payload_text_is_exactly_what_the_json_module_writes(value: object) -> None:
    """The stored text is json's own (the one SQLAlchemy's JSON column writes), though
    payload_text calls the C encoder directly: any difference would change stored bytes."""
    assert payload_text(value, "payload") == json.dumps(value, allow_nan=False)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (float("nan"), "Out of range float"),
        ({"x": float("inf")}, "Out of range float"),
        ({1, 2}, "not JSON serializable"),
        (object(), "not JSON serializable"),
    ],
)
def test_payload_text_refuses_what_json_cannot_carry(value: object, says: str) -> None:
    with pytest.raises(InvalidArgument, match=says):
        payload_text(value, "payload")


def test_payload_text_refuses_a_circular_payload_every_time() -> None:
    """The encoder's circular-reference check, with fresh bookkeeping each call: a
    refused payload leaves nothing behind that would refuse the next one."""
    loop: list[object] = []
    loop.append(loop)
    for _ in range(2):
        with pytest.raises(InvalidArgument, match="[Cc]ircular"):
            payload_text(loop, "payload")
        shared = [1]
        assert payload_text([shared, shared], "payload") == "[[1], [1]]"
