"""How much work each measurement does: the issue's sizes, a modest default, a smoke run."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sizes:
    rounds: int
    #: Enqueue rounds are short (a bulk round is a fraction of a second), so more of
    #: them buy a steadier median cheaply.
    enqueue_rounds: int
    #: Jobs per bulk enqueue (one transaction) and per one-commit-each enqueue.
    enqueue_bulk: int
    enqueue_each: int
    drain: int
    lateness: int
    lateness_spread: tuple[float, float]
    future_rows: int
    future_due: int
    #: Draining 1,000 jobs takes well under a second, so noise needs more rounds.
    future_rounds: int
    undo_clients: int
    undo_pairs_per_client: int
    profile_jobs: int
    #: The reads measurement's table: settled history and pending backlog, and calls.
    reads_settled: int = 1_000_000
    reads_pending: int = 100_000
    reads_calls: int = 30
    undo_closed_loop: bool = False
    #: Interleaved rounds of the undo load. Its figure is a p99 over every request of
    #: every round, and one stall of this host (a slow fsync) slows some thirty
    #: requests at once: in 2 rounds (4,000 requests) that alone moved one contender's
    #: p99, and the same routes measured 0.4× to 16× each other from run to run. In 6
    #: rounds a stall is under 1% of the requests, and the stalls fall on every
    #: contender alike.
    undo_rounds: int = 6


#: The default run: the issue's sizes where a round takes seconds, fewer jobs where
#: one commit per job would make a round take minutes (a rate does not need more).
DEFAULT = Sizes(
    rounds=2,
    # One-by-one rounds swung from 1,000 to 3,300 jobs/s between rounds of 500 jobs
    # (a fsync'd commit here costs 80-300 us, depending on the host's moment): five
    # rounds of 1,000 give the median more to stand on (the ranges still swing).
    enqueue_rounds=5,
    enqueue_bulk=10_000,
    # With fsync on a commit waits for the disk: one to a few thousand per second here.
    enqueue_each=1_000,
    drain=2_000,
    lateness=200,
    lateness_spread=(1.0, 5.0),
    future_rows=1_000_000,
    future_due=1_000,
    future_rounds=3,
    undo_clients=50,
    undo_pairs_per_client=20,
    profile_jobs=1_000,
)

#: ``--quick``: a smoke run that exercises every path in seconds; figures mean little.
QUICK = Sizes(
    rounds=2,
    enqueue_rounds=2,
    enqueue_bulk=300,
    enqueue_each=100,
    drain=300,
    lateness=20,
    lateness_spread=(0.5, 1.5),
    future_rows=20_000,
    future_due=100,
    future_rounds=2,
    undo_clients=5,
    undo_pairs_per_client=5,
    undo_rounds=2,
    profile_jobs=200,
    reads_settled=20_000,
    reads_pending=2_000,
    reads_calls=5,
)
