"""Alembic environment of ``flask defer db ...`` (apps without migrations of their own).

``store/versioning.py`` hands the connection (online) or the dialect and an output
buffer (offline, ``flask defer db sql``) through ``config.attributes``. The version is
recorded in ``defer_alembic_version``, apart from any ``alembic_version`` the app has.
SQLite runs in batch mode: it cannot alter most constraints in place, so Alembic copies
the table (rows included) where a step needs it.
"""

from __future__ import annotations

from alembic import context

from flask_defer.migrations import VERSION_TABLE

config = context.config
if context.is_offline_mode():
    context.configure(
        dialect_name=config.attributes["dialect_name"],
        output_buffer=config.attributes["output_buffer"],
        literal_binds=True,
        version_table=VERSION_TABLE,
        render_as_batch=config.attributes["dialect_name"] == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()
else:
    connection = config.attributes["connection"]
    context.configure(
        connection=connection,
        version_table=VERSION_TABLE,
        render_as_batch=connection.dialect.name == "sqlite",
        # Each revision in its own transaction: a step that must run outside one
        # (CREATE INDEX CONCURRENTLY) uses op.get_context().autocommit_block().
        transaction_per_migration=True,
    )
    with context.begin_transaction():
        context.run_migrations()
