"""(5) Undo under load: concurrent clients doing schedule-undoable → undo over HTTP.

The bench app is served by waitress in its own process; the clients are asyncio tasks
in this process, each with its own keep-alive connection, each doing "schedule" then
"undo" in a closed loop with no think time. Latency is per request, measured by the
client (so it includes queueing at the server).

Which routes: the blueprint's Undo endpoint and ``defer.undoable()`` (issue 4) are built
in a parallel branch. Until they exist, the flask_defer figure uses the bench app's
``/bench/undoable`` + ``/bench/undo/<id>`` routes, which call ``defer.schedule`` (with an
owner, a label and ``undo_until``) and ``defer.cancel(id, owner=...)``: the facade calls
the real endpoint is built on, so the same code path. :func:`undo_routes` is where the
real endpoints plug in. The raw baseline does the same insert and guarded cancel with
hand-written SQL on the same server.
"""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import partial

from ..env import ROOT, Database
from ..results import (
    Contender,
    NotAvailable,
    Outcome,
    Row,
    Sample,
    interleave,
    log,
    percentile,
)
from . import Context, Section

CLIENT_HEADER = "X-Bench-Client"


@dataclass(frozen=True)
class Routes:
    """How a client schedules an undoable job and undoes it."""

    label: str
    schedule: str
    undo: str  # with "{id}"


def undo_routes() -> tuple[Routes, str]:
    """The flask_defer routes to load, and what they are (for the report).

    The routes call ``defer.undoable`` and ``defer.undo``, as the blueprint's endpoint
    does; the endpoint's CSRF check and template are left out so that the figure is the
    library's, not Jinja's.
    """
    note = "bench routes over defer.undoable + defer.undo (the undo endpoint's calls)"
    return Routes("flask_defer", "/bench/undoable", "/bench/undo/{id}"), note


RAW = Routes("raw SQL", "/bench/raw/undoable", "/bench/raw/undo/{id}")


@dataclass
class Tally:
    """What one route set's requests measured: one per row, so that routes timed in the
    same run (in turn) keep their latencies apart."""

    schedule_ms: list[float] = field(default_factory=list)
    undo_ms: list[float] = field(default_factory=list)
    #: Pairs whose schedule and undo both answered as they should.
    completed: int = 0
    errors: int = 0
    first_error: str = ""

    def error(self, text: str) -> None:
        self.errors += 1
        if not self.first_error:
            self.first_error = text


#: The label of the contender served without the job history.
NO_HISTORY = "DEFER_HISTORY = False"

#: Pause of a paced client between its requests: a person reads the toast, then clicks.
PACED_THINK_MS = 100


def run(ctx: Context) -> Section:
    sizes = ctx.sizes
    routes, note = undo_routes()
    section = Section(
        "undo",
        "Undo under load (HTTP, waitress)",
        (
            f"{sizes.undo_clients} concurrent clients, each with its own keep-alive "
            f"connection, doing schedule → undo pairs ({sizes.undo_pairs_per_client} per "
            "round closed loop, with no pause: the server is saturated and latency is "
            f"mostly queueing; half as many paced, pausing {PACED_THINK_MS} ms before each "
            f"request, as people clicking would), in {sizes.undo_rounds} interleaved rounds; "
            "the p99 is over every request of every round. waitress with 8 threads in its own "
            "process, the app's start-up objects frozen out of its full garbage "
            "collections (`gc.freeze()` after loading it), and the clients' collector off "
            "while they time; latency per request as the client sees it. "
            f"flask_defer: {note}; also served by a second process with `{NO_HISTORY}` "
            "(the raw route writes no history event). Each route set runs in rounds of its "
            "own, and flask_defer's routes and the raw ones also run *in turn*: each client's "
            "pairs alternate between them, with twice the clients, so that each route gets "
            "as many requests as in its own rounds, at the same moments, from about as many "
            "clients per server; each is served by a process and a fresh database of its "
            "own (the target is judged on these: a stall of the host slows both alike, and "
            "neither waits for the other's locks). “vs raw” divides the raw route's p99 by "
            "flask_defer's, measured the same way (below 1: flask_defer is slower)."
        ),
    )
    for backend in ctx.backends:
        section.rows += _backend(ctx, backend, routes)
    return section


