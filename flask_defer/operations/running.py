"""Running jobs outside the worker's own loop: ``run_due``, a worker, pruning.

``run_due`` is a complete cron runner on the worker's own code (the runner's claim →
execute → acknowledge), with the two steps that make it safe without a worker
anywhere: returning lapsed leases and sweeping expired jobs first.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from ..engine.execution import Clock, RunSummary
from ..engine.maintenance import expire_due, reclaim_lapsed, release_stranded
from ..engine.maintenance import prune as prune_settled
from ..engine.runner import Runner
from ..engine.worker import Worker, make_worker
from ..errors import InvalidArgument
from ..timeutil import Duration, as_utc, utcnow
from ..validation import checked_actor, checked_max_seconds, checked_text
from .state import DeferState


def run_due(
    state: DeferState,
    now: datetime | None = None,
    *,
    limit: int | None = None,
    max_seconds: Duration | None = None,
    actor: str | None = None,
) -> RunSummary:
    """Run every job due at *now* in this thread, through the worker's runner.

    First the jobs of a run that died (``kill -9``, a lost host) whose leases lapsed
    go back to pending: the worker's reclaim step, under its lock, so a cron run
    needs no worker anywhere. Leases are judged by the wall clock, not by *now*:
    ``run_due(now=tomorrow)`` never takes over a job that is running right now.
    """
    fixed = as_utc(now, "now") if now is not None else None
    deadline = None
    if max_seconds is not None:
        deadline = time.monotonic() + checked_max_seconds(max_seconds).total_seconds()

    def clock() -> datetime:
        return fixed if fixed is not None else utcnow()

    runner = state.runner
    if actor is not None:
        # The same executor and settings; only the name the history records differs.
        runner = Runner(
            state.store,
            runner.executor,
            lease=runner.lease,
            claim_batch=runner.claim_batch,
            actor=checked_actor(actor),
        )
    state.transactions.refuse_uncommitted("run_due")
    reclaim_lapsed(state.store, utcnow, actor=runner.actor)
    expire_due(state.store, clock, actor=runner.actor, emit=state.send)
    # A cron-only deployment has no worker's maintenance round to do this.
    release_stranded(state.store, utcnow, actor=runner.actor)
    if state.recurring is not None:
        # Sync at every call (run_due is a cron runner's whole "worker start"), then
        # write the ticks due by *now*, so the runner below runs them too.
        state.recurring.sync(clock())
        state.recurring.materialise(clock())
    return runner.run_due(clock, limit=limit, deadline=deadline)


def build_worker(state: DeferState, *, clock: Clock | None = None, **options: Any) -> Worker:
    """A worker over this app's store and executor (options as ``make_worker``)."""
    return make_worker(
        state.store, state.executor, state.config, clock=clock, ticker=state.recurring, **options
    )


def worker(
    state: DeferState,
    *,
    concurrency: int | None,
    queues: Iterable[str] | None,
    burst: bool,
    clock: Clock | None,
) -> Worker:
    """A worker for *state*'s app, its command-line style arguments checked."""
    if concurrency is not None and (
        isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
    ):
        raise InvalidArgument("concurrency", f"expected an integer ≥ 1, got {concurrency!r}")
    names: list[str] | None = None
    if queues is not None:
        if isinstance(queues, str):
            raise InvalidArgument("queues", "expected a list of queue names, not one string")
        names = [checked_text(q, "queues") or "" for q in queues] or None
    return build_worker(
        state, concurrency=concurrency, queues=names, burst=bool(burst), clock=clock
    )


def prune(state: DeferState, now: datetime | None = None) -> int:
    """Delete settled jobs past their retention now; return how many."""
    at = as_utc(now, "now") if now is not None else utcnow()
    state.transactions.refuse_uncommitted("prune")
    # At the real time, as run_due: an injected *now* only picks what is past retention.
    release_stranded(state.store, utcnow)
    return prune_settled(state.store, state.config.maintenance_policy(), lambda: at)
