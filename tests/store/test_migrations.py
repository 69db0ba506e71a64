"""flask_defer's revisions in real Flask-Migrate apps (``flask db ...`` as a user runs it).

Each test works in a temporary project folder holding the Upgrading page's example
(``app.py``) and able to import the apps of tests/migrate_app, on both backends: the
revisions a user gets must apply as generated, unedited.

The page's command block runs as real ``flask`` subprocesses in a shell, once per
backend. Every other test runs the same ``flask db ...`` and ``flask defer ...`` click
commands in this process (each on a freshly created app, found by its import path as
``flask --app`` finds it): Flask-Migrate, Alembic and the generated ``env.py`` are the
real ones, only the interpreter start-up of every command is saved.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import Result
from flask import Flask
from flask.cli import ScriptInfo

ROOT = Path(__file__).resolve().parent.parent.parent
#: The Upgrading page (linked from the README) holds the Flask-Migrate example.
README = (ROOT / "docs" / "upgrading.md").read_text(encoding="utf-8")
APP = "app:create_app"  # the Upgrading page's example, written to the project folder
PLAIN = "tests.migrate_app:create_plain_app"

# The subprocesses of these tests used to ignore every warning; in this process only
# the deprecation a user's generated project raises is let through: Flask-Migrate's
# env.py tries Flask-SQLAlchemy's deprecated get_engine() first. (Alembic's "No
# path_separator found" must not appear: include_in() sets one.)
pytestmark = [
    pytest.mark.filterwarnings("ignore:'get_engine' is deprecated:DeprecationWarning"),
]


def readme_app() -> str:
    match = re.search(r"<!-- upgrading:flask-migrate[^>]*-->\s*```python\n(.*?)```", README, re.S)
    assert match, "docs/upgrading.md lost its Flask-Migrate example"
    return match.group(1)


def readme_commands() -> str:
    """The shell block right after the README's Flask-Migrate example."""
    match = re.search(
        r"<!-- upgrading:flask-migrate[^>]*-->\s*```python\n.*?```\s*```\n(.*?)```", README, re.S
    )
    assert match, "docs/upgrading.md lost the commands of its Flask-Migrate example"
    return match.group(1)


def versions(folder: Path) -> list[Path]:
    return sorted((folder / "migrations" / "versions").glob("*.py"))


@contextmanager
def logging_restored() -> Iterator[None]:
    """Put the logging configuration back as it was once the block ends.

    Flask-Migrate's generated ``env.py`` calls ``logging.config.fileConfig``, which in
    a ``flask`` process of its own configures a fresh interpreter; in this one it would
    disable every logger already created, replace the root logger's handlers (pytest's
    capture among them) and point a handler at the CLI runner's stream, which is gone
    once the command returns. So the state of every logger is saved and restored, and
    the handlers the command added are closed.
    """
    manager = logging.Logger.manager
    root = logging.getLogger()
    saved = {
        name: (logger.disabled, logger.level, list(logger.handlers), logger.propagate)
        for name, logger in manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
    }
    root_level, root_handlers = root.level, list(root.handlers)
    try:
        yield
    finally:
        added: set[logging.Handler] = set(root.handlers) - set(root_handlers)
        for name, logger in list(manager.loggerDict.items()):
            if not isinstance(logger, logging.Logger):
                continue
            disabled, level, handlers, propagate = saved.get(
                name, (False, logging.NOTSET, [], True)
            )
            added.update(set(logger.handlers) - set(handlers))
            logger.disabled, logger.propagate = disabled, propagate
            logger.handlers[:] = handlers
            logger.setLevel(level)
        root.handlers[:] = root_handlers
        root.setLevel(root_level)
        for handler in added:
            handler.close()


@dataclass
class Project:
    """A project folder with the README's ``app.py``, whose ``flask`` commands run here.

    ``flask(factory, *args)`` is ``flask --app FACTORY ARGS`` run in the folder: the
    factory is found by its import path, a new app is created for each command, and the
    command's exit code, stdout and stderr come back in the result.
    """

    folder: Path
    apps: list[Flask] = field(default_factory=list)

    def flask(self, factory: str, *args: str, ok: bool = True) -> Result:
        app = ScriptInfo(app_import_path=factory).load_app()
        self.apps.append(app)
        with logging_restored():
            done = app.test_cli_runner().invoke(args=list(args))
        if ok:
            assert done.exit_code == 0, (done.output, done.exception)
        return done

    def close(self) -> None:
        """Release every app's database connections (the databases are dropped next)."""
        for app in self.apps:
            db = app.extensions["sqlalchemy"]
            with app.app_context():
                db.session.remove()
                for engine in db.engines.values():
                    engine.dispose()


