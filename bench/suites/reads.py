"""(7) Reads: ``defer.health()``, ``defer.activity()`` and the dashboard over a large history.

One table per backend holds the settled history and the live backlog of the issue's
sizes (built once with set-based SQL: setup is not what is measured). Then, in turn,
``defer.health()`` and the dashboard page through Flask's test client (the whole view:
health figures, the bounded count, the first page of the list, the template), each
called repeatedly; the figure is the median and p95 per call. An open dashboard tab
repeats this every few seconds, so it must not scan the table. ``defer.activity()``
(a minute per bucket over the last hour, and an hour per bucket over the last week)
reads the aggregate table, filled as that many runs over its kept spans would leave
it, and the Activity page draws both.
"""

from __future__ import annotations

import statistics
import time
from datetime import datetime, timedelta
from typing import Any

from flask_defer.timeutil import utcnow

from .. import raw
from ..fd import FlaskDeferApp
from ..results import Row, log, percentile
from . import Context, Section


def run(ctx: Context) -> Section:
    sizes = ctx.sizes
    section = Section(
        "reads",
        "Reads: health() and the dashboard over a large history",
        (
            f"{sizes.reads_settled:,} settled rows (done, 1 in 20 cancelled) and "
            f"{sizes.reads_pending:,} pending rows (1 in 10 due now, the rest next week) "
            f"over 5 job names; {sizes.reads_calls} calls of each after 3 warm-up calls, "
            "in this process. `GET /defer/` is the whole dashboard page through Flask's "
            "test client (health figures, the job count, the first page, the template)."
        ),
    )
    for backend in ctx.backends:
        section.rows += _backend(ctx, backend)
    return section


def _backend(ctx: Context, backend: str) -> list[Row]:
    sizes = ctx.sizes
    database = ctx.env.database(backend, f"reads {backend}")
    fd = FlaskDeferApp(database)
    started = time.monotonic()
    raw.fill_history(database, sizes.reads_settled, sizes.reads_pending)
    log(
        f"  [reads/{backend}] {sizes.reads_settled:,} settled + {sizes.reads_pending:,} "
        f"pending rows in {time.monotonic() - started:.1f}s"
    )
    app = fd.app
    app.debug = True  # the dashboard's own rule: open in debug mode, else a hook decides
    rows = []
    try:
        with app.app_context():
            from ..app import defer

            health = defer.health()
            bounds = health.lower_bounds

            def shown(value: int, status: str) -> str:
                return f"{value:,}{'+' if status in bounds else ''}"

            check = (
                f"owed {health.owed:,} (exact), scheduled {shown(health.scheduled, 'pending')},"
                f" done {shown(health.counts['done'], 'done')}"
            )
            rows.append(
                _row(
                    backend,
                    "flask_defer defer.health()",
                    _calls(defer.health, sizes.reads_calls),
                    "reads-health",
                    check,
                )
            )
            fill_activity(defer, settled=sizes.reads_settled)
            for bucket, tag in (("minute", "reads-activity"), ("hour", "reads-activity-hour")):
                figures = defer.activity(bucket=bucket)
                rows.append(
                    _row(
                        backend,
                        f"flask_defer defer.activity(bucket={bucket!r})",
                        _calls(lambda b=bucket: defer.activity(bucket=b), sizes.reads_calls),
                        tag,
                        f"{len(figures)} buckets, {sum(f.started for f in figures):,} started",
                    )
                )
        client = app.test_client()

        pages = (("/defer/", "reads-dashboard"), ("/defer/activity", "reads-activity-page"))
        for path, tag in pages:

            def page(path: str = path) -> None:
                response = client.get(path)
                if response.status_code != 200:
                    raise RuntimeError(f"GET {path} answered {response.status_code}")

            rows.append(
                _row(backend, f"flask_defer GET {path}", _calls(page, sizes.reads_calls), tag, "")
            )
    finally:
        fd.close()
    return rows


def fill_activity(defer: Any, *, settled: int, queues: int = 2, names: int = 5) -> None:
    """The activity aggregate as *settled* runs spread over the kept spans would have
    left it (what workers write, through the store's own upsert): a row per minute of
    the last two hours and per hour of the last eight days, for each (queue, name)."""
    from flask_defer.store.activity import LATENESS_BOUNDS, ActivityRow

    now = utcnow().replace(second=0, microsecond=0)
    keys = [(f"q{q}", f"job{n}") for q in range(queues) for n in range(names)]
    minutes = [now - timedelta(minutes=m) for m in range(120)]
    hours = [now.replace(minute=0) - timedelta(hours=h) for h in range(3, 192)]
    per = max(1, settled // (len(keys) * (len(minutes) + len(hours))))

    def row(start: datetime, queue: str, name: str) -> ActivityRow:
        late = [0] * len(LATENESS_BOUNDS)
        late[0], late[1] = per - per // 10, per // 10
        return ActivityRow(start, queue, name, per, per - per // 50, per // 50, per // 100, late)

    store = defer._state().store
    for start in minutes + hours:  # an hour's row holds its minutes' sum
        store.record_activity([row(start, queue, name) for queue, name in keys])


def _calls(call: object, n: int) -> list[float]:
    assert callable(call)
    for _ in range(3):
        call()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000)
    return times


def _row(backend: str, name: str, times: list[float], tag: str, note: str) -> Row:
    median = statistics.median(times)
    p95 = percentile(times, 0.95)
    log(f"  [reads/{backend}] {name}: median {median:.1f} ms, p95 {p95:.1f} ms")
    return Row(
        "reads",
        backend,
        name,
        f"{len(times)} calls",
        f"median {median:.1f} / p95 {p95:.1f} ms per call",
        spread=f"{min(times):.1f}–{max(times):.1f} ms",
        note=note,
        value=median,
        tag=tag,
    )
