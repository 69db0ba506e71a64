"""Serve the bench app with waitress: ``python -m bench.serve --port N`` (for the undo load).

The database comes from ``BENCH_DATABASE_URL``. waitress is a production WSGI server
that runs on any platform; ``--threads`` sets its worker threads.
"""

from __future__ import annotations

import argparse
import gc
import logging

from waitress import serve

from .app import create_app


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.serve")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)  # "task queue depth" noise
    app = create_app()
    # The app's start-up objects out of the server's full garbage collections, as a
    # deployment that loads its app before serving may do (gc.freeze() after loading):
    # otherwise each walked them for 42-55 ms while every thread waited, a few times a
    # run, and the pause fell on whichever contender was being measured.
    gc.collect()
    gc.freeze()
    serve(app, host="127.0.0.1", port=args.port, threads=args.threads, _quiet=True)


if __name__ == "__main__":
    main()
