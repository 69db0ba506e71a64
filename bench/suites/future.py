"""(4) Future rows: does a large backlog due next year slow down draining what is due now?

Per backend, one table holds the future rows (inserted once, set-based: setup is not
what is measured) and one holds none. Every round adds the due jobs to both and drains
them with ``defer.run_due()`` (the worker's claim/execute/acknowledge code) and with the
raw loop, alternating. The figure is the time to drain the due jobs; the ratio
with ÷ without is the target.
"""

from __future__ import annotations

import statistics
import time
from datetime import UTC, datetime, timedelta

from .. import raw
from ..env import Database
from ..fd import FlaskDeferApp
from ..results import Contender, Outcome, Row, interleave, log, timed
from . import Context, Section


def run(ctx: Context) -> Section:
    sizes = ctx.sizes
    section = Section(
        "future",
        "Future rows: draining what is due next to a year of backlog",
        (
            f"{sizes.future_due:,} jobs due now, drained next to {sizes.future_rows:,} "
            f"pending rows due next year, and in a table with none ({sizes.future_rounds} "
            "interleaved rounds). "
            "flask_defer drains "
            "with `run_due()` in this process; the raw loop is the drain measurement's "
            "baseline (claim 100 on PostgreSQL, claim 1 on SQLite) on the same tables."
        ),
    )
    for backend in ctx.backends:
        section.rows += _backend(ctx, backend)
    return section


def _backend(ctx: Context, backend: str) -> list[Row]:
    sizes = ctx.sizes
    n = sizes.future_due
    with_rows = ctx.env.database(backend, f"future with {backend}")
    without = ctx.env.database(backend, f"future without {backend}")
    apps = {db.url: FlaskDeferApp(db) for db in (with_rows, without)}
    started = time.monotonic()
    raw.fill(with_rows, sizes.future_rows, run_at=datetime.now(UTC) + timedelta(days=365))
    took = time.monotonic() - started
    log(f"  [future/{backend}] {sizes.future_rows:,} future rows inserted in {took:.1f}s")

    def add_due(db: Database) -> None:
        raw.fill(db, n, run_at=datetime.now(UTC) - timedelta(seconds=5))

    def checked(count: int, who: str) -> int:
        if count != n:
            raise RuntimeError(f"{who} drained {count} of {n}")
        return count

    def raw_drain(db: Database) -> int:
        if backend == "postgresql":
            return raw.pg_drain(db, batch=100)
        return raw.sqlite_drain(db)

    label = f"{sizes.future_rows:,} future rows"
    contenders = []
    for db, which in ((with_rows, label), (without, "no future rows")):
        app = apps[db.url]
        contenders.append(
            Contender(
                f"flask_defer run_due(), {which}",
                setup=lambda d=db: add_due(d),
                run=lambda a=app: timed(lambda: checked(a.run_due(), "run_due")),
                teardown=app.close,
            )
        )
        contenders.append(
            Contender(
                f"raw loop, {which}",
                setup=lambda d=db: add_due(d),
                run=lambda d=db: timed(lambda: checked(raw_drain(d), "raw loop")),
            )
        )
    plan = raw.claim_plan(with_rows)
    outcomes = interleave(f"future/{backend}", contenders, sizes.future_rounds)
    by_name = {o.contender.name: o for o in outcomes}
    rows = []
    for outcome in outcomes:
        raw_name = "raw loop, " + outcome.contender.name.split(", ", 1)[1]
        rows.append(_time_row(backend, outcome, by_name.get(raw_name), n))
    for who, tag in (("flask_defer run_due()", "future-ratio"), ("raw loop", "future-raw-ratio")):
        a = by_name[f"{who}, {label}"]
        b = by_name[f"{who}, no future rows"]
        if a.samples and b.samples:
            ratios = [x.seconds / y.seconds for x, y in zip(a.samples, b.samples, strict=False)]
            ratio = statistics.median(ratios)
            rows.append(
                Row(
                    "future rows",
                    backend,
                    f"{who}: with ÷ without",
                    f"{n:,}",
                    f"{ratio:.3f}",
                    spread=f"{min(ratios):.2f}–{max(ratios):.2f}",
                    note=(
                        "drain time with the future rows over drain time without, per round"
                        + (
                            f"; claim plan with the future rows: {plan}"
                            if tag == "future-ratio"
                            else ""
                        )
                    ),
                    value=ratio,
                    tag=tag,
                )
            )
        else:
            rows.append(
                Row(
                    "future rows",
                    backend,
                    f"{who}: with ÷ without",
                    f"{n:,}",
                    "—",
                    note=a.missing or b.missing or "",
                    tag=tag,
                )
            )
    return rows


def _time_row(backend: str, outcome: Outcome, raw_outcome: Outcome | None, n: int) -> Row:
    name = outcome.contender.name
    seconds = outcome.median_seconds
    if seconds is None:
        return Row("future rows", backend, name, f"{n:,}", "—", note=outcome.missing or "")
    rate = n / seconds
    vs_raw = ""
    ratio = None
    if raw_outcome is not None and raw_outcome.median_seconds:
        ratio = raw_outcome.median_seconds / seconds
        vs_raw = f"{ratio:.2f}×"
    spread = ""
    if len(outcome.samples) > 1:
        times = [s.seconds * 1000 for s in outcome.samples]
        spread = f"{min(times):,.0f}–{max(times):,.0f} ms"
    return Row(
        "future rows",
        backend,
        name,
        f"{n:,}",
        f"{seconds * 1000:,.0f} ms ({rate:,.0f} jobs/s)",
        vs_raw=vs_raw,
        spread=spread,
        value=seconds,
        ratio=ratio,
    )