@dataclass(frozen=True)
class _Mode:
    """How the clients pace their requests, and how many pairs each does per round."""

    label: str
    think_ms: float
    pairs: int
    tag: str


def _backend(ctx: Context, backend: str, routes: Routes) -> list[Row]:
    sizes = ctx.sizes
    database = ctx.env.database(backend, f"undo {backend}")
    # Paced clients, as people clicking (the target's measurement); the saturated
    # closed loop only with --undo-closed-loop, as it mostly measures queueing.
    modes = [
        _Mode(
            f"{PACED_THINK_MS} ms pauses",
            PACED_THINK_MS,
            sizes.undo_pairs_per_client,
            "undo-paced",
        ),
    ]
    if sizes.undo_closed_loop:
        modes.insert(0, _Mode("closed loop", 0.0, sizes.undo_pairs_per_client, "undo"))
    servers: list[_Server] = []
    try:
        server = _Server(database, ctx.env.tmp)
        servers.append(server)
        # The same routes without the job history (each request writes one row fewer,
        # its event), so the report can show what the history costs under load.
        bare = _Server(database, ctx.env.tmp, history=False)
        servers.append(bare)
        # flask_defer's routes and the raw ones, each on a server and a fresh database of
        # its own, for the routes in turn (below): neither pays for the other's garbage
        # collections, threads or locks, nor for rows the other rounds left.
        ours = _Server(ctx.env.database(backend, f"undo in turn {backend}"), ctx.env.tmp)
        servers.append(ours)
        apart = _Server(ctx.env.database(backend, f"undo raw {backend}"), ctx.env.tmp)
        servers.append(apart)
    except Exception as error:  # noqa: BLE001
        for started in servers:
            started.stop()
        return [
            Row(
                "undo under load",
                backend,
                routes.label,
                "",
                "—",
                note=f"failed: {error}",
                tag="undo",
            )
        ]
    # Each contender's run: its tallies (one per route set it times, by row name).
    tallies: dict[str, Tally] = {}
    raw_of: dict[str, str] = {}  # row → the raw route's row of its mode
    tag_of: dict[str, str] = {}
    runs_of: dict[str, list[str]] = {}  # contender → its rows
    contenders = []

    def timed_run(
        plan: list[tuple[Routes, int, Tally]], mode: _Mode, clients: int = sizes.undo_clients
    ) -> Sample:
        """One round of *clients* clients over *plan*, timed, the clients' collector off.

        The clients' own garbage collections stay out of the latencies they time, as
        timeit keeps them out of its loops: full ones in this process took 7-16 ms,
        about twenty a run, and landed on whichever contender was running.
        """
        gc.disable()
        try:
            start = time.perf_counter()
            pairs = asyncio.run(_load_mixed(plan, clients, mode.pairs, mode.think_ms))
            took = time.perf_counter() - start
        finally:
            gc.enable()
        gc.collect()
        return Sample(pairs, took)

    sets = (
        (routes, server.port, routes.label, ""),
        (routes, bare.port, f"{routes.label} ({NO_HISTORY})", "-no-history"),
        (RAW, server.port, RAW.label, "-raw"),
    )
    for mode in modes:
        raw_name = f"{RAW.label}, {mode.label}"
        for r, port, label, suffix in sets:
            name = f"{label}, {mode.label}"
            tallies[name], raw_of[name], tag_of[name] = Tally(), raw_name, mode.tag + suffix
            runs_of[name] = [name]
            contenders.append(
                Contender(name, run=partial(timed_run, [(r, port, tallies[name])], mode))
            )
    # The target's measurement: flask_defer's routes and the raw ones at the same
    # moments, each client's pairs taking them in turn, with twice the clients, so that
    # each server has about as many at a time as in a round of its own and each route
    # gets as many requests. A stall of this host (a slow fsync, another process) then
    # slows requests of both alike, where in rounds of their own it landed on whichever
    # ran then: the same code measured 0.25× to 1.70× the raw route's p99 from run to
    # run. Each has a server and a fresh database of its own: on one server the raw
    # requests would also wait for flask_defer's (its write lock on SQLite, its garbage
    # collections), which would flatter the ratio.
    paced = modes[-1]
    mixed = f"flask_defer and raw SQL in turn, {paced.label}"
    turns: list[tuple[Routes, int, Tally]] = []
    runs_of[mixed] = []
    for r, port, label, suffix in (
        (routes, ours.port, routes.label, ""),
        (RAW, apart.port, RAW.label, "-raw"),
    ):
        name = f"{label}, {paced.label}, in turn"
        tallies[name], tag_of[name] = Tally(), "undo-mixed" + suffix
        raw_of[name] = f"{RAW.label}, {paced.label}, in turn"
        runs_of[mixed].append(name)
        turns.append((r, port, tallies[name]))
    contenders.append(
        Contender(mixed, run=partial(timed_run, turns, paced, 2 * sizes.undo_clients))
    )
    try:
        # Warm-up, not counted: imports, pools, statement caches. With every client at
        # once, so each server thread opens its pooled connection now: with four, the
        # first measured contender on a server (flask_defer's routes) paid for opening
        # the rest of the pool, and the raw routes, measured after them on the same
        # server, never did.
        for r, port in [(r, port) for r, port, _, _ in sets] + [
            (routes, ours.port),
            (RAW, apart.port),
        ]:
            asyncio.run(_load(port, r, sizes.undo_clients, 5, Tally(), 0.0))
        outcomes = interleave(f"undo/{backend}", contenders, sizes.undo_rounds)
    finally:
        for started in servers:
            started.stop()
    rows = []
    for outcome in outcomes:
        names = runs_of[outcome.contender.name]
        for name in names:
            tally = tallies[name]
            if len(names) == 1:
                rate = outcome.median_rate or 0.0
            else:  # the routes in turn shared their rounds: pairs over all of their time
                seconds = sum(sample.seconds for sample in outcome.samples)
                rate = tally.completed / seconds if seconds else 0.0
            rows.append(
                _row(backend, name, outcome, tally, tallies.get(raw_of[name]), tag_of[name],
                     rate, sizes.undo_clients, shared=len(names) > 1)
            )  # fmt: skip
    return rows


