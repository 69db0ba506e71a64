"""``flask defer install`` and ``flask defer db upgrade | check | sql``: the schema's revisions."""

from __future__ import annotations

import click
from flask.cli import with_appcontext

from ..facade import current_defer
from .common import errors_to_exit_codes


@click.command("install", short_help="Create or upgrade flask_defer's tables.")
@with_appcontext
@errors_to_exit_codes
def install_command() -> None:
    """Create flask_defer's tables (jobs, schedules, history, pauses) at the newest schema
    revision and record it (apps without migrations; an existing schema is upgraded).
    Refused in an app that uses Flask-Migrate or whose database has alembic_version: run
    `flask db upgrade` there."""
    defer = current_defer()
    name = defer.install()
    click.echo(f"table {name} is ready ({defer.schema_status().message})")


@click.group("db", short_help="Schema revisions: upgrade, check, print the SQL.")
def db_cli() -> None:
    """The jobs table's schema revisions: upgrade, check, or print the SQL."""


@db_cli.command("upgrade")
@with_appcontext
@errors_to_exit_codes
def db_upgrade_command() -> None:
    """Upgrade flask_defer's schema to the newest revision (keeps every row)."""
    applied = current_defer().upgrade_schema()
    if not applied:
        click.echo("flask_defer schema is already current")
    for revision in applied:
        click.echo(f"applied {revision}")


@db_cli.command("check")
@with_appcontext
@errors_to_exit_codes
def db_check_command() -> None:
    """Exit 0 when the schema matches this code; 1 with the command to run otherwise."""
    status = current_defer().schema_status()
    if not status.ok:
        raise click.ClickException(status.message)
    click.echo(status.message)


@db_cli.command("sql")
@with_appcontext
@errors_to_exit_codes
def db_sql_command() -> None:
    """Print the SQL of the pending upgrade steps without running them (for a DBA)."""
    click.echo(current_defer().schema_sql(), nl=False)
