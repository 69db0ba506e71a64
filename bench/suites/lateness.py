"""(3) Lateness: how long after ``run_at`` a job's handler starts, under ``flask defer worker``.

Jobs are scheduled one by one (each its own commit, so on PostgreSQL each sends its
NOTIFY) to run uniformly 1–5 s later; the handler returns ``time.time()`` at its start,
which the job's ``result`` keeps. Default settings throughout. Needs the worker
(issue 3): until the ``defer`` CLI group has a ``worker`` command this reports
"not measured".
"""

from __future__ import annotations

import statistics
import time

from .. import raw
from ..fd import FlaskDeferApp, schedule_spread, start_latencies
from ..results import Row, log, percentile
from ..worker import WorkerProcesses, worker_available
from . import Context, Section


def run(ctx: Context) -> Section:
    sizes = ctx.sizes
    low, high = sizes.lateness_spread
    section = Section(
        "lateness",
        "Lateness after run_at (worker, default settings)",
        (
            f"{sizes.lateness} jobs per round due at now + uniform({low:g}..{high:g}) s, "
            "scheduled one by one with a commit each while `flask defer worker` runs; the "
            "handler records its start. Lateness = handler start − `run_at`, pooled over "
            "the rounds; the backends alternate round by round. No “vs raw”: a raw loop's "
            "lateness is whatever poll interval it is given."
        ),
    )
    if not worker_available():
        for backend in ctx.backends:
            section.rows.append(
                Row(
                    "lateness",
                    backend,
                    "flask_defer worker",
                    str(sizes.lateness),
                    "—",
                    note="not measured: worker not available (flask defer worker is issue 3)",
                    tag="lateness",
                )
            )
        return section
    pooled: dict[str, list[float]] = {backend: [] for backend in ctx.backends}
    problems: dict[str, str] = {}
    for round_number in range(1, sizes.rounds + 1):
        for backend in ctx.backends:
            if backend in problems:
                continue
            try:
                late = _one_round(ctx, backend, seed=round_number)
            except Exception as error:  # noqa: BLE001 - reported in the table
                problems[backend] = f"failed: {type(error).__name__}: {error}".splitlines()[0]
                log(f"  [lateness/{backend}] {problems[backend]}")
                continue
            pooled[backend] += late
            log(
                f"  [lateness/{backend}] round {round_number}: p50 "
                f"{statistics.median(late) * 1000:.1f} ms, max {max(late) * 1000:.1f} ms"
            )
    poll = _poll_interval_seconds()
    for backend in ctx.backends:
        late = pooled[backend]
        if not late:
            section.rows.append(
                Row(
                    "lateness",
                    backend,
                    "flask_defer worker",
                    str(sizes.lateness),
                    "—",
                    note=problems.get(backend, "no jobs finished"),
                    tag="lateness",
                )
            )
            continue
        ms = [value * 1000 for value in late]
        figure = (
            f"p50 {percentile(ms, 0.5):.1f} / p95 {percentile(ms, 0.95):.1f} / "
            f"p99 {percentile(ms, 0.99):.1f} / max {max(ms):.1f} ms"
        )
        note = f"{len(ms)} jobs over {sizes.rounds} rounds"
        if backend == "sqlite":
            note += (
                f"; poll interval {poll * 1000:.0f} ms"
                if poll is not None
                else "; no poll-interval setting found"
            )
        section.rows.append(
            Row(
                "lateness",
                backend,
                "flask_defer worker",
                str(sizes.lateness),
                figure,
                note=note,
                value=percentile(ms, 0.99),
                tag="lateness",
                data={"poll_ms": (poll or 0.0) * 1000},
            )
        )
    return section


def _one_round(ctx: Context, backend: str, *, seed: int) -> list[float]:
    sizes = ctx.sizes
    database = ctx.env.database(backend, f"lateness {backend} {seed}")
    fd = FlaskDeferApp(database)
    try:
        workers = WorkerProcesses(database, ctx.env.tmp, concurrency=1, burst=False)
        try:
            _wait_until_worker_runs(fd, database)
            schedule_spread(fd, sizes.lateness, sizes.lateness_spread, seed)
            deadline = time.monotonic() + sizes.lateness_spread[1] + 60
            while time.monotonic() < deadline:
                if raw.count_by_status(database).get("done", 0) >= sizes.lateness + 1:
                    break
                time.sleep(0.1)
        finally:
            workers.stop()
        late, scheduled = start_latencies(fd)
        if len(late) != sizes.lateness:
            raise RuntimeError(f"{len(late)} of {sizes.lateness} jobs ran; see {workers.log_path}")
        return late
    finally:
        fd.close()


def _wait_until_worker_runs(fd: FlaskDeferApp, database: object) -> None:
    """A warm-up job due now; once it is done the worker is up and listening."""
    from ..app import NOOP, db, defer

    with fd.app.app_context():
        defer.schedule(NOOP, {"warm-up": True})
        db.session.commit()
    deadline = time.monotonic() + 60
    while raw.count_by_status(database).get("done", 0) < 1:  # type: ignore[arg-type]
        if time.monotonic() > deadline:
            raise TimeoutError("the worker did not run a warm-up job within 60 s")
        time.sleep(0.05)


def _poll_interval_seconds() -> float | None:
    """The worker's SQLite poll interval from flask_defer's defaults, if it has one."""
    from flask_defer.config import DEFAULTS

    for name, value in DEFAULTS.items():
        if "POLL" in name:
            seconds = value.total_seconds() if hasattr(value, "total_seconds") else value
            return float(seconds)
    return None