def _row(
    backend: str,
    name: str,
    outcome: Outcome,
    tally: Tally,
    raw_tally: Tally | None,
    tag: str,
    rate: float,
    clients: int,
    *,
    shared: bool,
) -> Row:
    """The row of one route set's requests; *rate* is its pairs per second, over rounds
    it *shared* with another route set when it ran in turn with one (then with twice
    *clients*, about *clients* on each server)."""
    everything = tally.schedule_ms + tally.undo_ms
    if not everything:
        return Row(
            "undo under load",
            backend,
            name,
            "",
            "—",
            note=outcome.missing or "no request completed",
            tag=tag,
        )
    p99 = percentile(everything, 0.99)
    raw_all = (raw_tally.schedule_ms + raw_tally.undo_ms) if raw_tally else []
    ratio = percentile(raw_all, 0.99) / p99 if raw_all else None
    figure = (
        f"p50 {percentile(everything, 0.5):.1f} / p99 {p99:.1f} ms "
        f"(schedule p99 {percentile(tally.schedule_ms, 0.99):.1f}, "
        f"undo p99 {percentile(tally.undo_ms, 0.99):.1f}); "
        f"{rate:,.0f} pairs/s{' (rounds shared in turn)' if shared else ''}; "
        f"errors {tally.errors}"
    )
    note = f"{len(everything):,} requests"
    if tally.first_error:
        note += f"; first error: {tally.first_error}"
    return Row(
        "undo under load",
        backend,
        name,
        f"{2 * clients} clients in turn, about {clients} per server"
        if shared
        else f"{clients} clients",
        figure,
        vs_raw=f"{ratio:.2f}×" if ratio is not None else "",
        note=note,
        value=p99,
        ratio=ratio,
        tag=tag,
        data={
            "errors": float(tally.errors),
            "requests": float(len(everything)),
            "clients": float(clients),
            "p50": percentile(everything, 0.5),
        },
    )


