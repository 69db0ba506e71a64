"""Rows of the results table, and the interleaved round runner that produces them."""

from __future__ import annotations

import gc
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


class NotAvailable(Exception):  # noqa: N818 - reads as the contender's answer
    """A contender cannot run here; the message says exactly why (it goes in the table)."""


@dataclass(frozen=True)
class Sample:
    """One timed run: *count* units of work in *seconds*."""

    count: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else float("inf")


@dataclass
class Contender:
    """Something measured side by side with others, once per round.

    ``setup`` prepares the round (not timed), ``run`` does the timed work and returns
    the sample, ``teardown`` cleans up after the last round.
    """

    name: str
    run: Callable[[], Sample]
    setup: Callable[[], None] | None = None
    teardown: Callable[[], None] | None = None
    note: str = ""
    #: What the targets look for ("fd-drain-1", "peer", "baseline" ...).
    tag: str = ""


@dataclass
class Outcome:
    """What the rounds gave one contender: samples, or why it has none."""

    contender: Contender
    samples: list[Sample] = field(default_factory=list)
    missing: str | None = None

    @property
    def median_rate(self) -> float | None:
        if not self.samples:
            return None
        return statistics.median(sample.rate for sample in self.samples)

    @property
    def median_seconds(self) -> float | None:
        if not self.samples:
            return None
        return statistics.median(sample.seconds for sample in self.samples)

    def spread(self) -> str:
        if len(self.samples) < 2:
            return ""
        rates = [sample.rate for sample in self.samples]
        return f"{min(rates):,.0f}–{max(rates):,.0f}"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def interleave(title: str, contenders: Sequence[Contender], rounds: int) -> list[Outcome]:
    """Run every contender once per round, in turn: A, B, C, A, B, C ...

    Interleaving spreads machine noise (other processes, CPU frequency, the database's
    background work) over all contenders instead of letting it land on one. A
    contender that fails is dropped for the remaining rounds with the reason kept.
    """
    outcomes = [Outcome(contender) for contender in contenders]
    for round_number in range(1, rounds + 1):
        for outcome in outcomes:
            if outcome.missing is not None:
                continue
            contender = outcome.contender
            try:
                if contender.setup is not None:
                    contender.setup()
                gc.collect()
                sample = contender.run()
            except NotAvailable as reason:
                outcome.missing = f"not measured: {reason}"
                log(f"  [{title}] {contender.name}: {outcome.missing}")
                continue
            except Exception as error:  # noqa: BLE001 - one contender must not sink the run
                outcome.missing = f"failed: {type(error).__name__}: {error}".splitlines()[0]
                log(f"  [{title}] {contender.name}: {outcome.missing}")
                traceback.print_exc(file=sys.stderr)
                continue
            outcome.samples.append(sample)
            log(
                f"  [{title}] round {round_number}/{rounds} {contender.name}: "
                f"{sample.count} in {sample.seconds:.3f}s = {sample.rate:,.0f}/s"
            )
    for outcome in outcomes:
        if outcome.contender.teardown is not None:
            try:
                outcome.contender.teardown()
            except Exception as error:  # noqa: BLE001
                log(f"  [{title}] teardown of {outcome.contender.name} failed: {error}")
    return outcomes


def timed(work: Callable[[], int]) -> Sample:
    """Time *work*, which returns how many units it did."""
    start = time.perf_counter()
    count = work()
    return Sample(count, time.perf_counter() - start)


@dataclass
class Row:
    """One line of the results table."""

    measurement: str
    backend: str
    contender: str
    size: str
    figure: str
    vs_raw: str = ""
    baseline: str = ""
    note: str = ""
    spread: str = ""
    #: Machine-readable value for the targets (median rate, ratio, latency ...).
    value: float | None = None
    ratio: float | None = None
    tag: str = ""
    #: Further figures the targets need (errors, the poll interval ...).
    data: dict[str, float] = field(default_factory=dict)


def rate_rows(
    measurement: str,
    backend: str,
    outcomes: Sequence[Outcome],
    *,
    baseline: str,
    size: str,
    unit: str = "jobs/s",
) -> list[Row]:
    """Rows for throughput contenders, each also as a ratio to *baseline*'s median."""
    base = next((o for o in outcomes if o.contender.name == baseline), None)
    base_rate = base.median_rate if base is not None else None
    rows = []
    for outcome in outcomes:
        rate = outcome.median_rate
        if rate is None:
            rows.append(
                Row(
                    measurement,
                    backend,
                    outcome.contender.name,
                    size,
                    "—",
                    note=_join(outcome.missing or "", outcome.contender.note),
                    tag=outcome.contender.tag,
                )
            )
            continue
        ratio = rate / base_rate if base_rate else None
        rows.append(
            Row(
                measurement,
                backend,
                outcome.contender.name,
                size,
                f"{rate:,.0f} {unit}",
                vs_raw=f"{ratio:.2f}×" if ratio is not None else "—",
                baseline=baseline if base_rate else "",
                note=outcome.contender.note,
                spread=outcome.spread(),
                value=rate,
                ratio=ratio,
                tag=outcome.contender.tag,
            )
        )
    return rows


def _join(*parts: str) -> str:
    return "; ".join(part for part in parts if part)


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (no interpolation: a p99 is a value that occurred)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    rank = max(1, min(len(ordered), int(-(-fraction * len(ordered) // 1))))
    return ordered[rank - 1]
