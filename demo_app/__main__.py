"""``python -m demo_app``: serve the demo at http://127.0.0.1:5000 with one command.

SQLite in the instance folder, tables created on start, the embedded worker running
the jobs. Environment: ``DEMO_HOST`` / ``DEMO_PORT`` (127.0.0.1:5000),
``DEMO_INSTANCE_PATH`` (the instance folder), ``DEMO_MAIL_UNDO_WINDOW`` /
``DEMO_DELETE_GRACE`` / ``DEMO_BATCH_WINDOW`` (seconds: 5, 30, 60), ``DATABASE_URL``
(another database; then run ``flask --app demo_app defer worker`` beside it, or set
``DEFER_EMBEDDED_WORKER=1``).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal

from . import create_app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m demo_app", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default=os.environ.get("DEMO_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("DEMO_PORT", "5000")))
    args = parser.parse_args(argv)
    # Ctrl-C stops the demo even when it was started by a script or a process manager
    # that ignored SIGINT: Python only installs its KeyboardInterrupt handler when
    # SIGINT is at its default, and an ignored SIGINT is inherited by children.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    # One line per request would bury the handlers' lines; the banner below says where.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)

    app = create_app()
    url = f"http://{args.host}:{args.port}"
    database = app.config["SQLALCHEMY_DATABASE_URI"]
    if database.startswith("sqlite"):
        database = "SQLite " + database.removeprefix("sqlite:///")
    else:
        database = database.split("://", 1)[0] + " (DATABASE_URL)"
    if app.config["DEFER_EMBEDDED_WORKER"]:
        worker = "embedded worker (a thread of this process)"
        embedded = app.extensions.get("defer.embedded_worker")
        if embedded is not None:
            embedded.start()  # now, so jobs left from a previous run go without waiting
    else:
        worker = "none here: run `flask --app demo_app defer worker` beside it"
    print(
        f"\n  flask_defer demo   {url}\n"
        f"  database           {database}\n"
        f"  jobs run by        {worker}\n"
        f"  stop with          Ctrl-C\n",
        flush=True,
    )
    app.run(host=args.host, port=args.port, threaded=True, use_reloader=False)


if __name__ == "__main__":
    main()
