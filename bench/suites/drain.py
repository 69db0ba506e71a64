"""(2) Drain: a backlog of due no-op jobs, from the first start to the last acknowledgement.

flask_defer drains through ``flask defer worker`` when the CLI has that command
(:mod:`bench.worker`), and always through ``defer.run_due()`` in 1 and 2 processes (the
same claim/execute/acknowledge code, without the worker's loop).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from .. import raw
from ..fd import drain_in_processes
from ..results import Contender, NotAvailable, Sample, interleave, log, rate_rows, timed
from ..worker import WorkerProcesses, worker_available
from . import Context, Section, peer_classes
from .lazy import Lazy

RAW_PG_1 = "raw psycopg, claim 1"
RAW_PG_100 = "raw psycopg, claim 100"
RAW_PG_100_BATCH = "raw psycopg, claim 100, batch ack"
RAW_SQLITE = "raw sqlite3, claim 1"
RAW_SQLITE_100_BATCH = "raw sqlite3, claim 100, batch ack"

#: Seconds between starting the worker processes and their jobs falling due. Started
#: with the jobs already due, the first process drained a 2,000-job backlog before the
#: second had finished importing, so "2 processes" measured a start-up race (1.01x one
#: process, against 1.23x with both up: issue 41).
WORKER_START_ALLOWANCE = 3.0


def run(ctx: Context) -> Section:
    sizes = ctx.sizes
    section = Section(
        "drain",
        "Drain: due no-op jobs",
        (
            f"{sizes.drain:,} no-op jobs, all due, drained to the last acknowledgement; jobs/s. "
            "Raw loops acknowledge each job in its own transaction (compare-and-set on the "
            "claim token, as flask_defer does), except the “batch ack” ceiling, which marks "
            "a claimed batch done in one statement. flask_defer `run_due()` processes are "
            "fresh interpreters synchronised at a barrier, timed from the first start to the "
            "last end. `flask defer worker` processes start before the jobs fall due (the "
            f"jobs are written due {WORKER_START_ALLOWANCE:g}–{WORKER_START_ALLOWANCE + 1:g}"
            " s ahead, and every process is in the workers table before then), so no figure "
            "includes an interpreter's start-up; the worker is timed from its first to its "
            "last acknowledgement "
            "(`finished_at`), with the job history on (the default) and off "
            "(`DEFER_HISTORY = False`), and once with a pool as wide as the largest claim "
            f"(`--concurrency {WIDE_POOL}`): a claim takes at most one job per idle thread. "
            "Peers run in this process with their defaults. "
            "On PostgreSQL “vs raw” is against the raw 100-at-a-time loop, on SQLite "
            "against the raw sqlite3 loop."
        ),
    )
    for backend in ctx.backends:
        log(f"drain on {backend}")
        contenders = _contenders(ctx, backend)
        outcomes = interleave(f"drain/{backend}", contenders, sizes.rounds)
        section.rows += rate_rows(
            "drain",
            backend,
            outcomes,
            baseline=RAW_PG_100 if backend == "postgresql" else RAW_SQLITE,
            size=f"{sizes.drain:,}",
        )
    return section


def _checked(count: int, expected: int, who: str) -> int:
    if count != expected:
        raise RuntimeError(f"{who} ran {count} of {expected} jobs")
    return count


def _checked_sample(sample: Sample, expected: int, who: str) -> Sample:
    _checked(sample.count, expected, who)
    return sample


def _contenders(ctx: Context, backend: str) -> list[Contender]:
    n = ctx.sizes.drain
    out: list[Contender] = []

    def table(label: str) -> Any:
        database = ctx.env.database(backend, f"drain {label} {backend}")
        raw.create_jobs_table(database)
        return database

    def refill(database: Any) -> None:
        raw.clear(database)
        raw.fill(database, n, run_at=datetime.now(UTC) - timedelta(seconds=5))

    def raw_contender(name: str, drain: Any) -> Contender:
        database = table(name)
        return Contender(
            name,
            setup=lambda: refill(database),
            run=lambda: timed(lambda: _checked(drain(database), n, name)),
            tag="baseline",
        )

    if backend == "postgresql":
        out.append(raw_contender(RAW_PG_1, lambda d: raw.pg_drain(d, batch=1)))
        out.append(raw_contender(RAW_PG_100, lambda d: raw.pg_drain(d, batch=100)))
        out.append(
            raw_contender(RAW_PG_100_BATCH, lambda d: raw.pg_drain(d, batch=100, batch_ack=True))
        )
    else:
        out.append(raw_contender(RAW_SQLITE, lambda d: raw.sqlite_drain(d)))
        out.append(
            raw_contender(
                RAW_SQLITE_100_BATCH, lambda d: raw.sqlite_drain(d, batch=100, batch_ack=True)
            )
        )

    for processes in (1, 2):
        database = table(f"run_due {processes}")
        name = f"flask_defer run_due(), {processes} process{'es' if processes > 1 else ''}"

        def run_due(d: Any = database, p: int = processes, who: str = name) -> Sample:
            sample = drain_in_processes(d, p)
            _checked(sample.count, n, who)
            return sample

        out.append(
            Contender(
                name, setup=lambda d=database: refill(d), run=run_due, tag=f"fd-drain-{processes}"
            )
        )

    # -- the worker plugs in here (issue 3) --------------------------------------------
    # As operators run it: `flask defer worker` with its defaults, in 1 and 2 processes.
    # With the job history on (the default: every claim and outcome also writes its
    # event, in the same batched statements) and off (DEFER_HISTORY = False).
    for processes in (1, 2):
        for history in (True, False):
            plural = "es" if processes > 1 else ""
            label = "defaults" if history else "defaults, DEFER_HISTORY = False"
            database = table(f"worker {processes}{'' if history else ' no history'}")
            out.append(
                Contender(
                    f"flask_defer worker ({label}), {processes} process{plural}",
                    setup=lambda d=database: raw.clear(d),
                    run=lambda d=database, p=processes, h=history: _worker_drain(
                        ctx, d, p, n, history=h
                    ),
                    tag=f"fd-drain-worker-{processes}{'' if history else '-no-history'}",
                )
            )

    # The same worker with a wider pool. A claim takes no more jobs than the worker has
    # idle threads (every claimed job starts at once, so a killed worker has spent only
    # the attempts its handlers had), so the pool's size bounds the claim's: this row
    # shows what that guarantee costs the default pool of 20 on no-op jobs.
    database = table("worker wide")
    out.append(
        Contender(
            f"flask_defer worker (--concurrency {WIDE_POOL}), 1 process",
            setup=lambda d=database: raw.clear(d),
            run=lambda d=database: _worker_drain(ctx, d, 1, n, concurrency=WIDE_POOL),
            tag="fd-drain-worker-wide",
        )
    )

    for peer_class in peer_classes(backend):
        database = ctx.env.database(backend, f"drain {peer_class.__name__} {backend}")
        peer: Lazy[Any] = Lazy(lambda c=peer_class, d=database: c(d), peer_class.label)

        def setup(p: Lazy[Any] = peer) -> None:
            p.get().clear()
            p.get().fill_due(n)

        out.append(
            Contender(
                f"{peer_class.label} {_DRAIN_API.get(peer_class.label, '')}".strip(),
                setup=setup,
                run=lambda p=peer, who=peer_class.label: _checked_sample(p.get().drain(n), n, who),
                teardown=lambda p=peer: p.close(lambda v: v.close()),
                tag="peer-drain",
            )
        )
    return out


def _worker_drain(
    ctx: Context,
    database: Any,
    processes: int,
    n: int,
    *,
    history: bool = True,
    concurrency: int | None = None,
) -> Sample:
    """*processes* ``flask defer worker`` processes, up and idle, then *n* jobs due at once
    (each with ``--concurrency`` *concurrency*, else the worker's default).

    The jobs are written due :data:`WORKER_START_ALLOWANCE` to one second more ahead
    (a whole second); the workers sleep until then (a deadline, as for any job due
    later) and all wake together. A process not in the workers table, started before
    the jobs fell due, is an error: the contender is dropped rather than given a
    figure that measures its start-up.
    """
    if not worker_available():
        raise NotAvailable("worker not available (flask defer worker is issue 3)")
    started = datetime.now(UTC)
    # A whole second: the SQLite fill drops the microseconds of its first run_at.
    due = (started + timedelta(seconds=WORKER_START_ALLOWANCE + 1)).replace(microsecond=0)
    raw.fill(database, n, run_at=due)
    workers = WorkerProcesses(
        database,
        ctx.env.tmp,
        concurrency=concurrency,
        processes=processes,
        burst=False,
        history=history,
    )
    try:
        while raw.live_workers(database, started, due) < processes:
            if datetime.now(UTC) >= due:
                raise RuntimeError(
                    f"{processes} worker processes were not all up before their jobs fell"
                    f" due, {(due - started).total_seconds():.1f} s after their start; see"
                    f" {workers.log_path}"
                )
            time.sleep(0.05)
    except BaseException:
        workers.stop()
        raise
    workers.wait(lambda: raw.count_by_status(database).get("done", 0) >= n, timeout=900)
    first, last, done = raw.finished_span(database)
    _checked(done, n, "flask defer worker")
    # n acknowledgements span n - 1 intervals after the first one.
    return Sample(done - 1, max(last - first, 1e-9))


#: The handler threads of the wide-pool worker row: DEFER_CLAIM_BATCH's default, the
#: most one claim takes.
WIDE_POOL = 50

_DRAIN_API = {
    "deferjob": "run_once()",
    "procrastinate": "run_worker(wait=False)",
    "pgqueuer (asyncpg)": "qm.run(drain), batch size 10",
    "huey (SqliteHuey)": "consumer, its defaults (1 worker thread)",
    "huey (SqliteHuey, fsync=True)": "consumer, 1 worker thread, fsync=True",
}
