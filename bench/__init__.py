"""The flask_defer benchmark suite: ``python -m bench`` (or ``make bench``).

Measures flask_defer on the same machine, in one run, side by side with raw-SQL loops
over the same table (the limit a job library can approach) and with peer libraries
through their public APIs, and writes ``docs/benchmarks.md``. Contenders run in
interleaved rounds (A, B, A, B ...) so that a noisy neighbour slows every contender
alike instead of one of them.
"""