@pytest.fixture
def project(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Project]:
    """An in-process project folder on the backend under test (``cd`` into it, as for a
    ``flask`` command; ``DATABASE_URL`` set; the README's app importable as ``app``)."""
    (tmp_path / "app.py").write_text(readme_app(), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.syspath_prepend(str(tmp_path))
    # Each project's app.py is its own module: another test's must not be reused.
    monkeypatch.delitem(sys.modules, "app", raising=False)
    made = Project(tmp_path)
    try:
        yield made
    finally:
        made.close()
        sys.modules.pop("app", None)


Shell = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def shell(database_url: str, tmp_path: Path) -> Shell:
    """Run a shell script in a fresh project folder holding the README's app, with the
    ``flask`` of this interpreter on ``PATH`` and ``FLASK_APP`` set: as a user would."""
    (tmp_path / "app.py").write_text(readme_app(), encoding="utf-8")
    env = {
        **os.environ,
        "FLASK_APP": APP,
        "DATABASE_URL": database_url,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "PYTHONWARNINGS": "ignore",
    }

    def run(script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    return run


@pytest.mark.long
def test_the_readmes_flask_migrate_commands_run_as_written_in_their_own_processes(
    shell: Shell, tmp_path: Path
) -> None:
    done = shell(readme_commands() + "flask defer worker --burst\n")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "flask_defer_0001" in done.stderr  # flask db upgrade ran flask_defer's revisions
    assert "current" in done.stdout  # flask defer db check
    [notes] = versions(tmp_path)  # written in the app's folder, not in the package
    source = notes.read_text()
    assert "'note'" in source and "defer_jobs" not in source


def test_flask_db_upgrade_runs_flask_defers_revisions_and_migrate_then_sees_no_change(
    project: Project,
) -> None:
    flask = project.flask
    flask(APP, "db", "init")
    behind = flask(APP, "defer", "db", "check", ok=False)
    assert behind.exit_code == 1 and "flask db upgrade" in behind.stderr

    upgraded = flask(APP, "db", "upgrade")
    assert "flask_defer_0001" in upgraded.stderr
    assert "current" in flask(APP, "defer", "db", "check").stdout

    flask(APP, "db", "migrate", "-m", "notes")
    [notes] = versions(project.folder)  # written in the app's folder, not in the package
    source = notes.read_text()
    assert "'note'" in source and "defer_jobs" not in source
    flask(APP, "db", "upgrade")

    again = flask(APP, "db", "migrate", "-m", "nothing")
    assert "No changes in schema detected" in again.stderr
    assert len(versions(project.folder)) == 1
    assert flask(APP, "defer", "db", "check").exit_code == 0
    assert flask(APP, "defer", "worker", "--burst").exit_code == 0


@pytest.mark.parametrize("separator", ["os", "space", "newline"])
def test_flask_db_upgrade_works_whatever_path_separator_the_apps_alembic_ini_names(
    project: Project, separator: str
) -> None:
    flask = project.flask
    flask(APP, "db", "init")
    ini = project.folder / "migrations" / "alembic.ini"
    text = ini.read_text(encoding="utf-8")
    ini.write_text(text.replace("[alembic]\n", f"[alembic]\npath_separator = {separator}\n"))
    upgraded = flask(APP, "db", "upgrade")
    assert "flask_defer_0004" in upgraded.stderr
    flask(APP, "db", "migrate", "-m", "notes")
    assert len(versions(project.folder)) == 1  # in the app's folder, not the package
    assert "current" in flask(APP, "defer", "db", "check").stdout


def test_autogenerated_revision_applies_unedited_and_a_second_migrate_proposes_nothing(
    project: Project,
) -> None:
    flask = project.flask
    flask(PLAIN, "db", "init")
    flask(PLAIN, "db", "migrate", "-m", "initial")
    [initial] = versions(project.folder)
    source = initial.read_text()
    assert "op.create_table('defer_jobs'" in source
    assert "flask_defer" not in source  # plain SQLAlchemy types only
    flask(PLAIN, "db", "upgrade")

    again = flask(PLAIN, "db", "migrate", "-m", "nothing")
    assert "No changes in schema detected" in again.stderr
    check = flask(PLAIN, "defer", "db", "check")
    assert "current" in check.stdout
    assert flask(PLAIN, "defer", "worker", "--burst").exit_code == 0
    flask(PLAIN, "db", "downgrade", "base")
    flask(PLAIN, "db", "upgrade")


def test_an_app_sharing_the_database_without_init_app_proposes_no_drop(
    project: Project,
) -> None:
    flask = project.flask
    flask(APP, "db", "init")
    flask(APP, "db", "upgrade")
    for admin in ("tests.migrate_app:create_admin_app", "tests.migrate_app.bare_admin:create_app"):
        flask(admin, "db", "migrate", "-m", "admin")
        for path in versions(project.folder):
            assert "drop_table('defer_jobs')" not in path.read_text(), (admin, path.read_text())
            path.unlink()
    # Without the guard the danger is real: that is what include_object prevents.
    flask("tests.migrate_app.bare_admin:create_unguarded_app", "db", "migrate", "-m", "drop")
    assert any("op.drop_table('defer_jobs')" in p.read_text() for p in versions(project.folder))


def test_install_and_own_upgrade_refuse_in_a_flask_migrate_app_before_and_after_db_upgrade(
    project: Project,
) -> None:
    flask = project.flask
    flask(APP, "db", "init")
    before = flask(APP, "defer", "install", ok=False)
    assert before.exit_code == 1 and "flask db upgrade" in before.stderr
    own_upgrade = flask(APP, "defer", "db", "upgrade", ok=False)
    assert own_upgrade.exit_code == 1 and "flask db upgrade" in own_upgrade.stderr
    flask(APP, "db", "upgrade")
    after = flask(APP, "defer", "install", ok=False)
    assert after.exit_code == 1 and "flask db upgrade" in after.stderr
    assert flask(APP, "defer", "db", "check").exit_code == 0


def test_worker_refuses_a_schema_behind_the_code_on_the_alembic_path(
    project: Project, caplog: pytest.LogCaptureFixture
) -> None:
    project.flask(APP, "db", "init")
    caplog.set_level(logging.INFO, logger="flask_defer")
    refused = project.flask(APP, "defer", "worker", "--burst", ok=False)
    assert refused.exit_code == 1
    assert "does not exist" in refused.stderr and "flask db upgrade" in refused.stderr
    # The worker refuses at once: it neither loops on the missing table nor logs retries.
    logged = caplog.text + refused.stderr
    assert "retrying" not in logged
