"""Profile: where flask_defer's time goes on the paths the targets measure (pyinstrument).

Profiles, in this process, a ``run_due()`` drain on each backend, ``schedule()`` +
commit on PostgreSQL and ``schedule_many()`` on SQLite, and sums sampled self time by
where it is spent: the database (driver calls and the server round trips they wait
for), SQLAlchemy, flask_defer itself, Flask, blinker, logging, json, the rest.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from .. import raw
from ..fd import FlaskDeferApp
from ..results import log
from ..worker import WorkerProcesses, worker_available
from . import Context, Section

#: Filled by :func:`run` for the targets' explanations: scenario → one-line summary.
SUMMARY: dict[str, str] = {}
#: Filled by :func:`_worker_cost`: backend → (cores busy in all, the worker's, the
#: database server's) while one worker process drains, for the two-process target.
CORES: dict[str, tuple[float, float, float]] = {}

# Self time in these SQLAlchemy functions is time inside the DB-API driver's C code
# (sqlite3's execute and commit, including fsync), so it counts as "database".
_DRIVER_CALLS = {
    "do_execute",
    "do_executemany",
    "do_commit",
    "do_rollback",
    "do_begin",
    "do_execute_no_params",
    "_exec_insertmany_context",
}
_GROUPS = ("database", "SQLAlchemy", "flask_defer", "Flask", "blinker", "logging", "json", "other")


def run(ctx: Context) -> Section:
    SUMMARY.clear()
    CORES.clear()
    section = Section(
        "profile",
        "Profile: where flask_defer spends its time",
        (
            "pyinstrument, sampled in this process. *database* is time in the driver and "
            "waiting for the server (for SQLite also its C code and fsync); the other "
            "columns are Python time in each package. Scenario sizes: "
            f"{ctx.sizes.profile_jobs:,} jobs."
        ),
    )
    try:
        from pyinstrument import Profiler
    except ImportError:
        section.extra = "Not profiled: pyinstrument is not installed (`pip install -e .[bench]`)."
        return section
    n = ctx.sizes.profile_jobs
    scenarios: list[
        tuple[str, str, str, Callable[[FlaskDeferApp], Any], Callable[[Any], None]]
    ] = []
    for backend in ctx.backends:
        scenarios.append(
            (
                f"drain-{backend}",
                backend,
                f"run_due() drain, {backend}",
                lambda fd: fd.run_due(),
                lambda db: raw.fill(db, n, run_at=datetime.now(UTC) - timedelta(seconds=5)),
            )
        )
    if "postgresql" in ctx.backends:
        scenarios.append(
            (
                "each-postgresql",
                "postgresql",
                "schedule() + commit, postgresql",
                lambda fd: fd.enqueue_each(n, 3600),
                lambda db: None,
            )
        )
    for backend in ctx.backends:
        scenarios.append(
            (
                f"bulk-{backend}",
                backend,
                f"schedule_many() × 10, {backend}",
                lambda fd: [fd.enqueue_bulk(n, 3600) for _ in range(10)],
                lambda db: None,
            )
        )
    table = [
        "| scenario | wall | per job | " + " | ".join(_GROUPS) + " | top functions by self time |",
        "| --- | ---: | ---: | " + " | ".join("---:" for _ in _GROUPS) + " | --- |",
    ]
    for key, backend, title, work, prepare in scenarios:
        database = ctx.env.database(backend, f"profile {key}")
        fd = FlaskDeferApp(database)
        try:
            fd.run_due()  # warm up: connections, statement caches
            prepare(database)
            profiler = Profiler(interval=0.001)
            profiler.start()
            work(fd)
            session = profiler.stop()
        finally:
            fd.close()
        groups, functions, total = _summarise(session.root_frame())
        if total <= 0:
            continue
        shares = {name: groups.get(name, 0.0) / total for name in _GROUPS}
        top = sorted(functions.items(), key=lambda item: item[1], reverse=True)[:5]
        jobs = n * 10 if key.startswith("bulk-") else n
        table.append(
            f"| {title} | {session.duration:.2f} s | {session.duration / jobs * 1e6:,.0f} µs | "
            + " | ".join(f"{shares[name]:.0%}" for name in _GROUPS)
            + " | "
            + "; ".join(f"`{name}` {seconds / total:.0%}" for name, seconds in top)
            + " |"
        )
        ranked = sorted(((s, g) for g, s in shares.items() if g != "other"), reverse=True)
        SUMMARY[key] = ", ".join(f"{share:.0%} in {group}" for share, group in ranked[:3])
        log(f"  [profile] {title}: {SUMMARY[key]}")
    section.extra = "\n".join(table + ["", *_worker_cost(ctx), "", *_worker_stages(ctx)])
    return section


def _worker_stages(ctx: Context) -> list[str]:
    """Where a job's cost goes inside the worker, stage by stage, per job.

    The real :class:`~flask_defer.engine.worker.Worker` (``defer.worker(burst=True)``, its
    defaults) drains the backlog in this process with its stages timed: the claim on
    the loop's thread (wall and CPU, ``time.thread_time``), each job on its handler
    thread (app context, handler, hand-off of the outcome and the wake-up), the batched
    acknowledgements on the flusher's thread, and what the loop spends besides claiming.
    """
    n = ctx.sizes.drain
    lines = [
        f"The worker's stages, per job: `defer.worker(burst=True)` with its defaults draining "
        f"{n:,} no-op jobs in this process, each stage timed on its own thread (CPU by "
        "`time.thread_time`). The claim counts the attempts and writes the `started` "
        "events; the flush writes the outcomes and their events.",
        "",
        "| backend | jobs/s | claims (jobs each) | claim wall / CPU | handler thread CPU "
        "| flushes (jobs each) | flush wall / CPU | rest of the loop CPU | CPU per job |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for backend in ctx.backends:
        lines.append(_stages_on(ctx, backend, n))
        log(f"  [profile] worker stages on {backend}: {lines[-1]}")
    return lines


def _stages_on(ctx: Context, backend: str, n: int) -> str:
    """One row of :func:`_worker_stages`: a drain of *n* jobs on *backend*."""
    import threading
    import time

    database = ctx.env.database(backend, f"profile stages {backend}")
    fd = FlaskDeferApp(database)
    totals: dict[str, float] = defaultdict(float)
    lock = threading.Lock()

    def timed(stage: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return call(*args, **kwargs)
            finally:
                with lock:
                    totals[f"{stage} wall"] += time.perf_counter() - wall
                    totals[f"{stage} cpu"] += time.thread_time() - cpu
                    totals[f"{stage} calls"] += 1

        return run

    try:
        fd.run_due()  # warm up: tables, connections, statement caches
        raw.fill(database, n, run_at=datetime.now(UTC) - timedelta(seconds=5))
        with fd.app.app_context():
            from ..app import defer

            worker = defer.worker(burst=True)
            worker.runner.claim = timed("claim", worker.runner.claim)  # type: ignore[method-assign]
            worker.runner.flush = timed("flush", worker.runner.flush)  # type: ignore[method-assign]
            worker.pool._run = timed("handler", worker.pool._run)  # type: ignore[method-assign]
            loop_cpu = time.thread_time()
            worker.run(install_signal_handlers=False)
            loop_cpu = time.thread_time() - loop_cpu
    finally:
        fd.close()
    first, last, done = raw.finished_span(database)
    if done < n:
        raise RuntimeError(f"the profiled worker ran {done} of {n} jobs")

    def per_job(seconds: float) -> str:
        return f"{seconds / done * 1e6:,.0f} µs"

    claims, flushes = totals["claim calls"], totals["flush calls"]
    cpu = loop_cpu + totals["handler cpu"] + totals["flush cpu"]
    return (
        f"| {backend} | {(done - 1) / max(last - first, 1e-9):,.0f} "
        f"| {claims:,.0f} ({done / max(claims, 1):.1f}) "
        f"| {per_job(totals['claim wall'])} / {per_job(totals['claim cpu'])} "
        f"| {per_job(totals['handler cpu'])} "
        f"| {flushes:,.0f} ({done / max(flushes, 1):.1f}) "
        f"| {per_job(totals['flush wall'])} / {per_job(totals['flush cpu'])} "
        f"| {per_job(loop_cpu - totals['claim cpu'])} | {per_job(cpu)} |"
    )


def _worker_cost(ctx: Context) -> list[str]:
    """CPU time of one ``flask defer worker --burst`` process per job it ran (user +
    system, less an empty run's start-up), and its rate: what a job costs the worker
    with its threads, claims and batched acknowledgements, not only the executor."""
    if not worker_available():
        return []
    n = ctx.sizes.drain
    lines = [
        f"The worker process, `flask defer worker --burst` with its defaults, {n:,} no-op "
        "jobs: its CPU time (user + system, less an empty run's start-up) per job.",
        "",
        "| backend | jobs/s | worker CPU per job | context switches per job "
        "| database server CPU per job | cores busy (worker + server) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    cores = os.cpu_count() or 1
    for backend in ctx.backends:
        database = ctx.env.database(backend, f"profile worker {backend}")
        raw.create_jobs_table(database)
        # An empty run's start-up varies by up to a second here: the cheaper of two.
        idle = min(_worker_run(ctx, database), _worker_run(ctx, database))
        raw.fill(database, n, run_at=datetime.now(UTC) - timedelta(seconds=5))
        busy = _worker_run(ctx, database)
        first, last, done = raw.finished_span(database)
        if done < n:
            raise RuntimeError(f"the profiled worker ran {done} of {n} jobs")
        cpu = (busy[0] - idle[0]) / done * 1e6
        switches = busy[1] / done
        rate = (done - 1) / max(last - first, 1e-9)
        # The server's processes are PostgreSQL's; SQLite runs inside the worker.
        server = (busy[2] - idle[2]) / done * 1e6 if backend == "postgresql" else 0.0
        busy_cores = (cpu + server) * rate / 1e6
        if cpu > 0:  # a tiny --quick run can measure less than its idle start-up
            CORES[backend] = (busy_cores, cpu * rate / 1e6, server * rate / 1e6)
        lines.append(
            f"| {backend} | {rate:,.0f} | {cpu:,.0f} µs | {switches:.1f} "
            f"| {server:,.0f} µs | {busy_cores:.2f} of {cores} |"
        )
        log(f"  [profile] worker on {backend}: {rate:,.0f} jobs/s, {cpu:,.0f} µs CPU per job,"
            f" server {server:,.0f} µs, {busy_cores:.2f} cores busy")  # fmt: skip
    return lines


def _worker_run(ctx: Context, database: Any) -> tuple[float, int, float]:
    """One burst worker process to its end: its CPU seconds and context switches, and
    the CPU seconds the PostgreSQL server's processes spent meanwhile (0 on SQLite)."""
    server_before = _server_cpu(database)
    workers = WorkerProcesses(database, ctx.env.tmp, concurrency=None, processes=1, burst=True)
    workers.wait(lambda: False, timeout=900)
    (usage,) = workers.usage.values()  # the burst worker's own, reaped by itself
    cpu = usage.ru_utime + usage.ru_stime
    switches = usage.ru_nvcsw + usage.ru_nivcsw
    return cpu, switches, _server_cpu(database) - server_before


def _server_cpu(database: Any) -> float:
    """CPU seconds used so far by the PostgreSQL cluster holding *database*: its live
    processes' own time plus the postmaster's reaped children (backends that ended).
    Linux ``/proc`` only; 0 on SQLite or elsewhere."""
    if database.backend != "postgresql" or not os.path.exists("/proc/self/stat"):
        return 0.0
    import psycopg

    with psycopg.connect(database.dsn) as conn:
        backend_pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        postmaster = _stat(backend_pid)[1]
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            times, parent = _stat(int(entry))
        except OSError:
            continue  # gone meanwhile
        if int(entry) == postmaster:
            total += sum(times)  # its own and its reaped children's
        elif parent == postmaster:
            total += times[0] + times[1]
    return total / tick


def _stat(pid: int) -> tuple[list[int], int]:
    """(utime, stime, cutime, cstime) in clock ticks, and the parent pid, of *pid*."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # After the command's ")": state, ppid, ... utime is field 14 of the whole line.
    return [int(x) for x in fields[11:15]], int(fields[1])


def _summarise(root: Any) -> tuple[dict[str, float], dict[str, float], float]:
    groups: dict[str, float] = defaultdict(float)
    functions: dict[str, float] = defaultdict(float)
    total = 0.0
    stack = [root] if root is not None else []
    while stack:
        frame = stack.pop()
        stack.extend(frame.children)
        if frame.is_synthetic:
            continue
        own = frame.total_self_time
        if own <= 0:
            continue
        total += own
        path = frame.file_path or ""
        groups[_group(path, frame.function)] += own
        functions[f"{_module(path)}.{frame.function}"] += own
    return groups, functions, total


def _group(path: str, function: str) -> str:
    parts = path.replace(os.sep, "/")
    if "<built-in>" in parts and function.startswith(("Connection.", "Cursor.")):
        return "database"  # sqlite3's C methods: the statement itself, commit and fsync
    if "/psycopg" in parts or "/sqlite3/" in parts:
        return "database"
    if "/sqlalchemy/" in parts:
        return "database" if function in _DRIVER_CALLS else "SQLAlchemy"
    if "/flask_defer/" in parts:
        return "flask_defer"
    if "/flask/" in parts or "/werkzeug/" in parts or "/flask_sqlalchemy/" in parts:
        return "Flask"
    if "/blinker/" in parts:
        return "blinker"
    if "/logging/" in parts:
        return "logging"
    if "/json/" in parts:
        return "json"
    return "other"


def _module(path: str) -> str:
    parts = path.replace(os.sep, "/").split("/")
    for anchor in ("site-packages", "lib"):
        if anchor in parts:
            parts = parts[parts.index(anchor) + 1 :]
            break
    name = "/".join(parts[-2:])
    return name.removesuffix(".py").replace("/", ".")
