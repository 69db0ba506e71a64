"""Backoff between attempts: exponential, capped, with jitter.

Jitter matters more than the curve: without it, a hundred jobs that failed together
against a flaky API retry together and fail together again.
"""

from __future__ import annotations

import random
from datetime import timedelta


def backoff_delay(
    attempts: int,
    *,
    base: timedelta,
    cap: timedelta,
    rng: random.Random | None = None,
) -> timedelta:
    """Delay before the next try after *attempts* failed runs.

    The nominal delay is ``base * 2 ** (attempts - 1)`` capped at *cap*; the returned
    delay is drawn uniformly from the upper half of it ("equal jitter"), so retries
    spread out but never come sooner than half the nominal delay.
    """
    exponent = max(attempts - 1, 0)
    nominal = cap if exponent >= 60 else min(base * (2**exponent), cap)
    fraction = (rng or random).uniform(0.5, 1.0)
    return nominal * fraction
