"""The built wheel ships the blueprint's templates and static files, and finds them.

Builds the wheel from this checkout, installs it (without dependencies) into a fresh
virtualenv, and renders ``defer_toasts()`` from the installed package in a separate
interpreter whose working directory is far from the checkout. The fresh environment
borrows the already-installed dependencies (Flask, SQLAlchemy ...) through a ``.pth``
line naming the test environment's site-packages: such plain path lines are added
*after* the fresh site-packages and run no ``.pth`` hooks of their own, so the
checkout's editable install stays out of sight and ``flask_defer`` can only come from
the wheel.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from .test_readme import run_quickstart

ROOT = Path(__file__).resolve().parent.parent

PROBE = r"""
import json, sys
from pathlib import Path
from flask import Flask, render_template_string
import flask_defer
from flask_defer import Defer

app = Flask("probe", instance_path=sys.argv[1])
app.config.update(SECRET_KEY="probe", DEFER_DATABASE_URI="sqlite:///" + sys.argv[1] + "/jobs.db")
defer = Defer(app)

@defer.job("send_email")
def send_email(job):
    pass

@app.post("/send")
def send():
    defer.undoable("send_email", label="Message sent")
    return "", 204

@app.get("/")
def page():
    return render_template_string("<body>{{ defer_toasts() }}</body>")

client = app.test_client()
assert client.post("/send").status_code == 204
html = client.get("/").get_data(as_text=True)
css = client.get("/defer/static/defer/defer.css")
htmx = client.get("/defer/static/defer/htmx-2.0.11.min.js")
pending = client.get("/defer/pending")
print(json.dumps({
    "package": flask_defer.__file__,
    "templates": app.blueprints["defer"].jinja_loader.searchpath,
    "html": html,
    "css": css.status_code,
    "htmx": htmx.status_code,
    "pending": pending.status_code,
}))
css.close(); htmx.close()
app.extensions["defer"].store.engine.dispose()
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("flask_defer_jobs-*.whl")
    return built


def test_the_wheel_is_named_flask_defer_jobs_and_installs_the_flask_defer_module(
    wheel: Path,
) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    fields = zipfile.ZipFile(wheel).read(metadata).decode().splitlines()
    assert "Name: flask-defer-jobs" in fields
    assert "flask_defer/__init__.py" in names


def test_the_wheel_contains_templates_and_static_files(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in (
        "flask_defer/templates/defer/toasts.html",
        "flask_defer/templates/defer/_toast.html",
        "flask_defer/templates/defer/pending.html",
        "flask_defer/templates/defer/layout.html",
        "flask_defer/static/defer/defer.css",
        "flask_defer/static/defer/defer.js",
        "flask_defer/static/defer/htmx-2.0.11.min.js",
        "flask_defer/static/defer/htmx.LICENSE",
        # the operator dashboard
        "flask_defer/templates/defer/dashboard.html",
        "flask_defer/templates/defer/_dashboard_jobs.html",
        "flask_defer/static/defer/dashboard.css",
        "flask_defer/static/defer/dashboard.js",
        "flask_defer/py.typed",
        # the translations, compiled
        "flask_defer/translations/de/LC_MESSAGES/flask_defer.mo",
        "flask_defer/translations/fr/LC_MESSAGES/flask_defer.mo",
    ):
        assert expected in names, expected
    # The schema revisions and their Alembic environment (flask defer db upgrade).
    for expected in (
        "flask_defer/migrations/env.py",
        "flask_defer/migrations/script.py.mako",
        "flask_defer/migrations/versions/0001_initial.py",
    ):
        assert expected in names, expected
    assert not any(name.startswith("tests/") for name in names)
    assert not any(name.startswith("demo_app/") for name in names)


@pytest.fixture
def installed(wheel: Path, tmp_path: Path) -> Path:
    """The python of a fresh virtualenv holding only the wheel (dependencies borrowed)."""
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True
    )
    python = venv / "bin" / "python"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    fresh_site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    (fresh_site / "borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def test_an_installed_wheel_renders_the_toasts_from_its_own_files(
    installed: Path, tmp_path: Path
) -> None:
    venv = installed.parent.parent
    instance = tmp_path / "instance"
    instance.mkdir()
    result = subprocess.run(
        [str(installed), "-I", "-c", PROBE, str(instance)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    probe = json.loads(result.stdout)
    package = Path(probe["package"]).resolve()
    assert package.is_relative_to(venv.resolve()), package
    assert [Path(p).resolve() for p in probe["templates"]] == [package.parent / "templates"]
    assert "Message sent" in probe["html"]
    assert "data-defer-remaining" in probe["html"]
    assert "/defer/static/defer/defer.js" in probe["html"]
    assert (probe["css"], probe["htmx"], probe["pending"]) == (200, 200, 200)


def test_the_readme_quick_start_run_from_the_installed_wheel_answers_409_and_404(
    installed: Path, tmp_path: Path
) -> None:
    venv = installed.parent.parent
    folder = tmp_path / "quickstart"
    folder.mkdir()
    where = subprocess.run(
        [str(installed), "-c", "import flask_defer; print(flask_defer.__file__)"],
        cwd=folder,
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(where.stdout.strip()).resolve().is_relative_to(venv.resolve()), where.stdout
    result = run_quickstart(str(installed), folder)
    assert result.returncode == 0, result.stderr
    assert "quickstart ok 1 409 404" in result.stdout
