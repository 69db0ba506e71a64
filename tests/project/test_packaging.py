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
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from .test_readme import run_quickstart

ROOT = Path(__file__).resolve().parent.parent.parent

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


def readme_install_lines(marker: str = "install") -> list[str]:
    """The README's install commands after ``<!-- marker: ... -->``, as a user pastes them."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(rf"<!-- {marker}:[^>]*-->\s*```\n(.*?)```", text, re.S)
    assert match, f"README.md lost its {marker} block"
    return [line for line in match.group(1).splitlines() if line.strip()]


def borrowed_without_flask_defer(folder: Path) -> Path:
    """The test environment's packages, minus every trace of flask_defer itself.

    A fresh virtualenv reads this folder through a ``.pth`` line, so ``pip install``
    finds Flask, SQLAlchemy, psycopg ... already there and needs no index; without
    flask_defer's own files and metadata it cannot mistake the checkout's editable
    install for the wheel, or touch it.
    """
    folder.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = entry.name.lower()
        if name.startswith(("flask_defer", "_editable_impl_flask_defer")) or name.endswith(".pth"):
            continue
        (folder / entry.name).symlink_to(entry)
    return folder


def fresh_venv(tmp_path: Path) -> tuple[Path, str, dict[str, str]]:
    """A virtualenv with pip, borrowing every dependency but flask_defer, and its env."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    borrowed = borrowed_without_flask_defer(tmp_path / "borrowed")
    (Path(site) / "borrowed_dependencies.pth").write_text(f"{borrowed}\n")
    env = {
        **os.environ,
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "VIRTUAL_ENV": str(venv),
        # Everything the wheel needs is borrowed: a line that reached for an index fails.
        "PIP_NO_INDEX": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    env.pop("PYTHONPATH", None)
    return python, site, env


def run_lines(lines: list[str], cwd: Path, env: dict[str, str]) -> None:
    for line in lines:
        ran = subprocess.run(
            ["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
        )
        assert ran.returncode == 0, f"{line}\n{ran.stdout}\n{ran.stderr}"


def assert_installed_in(python: Path, site: str, env: dict[str, str], tmp_path: Path) -> None:
    """flask-defer-jobs is in *site*, and the README quick start runs from it."""
    shown = subprocess.run(
        [str(python), "-m", "pip", "show", "-f", "flask-defer-jobs"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"Location: {site}" in shown, shown
    quickstart = tmp_path / "quickstart"
    quickstart.mkdir()
    result = run_quickstart(str(python), quickstart)
    assert result.returncode == 0, result.stderr
    assert "quickstart ok 1 409 404" in result.stdout


@pytest.mark.long
def test_the_readme_install_lines_install_the_built_wheel_into_a_fresh_virtualenv(
    wheel: Path, tmp_path: Path
) -> None:
    lines = readme_install_lines()
    assert len(lines) == 2 and all(line.startswith("pip install ") for line in lines), lines
    # The second line names the wheel's file in full: it must be the one the build writes.
    assert wheel.name in lines[1], f"the README names another wheel than {wheel.name}"
    python, site, env = fresh_venv(tmp_path)
    clone = tmp_path / "clone"
    (clone / "dist").mkdir(parents=True)
    shutil.copy(wheel, clone / "dist" / wheel.name)
    run_lines(lines, clone, env)
    assert_installed_in(python, site, env, tmp_path)


@pytest.mark.long
def test_the_readme_install_lines_install_from_a_clone_into_a_fresh_virtualenv(
    tmp_path: Path,
) -> None:
    lines = readme_install_lines("install-clone")
    assert lines[0].startswith("pip install .") and len(lines) == 2, lines
    python, site, env = fresh_venv(tmp_path)
    # The committed tree, as a clone has it (no .venv, no build output).
    clone = tmp_path / "clone"
    clone.mkdir()
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(clone)], input=archive.stdout, check=True)
    # Offline, pip cannot fetch hatchling into an isolated build environment; the
    # borrowed one builds instead (pip reads PIP_NO_BUILD_ISOLATION=0 as "off").
    run_lines(lines, clone, {**env, "PIP_NO_BUILD_ISOLATION": "0"})
    assert_installed_in(python, site, env, tmp_path)

