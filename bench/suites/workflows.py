"""(9) Workflows: what releasing the children of one parent costs, against a bulk insert.

Per backend and round: one parent job with ``n`` children waiting for it
(``schedule(..., after=parent)``, set up untimed), then the parent's acknowledgement
(``JobStore.acknowledge_many`` of its claim, which closes the edges and releases every
child in the same call) is timed; beside it, interleaved, a bulk insert of ``n`` jobs
(``schedule_many`` + commit), the issue's yardstick. The figure per round is
release time ÷ bulk insert time; the target is at most 2.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

from flask_defer.store import Ack

from ..app import NOOP, RATE_LIMITED, RATE_PER_SECOND, db, defer
from ..fd import FlaskDeferApp
from ..results import Contender, Row, Sample, interleave
from . import Context, Section

CHILDREN = 1000


def run(ctx: Context) -> Section:
    rounds = max(ctx.sizes.future_rounds, 3)
    section = Section(
        "workflows",
        "Workflows: releasing 1,000 children of one parent",
        (
            f"One parent with {CHILDREN:,} waiting children; its acknowledgement (which "
            "releases them all, in the same call) is timed against a bulk insert of "
            f"{CHILDREN:,} jobs (`schedule_many` + commit), {rounds} interleaved rounds."
        ),
    )
    for backend in ctx.backends:
        section.rows += _backend(ctx, backend, rounds)
        section.rows += _rate(ctx, backend)
    section.method += (
        f" Then a rate limit: {RATE_BACKLOG} jobs of a {RATE_PER_SECOND}/s handler drained by "
        "one worker (4 threads); the starts (the jobs' `started` events, the claims' "
        "own times) are counted in each whole second from the first, and in any "
        "one-second window."
    )
    return section


RATE_BACKLOG = 100


def _rate(ctx: Context, backend: str) -> list[Row]:
    """Issue 35: a rate-limited handler holds its limit within ±1 job per period."""
    database = ctx.env.database(backend, f"rate limit {backend}")
    app = FlaskDeferApp(database)
    with app.app.app_context():
        jobs = [defer.schedule(RATE_LIMITED, {"n": n}) for n in range(RATE_BACKLOG)]
        db.session.commit()
        worker = defer.worker(concurrency=4)
        thread = threading.Thread(target=lambda: worker.run(install_signal_handlers=False))
        thread.start()
        deadline = time.monotonic() + RATE_BACKLOG / RATE_PER_SECOND * 3 + 10
        while defer.count(status="done") < RATE_BACKLOG and time.monotonic() < deadline:
            db.session.commit()
            time.sleep(0.1)
        worker.stop()
        thread.join(30)
        starts = sorted(
            event.at.timestamp()
            for job in jobs
            for event in defer.history(job.id)
            if event.event == "started"
        )
    app.close()
    if len(starts) < RATE_BACKLOG:
        return [Row("rate limit", backend, "flask_defer worker", f"{RATE_BACKLOG}",
                    "n/a", note=f"only {len(starts)} started")]  # fmt: skip
    most = max(sum(1 for t in starts if a <= t < a + 1.0) for a in starts)
    first = starts[0]
    whole = int((starts[-1] - first) // 1)
    per_second = [sum(1 for t in starts if first + s <= t < first + s + 1) for s in range(whole)]
    deviation = max(abs(n - RATE_PER_SECOND) for n in per_second) if per_second else 0
    return [
        Row(
            "rate limit",
            backend,
            f"flask_defer worker, {RATE_PER_SECOND}/s",
            f"{RATE_BACKLOG}",
            f"most in any second {most}; whole seconds {per_second}",
            note=f"largest deviation from {RATE_PER_SECOND} in a whole second: {deviation}",
            value=float(max(deviation, most - RATE_PER_SECOND)),
            tag="rate-deviation",
        )
    ]


def _backend(ctx: Context, backend: str, rounds: int) -> list[Row]:
    database = ctx.env.database(backend, f"workflows {backend}")
    app = FlaskDeferApp(database)
    parent: dict[str, int] = {}

    def set_up_family() -> None:
        with app.app.app_context():
            job = defer.schedule(NOOP, {"parent": True})
            for n in range(CHILDREN):
                defer.schedule(NOOP, {"child": n}, after=job, delay=3600)
            db.session.commit()
            parent["id"] = job.id

    def release() -> Sample:
        with app.app.app_context():
            store = defer.store
            now = datetime.now(UTC)
            token = uuid.uuid4().hex
            claimed = store.claim(
                now=now, limit=1, token=token, lease_until=now + timedelta(minutes=5)
            )
            if [job.id for job in claimed] != [parent["id"]]:
                raise RuntimeError(f"claimed {claimed!r}, not the parent")
            ack = Ack(parent["id"], token, "done", attempt=1)
            began = time.perf_counter()
            owned = store.acknowledge_many([ack], now=now)
            took = time.perf_counter() - began
            if owned != {parent["id"]}:
                raise RuntimeError("the parent's acknowledgement was refused")
            released = defer.count(status="pending")
            db.session.commit()
        if released < CHILDREN:
            raise RuntimeError(f"{released} pending after the release")
        _clear(app)
        return Sample(CHILDREN, took)

    def bulk() -> Sample:
        began = time.perf_counter()
        written = app.enqueue_bulk(CHILDREN, 3600)
        took = time.perf_counter() - began
        _clear(app)
        return Sample(written, took)

    contenders = [
        Contender("release of 1,000 children (the parent's ack)", release, setup=set_up_family),
        Contender("bulk insert of 1,000 jobs (schedule_many)", bulk, teardown=app.close),
    ]
    outcomes = interleave(f"workflows/{backend}", contenders, rounds)
    released, inserted = outcomes
    rows = [
        Row(
            "release children",
            backend,
            o.contender.name,
            f"{CHILDREN:,}",
            f"{statistics.median(s.seconds for s in o.samples) * 1000:.1f} ms"
            if o.samples
            else "n/a",
            note=o.missing or "",
        )
        for o in outcomes
    ]
    if released.samples and inserted.samples:
        ratios = [
            a.seconds / b.seconds for a, b in zip(released.samples, inserted.samples, strict=False)
        ]
        ratio = statistics.median(ratios)
        rows.append(
            Row(
                "release children",
                backend,
                "release ÷ bulk insert",
                f"{CHILDREN:,}",
                f"{ratio:.2f}",
                spread=f"{min(ratios):.2f}–{max(ratios):.2f}",
                note="per round; issue 35's target: at most 2",
                value=ratio,
                tag="release-ratio",
            )
        )
    return rows


def _clear(app: FlaskDeferApp) -> None:
    """Empty the tables between rounds, so every round starts alike."""
    with app.app.app_context():
        store = defer.store
        with store.begin() as conn:
            conn.execute(store.dependencies_table.delete())
            if store.history_table is not None:
                conn.execute(store.history_table.delete())
            conn.execute(store.table.delete())
