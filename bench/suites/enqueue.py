"""(1) Enqueue: jobs due in an hour, one commit per job and in bulk (one transaction)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from .. import raw
from ..fd import FlaskDeferApp
from ..plain import PlainSessionApp
from ..results import Contender, interleave, log, rate_rows, timed
from . import Context, Section, peer_classes
from .lazy import Lazy

DELAY = 3600.0
RAW_BULK = "raw executemany, one transaction"
RAW_EACH = "raw INSERT + commit per job"
SESSION_EACH = "raw INSERT through db.session + commit"
PLAIN_EACH = "plain Flask-SQLAlchemy app: raw INSERT through db.session + commit"


def run(ctx: Context) -> Section:
    sizes = ctx.sizes
    section = Section(
        "enqueue",
        "Enqueue: jobs due in an hour",
        (
            f"Bulk: {sizes.enqueue_bulk:,} jobs in one transaction. One by one: "
            f"{sizes.enqueue_each:,} jobs, one `schedule()` (or the library's equivalent) "
            "and one commit each. Every contender writes to its own fresh database, "
            f"emptied before each round; {sizes.enqueue_rounds} interleaved rounds. The raw "
            "rows insert into flask_defer's own table."
        ),
    )
    for backend in ctx.backends:
        log(f"enqueue on {backend}")
        bulk, each = _contenders(ctx, backend)
        outcomes = interleave(f"enqueue/{backend}", bulk + each, sizes.enqueue_rounds)
        section.rows += rate_rows(
            "enqueue, bulk",
            backend,
            outcomes[: len(bulk)],
            baseline=RAW_BULK,
            size=f"{sizes.enqueue_bulk:,}",
        )
        section.rows += rate_rows(
            "enqueue, one by one",
            backend,
            outcomes[len(bulk) :],
            baseline=RAW_EACH,
            size=f"{sizes.enqueue_each:,}",
        )
    return section


def _contenders(ctx: Context, backend: str) -> tuple[list[Contender], list[Contender]]:
    sizes = ctx.sizes
    bulk: list[Contender] = []
    each: list[Contender] = []

    def raw_pair() -> None:
        database = ctx.env.database(backend, f"enqueue raw {backend}")
        raw.create_jobs_table(database)
        insert = raw.pg_insert if backend == "postgresql" else raw.sqlite_insert

        def due() -> datetime:
            return datetime.now(UTC) + timedelta(seconds=DELAY)

        bulk.append(
            Contender(
                RAW_BULK,
                setup=lambda: raw.clear(database),
                run=lambda: timed(
                    lambda: insert(database, sizes.enqueue_bulk, run_at=due(), bulk=True)
                ),
            )
        )
        each.append(
            Contender(
                RAW_EACH,
                setup=lambda: raw.clear(database),
                run=lambda: timed(
                    lambda: insert(database, sizes.enqueue_each, run_at=due(), bulk=False)
                ),
            )
        )

    def flask_defer_pair() -> None:
        database = ctx.env.database(backend, f"enqueue flask_defer {backend}")
        app = FlaskDeferApp(database)
        bulk.append(
            Contender(
                "flask_defer schedule_many() + commit",
                setup=lambda: raw.clear(database),
                run=lambda: timed(lambda: app.enqueue_bulk(sizes.enqueue_bulk, DELAY)),
                teardown=app.close,
                tag="fd-bulk",
            )
        )
        each.append(
            Contender(
                "flask_defer schedule() + commit",
                setup=lambda: raw.clear(database),
                run=lambda: timed(lambda: app.enqueue_each(sizes.enqueue_each, DELAY)),
                tag="fd-each",
            )
        )
        each.append(
            Contender(
                SESSION_EACH,
                setup=lambda: raw.clear(database),
                run=lambda: timed(lambda: app.session_insert_each(sizes.enqueue_each, DELAY)),
                note="the raw INSERT as SQL text through the app's db.session: its floor",
            )
        )

    def plain_session() -> None:
        database = ctx.env.database(backend, f"enqueue plain session {backend}")
        raw.create_jobs_table(database)
        app = PlainSessionApp(database)
        each.append(
            Contender(
                PLAIN_EACH,
                setup=lambda: raw.clear(database),
                run=lambda: timed(lambda: app.session_insert_each(sizes.enqueue_each, DELAY)),
                teardown=app.close,
                note="the same INSERT in a Flask-SQLAlchemy app flask_defer never touched",
            )
        )

    raw_pair()
    flask_defer_pair()
    plain_session()
    for peer_class in peer_classes(backend):
        database = ctx.env.database(backend, f"enqueue {peer_class.__name__} {backend}")
        peer: Lazy[Any] = Lazy(lambda c=peer_class, d=database: c(d), peer_class.label)
        bulk.append(
            Contender(
                f"{peer_class.label} {_BULK_API.get(peer_class.label, 'bulk')}",
                setup=lambda p=peer: p.get().clear(),
                run=lambda p=peer: timed(lambda: p.get().enqueue_bulk(sizes.enqueue_bulk, DELAY)),
                note=_BULK_NOTE.get(peer_class.label, ""),
                tag="peer",
            )
        )
        each.append(
            Contender(
                f"{peer_class.label} {_EACH_API.get(peer_class.label, '')}",
                setup=lambda p=peer: p.get().clear(),
                run=lambda p=peer: timed(lambda: p.get().enqueue_each(sizes.enqueue_each, DELAY)),
                teardown=lambda p=peer: p.close(lambda v: v.close()),
                tag="peer",
            )
        )
    return bulk, each


_BULK_API = {
    "deferjob": "schedule(conn=…) × N, one commit",
    "procrastinate": "batch_defer()",
    "pgqueuer (asyncpg)": "enqueue(lists)",
    "huey (SqliteHuey)": "bulk",
    "huey (SqliteHuey, fsync=True)": "bulk",
}
_BULK_NOTE = {"deferjob": "no bulk API; N inserts on one connection, one commit"}
_EACH_API = {
    "deferjob": "schedule()",
    "procrastinate": "defer()",
    "pgqueuer (asyncpg)": "enqueue()",
    "huey (SqliteHuey)": "task.schedule()",
    "huey (SqliteHuey, fsync=True)": "task.schedule()",
}
