"""``python -m bench``: run the measurements and write ``docs/benchmarks.md``.

python -m bench                      # everything, default sizes (make bench)
python -m bench --quick              # smoke run: every path, tiny sizes, seconds
python -m bench --only drain --only enqueue
python -m bench --output /tmp/b.md   # write elsewhere
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from .env import ROOT, BenchEnv, git_revision, machine, versions
from .results import log
from .sizes import DEFAULT, QUICK

SUITES = ("enqueue", "drain", "lateness", "future", "reads", "undo", "profile", "workflows")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument(
        "--only",
        action="append",
        choices=SUITES,
        metavar="NAME",
        help=f"run only this measurement (repeatable): {', '.join(SUITES)}",
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="interleaved rounds per measurement"
    )
    parser.add_argument(
        "--backend",
        action="append",
        choices=("postgresql", "sqlite"),
        help="only this backend (repeatable; default both)",
    )
    parser.add_argument("--drain", type=int, help="jobs per drain round")
    parser.add_argument("--enqueue-each", type=int, help="jobs per one-by-one enqueue round")
    parser.add_argument("--reads-settled", type=int, help="settled rows of the reads table")
    parser.add_argument("--reads-pending", type=int, help="pending rows of the reads table")
    parser.add_argument(
        "--fsync-off",
        action="store_true",
        help="PostgreSQL with fsync=off (the test suite's setting); default: fsync on",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=ROOT / "docs" / "benchmarks.md",
        help="where to write the Markdown (default docs/benchmarks.md)",
    )
    args = parser.parse_args(argv)

    from dataclasses import replace

    from . import report, targets
    from .suites import BACKENDS, Context

    sizes = QUICK if args.quick else DEFAULT
    if args.rounds is not None:
        rounds = max(1, args.rounds)
        sizes = replace(
            sizes,
            rounds=rounds,
            enqueue_rounds=rounds,
            undo_rounds=rounds,
            future_rounds=max(rounds, sizes.future_rounds),
        )
    for option in ("drain", "enqueue_each", "reads_settled", "reads_pending"):
        value = getattr(args, option)
        if value is not None:
            sizes = replace(sizes, **{option: value})
    selected = [name for name in SUITES if not args.only or name in args.only]
    command = "python -m bench" + (
        ""
        if argv is None and len(sys.argv) <= 1
        else " " + shlex.join(sys.argv[1:] if argv is None else argv)
    )
    started = time.monotonic()
    speed_before = BenchEnv.python_speed()
    with BenchEnv(durable=not args.fsync_off) as env:
        ctx = Context(env, sizes, tuple(args.backend) if args.backend else BACKENDS)
        sections = []
        profile_summary: dict[str, str] = {}
        for name in selected:
            settled = env.settle()
            log(f"== {name}" + (f" (server settled: {settled})" if settled else ""))
            module = __import__(f"bench.suites.{name}", fromlist=["run"])
            section = module.run(ctx)
            sections.append(section)
            if name == "profile":
                profile_summary = getattr(module, "SUMMARY", {})
        facts = {
            **machine(),
            "one fsync'd commit": env.commit_cost(),
            "CPU speed (a pure-Python loop of 2,000,000 iterations, lower is faster)": (
                f"{speed_before:,.0f} ms at the start, {BenchEnv.python_speed():,.0f} ms at"
                " the end of this run"
            ),
            "PostgreSQL": env.postgres_version(),
            **versions(),
        }
        facts["flask-defer-jobs"] += f" (git {git_revision()})"
        facts["wall time of this run"] = f"{time.monotonic() - started:,.0f} s"
        results = targets.evaluate(sections, profile_summary)
        text = report.render(
            command=command,
            facts=facts,
            sections=sections,
            targets=results,
            rounds=sizes.rounds,
            quick=args.quick,
        )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    log(f"wrote {args.output} in {time.monotonic() - started:,.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
