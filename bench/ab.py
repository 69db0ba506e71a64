"""A/B of flask_defer against another revision of itself, in one interleaved run.

    python -m bench.ab BASE_REV [--rounds 6] [--backend sqlite --backend postgresql]

Checks BASE_REV out into a temporary worktree and measures it and this checkout side
by side (``bench.ab_case``: enqueue one by one, a burst drain, the µs of one
``schedule()``, a bulk ``schedule_many()``, ``batch()`` appends one by one), alternating
which goes first each round, each measurement a fresh process with the tree first on
``PYTHONPATH`` (and the case script of this checkout, so any revision can be the base),
on SQLite and on a throwaway
PostgreSQL with fsync on (as users run it). Prints the medians and new/base per
figure: how a hot-path change is checked against its parent commit.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.pg_cluster import PostgresCluster

ROOT = Path(__file__).resolve().parent.parent
CASES = (
    ("enqueue", 2000), ("drain", 5000), ("schedule", 300), ("bulk", 10000), ("batch", 2000),
)


def measure(tree: Path, backend: str, case: str, n: int) -> float:
    # The script by its path, from a folder of no checkout: its own folder and then
    # PYTHONPATH come first on sys.path, so *tree*'s flask_defer is the one imported.
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "ab_case.py"), backend, case, str(n)],
        env=env, capture_output=True, text=True, cwd=tempfile.gettempdir(), timeout=600,
        check=False,
    )  # fmt: skip
    if out.returncode:
        raise SystemExit(f"{tree} {case}: {out.stderr[-2000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.splitlines()[0])
    parser.add_argument("base", help="the revision to compare with (e.g. HEAD~1)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--backend", action="append", choices=("sqlite", "postgresql"))
    parser.add_argument(
        "--case", action="append", choices=[case for case, _ in CASES],
        help="only this measurement (repeatable; default all)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    cases = [(case, n) for case, n in CASES if not args.case or case in args.case]
    backends = args.backend or ["sqlite", "postgresql"]
    worktree = Path(tempfile.mkdtemp(prefix="flask-defer-ab-"))
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(worktree), args.base],
                   cwd=ROOT, check=True)  # fmt: skip
    cluster = None
    try:
        trees = {"base": worktree, "new": ROOT}
        # A database per tree on PostgreSQL: both record their schema revision in one
        # version table per database, and an older tree cannot read a newer one's.
        urls = {("sqlite", name): "sqlite" for name in trees}
        if "postgresql" in backends:
            cluster = PostgresCluster(durable=True)
            cluster.start()
            for name in trees:
                urls[("postgresql", name)] = cluster.create_database(f"flask_defer_ab_{name}")
        for backend in backends:
            results: dict[tuple[str, str], list[float]] = {}
            for r in range(args.rounds):
                order = list(trees.items())
                if r % 2:
                    order.reverse()
                for case, n in cases:
                    for name, tree in order:
                        value = measure(tree, urls[(backend, name)], case, n)
                        results.setdefault((name, case), []).append(value)
            for case, _ in cases:
                base = statistics.median(results[("base", case)])
                new = statistics.median(results[("new", case)])
                unit = {"schedule": "µs", "batch": "items/s"}.get(case, "jobs/s")
                print(f"{backend:10} {case:8} base {base:8,.1f} {unit}  new {new:8,.1f} {unit}"
                      f"  new/base {new / base:.3f}  ({args.rounds} rounds)")  # fmt: skip
    finally:
        if cluster is not None:
            cluster.stop()
        subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT,
                       check=False)  # fmt: skip
        shutil.rmtree(worktree, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