async def _load(
    port: int, routes: Routes, clients: int, pairs: int, tally: Tally, think_ms: float
) -> int:
    """*clients* clients doing *pairs* schedule → undo pairs each on one route set."""
    return await _load_mixed([(routes, port, tally)], clients, pairs, think_ms)


async def _load_mixed(
    plan: list[tuple[Routes, int, Tally]], clients: int, pairs: int, think_ms: float
) -> int:
    """Like :func:`_load`, each client's pairs rotating through the route sets of
    *plan* (client *n*'s pair *k* on ``plan[(n + k) % len(plan)]``), each timed into
    its own tally: every route set is measured at the same moments, under the same load.
    Each gets the same share of the pairs when *pairs* or *clients* is a multiple of
    ``len(plan)``.
    A failed request is charged to its route and the client goes on; an exception (a
    broken connection) is charged to the route it was on and stops the client, for
    every route."""
    done = await asyncio.gather(
        *(
            _client(plan, f"client-{n}", pairs, think_ms, first=n, offset=n / clients)
            for n in range(clients)
        )
    )
    return sum(done)


async def _client(
    plan: list[tuple[Routes, int, Tally]],
    name: str,
    pairs: int,
    think_ms: float,
    *,
    first: int,
    offset: float,
) -> int:
    """One client: its own keep-alive connection to each server of *plan*."""
    connections: dict[int, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
    completed = 0
    pause = think_ms / 1000
    tally = plan[first % len(plan)][2]
    try:
        for port in dict.fromkeys(port for _, port, _ in plan):
            connections[port] = await asyncio.open_connection("127.0.0.1", port)
        if pause:
            await asyncio.sleep(pause * offset)  # spread the paced clients' first requests
        for n in range(pairs):
            routes, port, tally = plan[(first + n) % len(plan)]
            reader, writer = connections[port]
            if pause:
                await asyncio.sleep(pause)
            status, body, ms = await _post(reader, writer, f"{routes.schedule}?n={n}", name)
            tally.schedule_ms.append(ms)
            if status != 200 or b'"id"' not in body:
                tally.error(f"schedule → {status} {body[:80]!r}")
                continue
            job_id = int(body.split(b'"id":', 1)[1].split(b"}", 1)[0].strip())
            if pause:
                await asyncio.sleep(pause)
            status, body, ms = await _post(reader, writer, routes.undo.format(id=job_id), name)
            tally.undo_ms.append(ms)
            if status != 200 or b"true" not in body:
                tally.error(f"undo → {status} {body[:80]!r}")
                continue
            completed += 1
            tally.completed += 1
    except (OSError, asyncio.IncompleteReadError, ValueError) as error:
        tally.error(f"{type(error).__name__}: {error}")
    finally:
        for _, writer in connections.values():
            writer.close()
    return completed


async def _post(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str, client: str
) -> tuple[int, bytes, float]:
    request = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{CLIENT_HEADER}: {client}\r\n"
        "Content-Length: 0\r\n\r\n"
    ).encode()
    start = time.perf_counter()
    writer.write(request)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    body = await reader.readexactly(length) if length else b""
    return status, body, (time.perf_counter() - start) * 1000


class _Server:
    """``python -m bench.serve`` on a free port, until stopped."""

    def __init__(
        self, database: Database, log_dir: os.PathLike[str], *, history: bool = True
    ) -> None:
        """*history* False serves the app with ``DEFER_HISTORY = False``."""
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        env = dict(os.environ, BENCH_DATABASE_URL=database.url, PYTHONPATH=str(ROOT))
        env["BENCH_APP_DEFER_HISTORY"] = "true" if history else "false"  # JSON values
        self.log_path = os.path.join(log_dir, f"serve-{self.port}.log")
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.serve", "--port", str(self.port)],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise NotAvailable(
                        f"the waitress server did not start; see {self.log_path}"
                    ) from None
                time.sleep(0.1)
        log(f"  waitress serving the bench app on port {self.port}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
