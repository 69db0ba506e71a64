"""Screenshots: ``make test`` writes none under docs/, ``make screenshots`` publishes them."""

from __future__ import annotations

import hashlib
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ..screenshots import DOCS_SCREENSHOTS, MARKER, OPTION, publish

ROOT = Path(__file__).resolve().parent.parent.parent
TESTS = ROOT / "tests"


def recipe(target: str) -> str:
    """The commands of a Makefile target, one string."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    match = re.search(rf"^{target}:[^\n]*\n((?:\t[^\n]*\n)+)", makefile, re.M)
    assert match, f"the Makefile has no {target} target"
    return match.group(1)


def test_a_shot_is_published_only_when_asked(tmp_path: Path) -> None:
    shot = tmp_path / "results" / "demo.png"
    shot.parent.mkdir()
    shot.write_bytes(b"\x89PNG not really")
    docs = tmp_path / "docs"
    assert publish(shot, "demo.png", None) is None
    assert not docs.exists()
    assert publish(shot, "demo.png", docs) == docs / "demo.png"
    assert (docs / "demo.png").read_bytes() == shot.read_bytes()


def test_publishing_a_shot_that_was_never_taken_fails(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="no screenshot"):
        publish(tmp_path / "missing.png", "missing.png", None)


def test_make_test_never_publishes_and_make_screenshots_does() -> None:
    assert OPTION not in recipe("test")
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert OPTION not in pyproject  # not smuggled in through addopts either
    screenshots = recipe("screenshots")
    assert OPTION in screenshots and f"-m {MARKER}" in screenshots


def test_no_test_writes_under_docs_but_through_the_publishing_fixture() -> None:
    """A path to docs/screenshots built anywhere else would bypass --docs-screenshots.

    (Reading docs/*.md, as the README and translation tests do, is fine.)
    """
    # The publisher, its fixture (conftest), and the README test that checks image links.
    allowed = {"screenshots.py", "conftest.py", "test_screenshots.py", "test_readme.py"}
    offenders = []
    for module in sorted(TESTS.rglob("*.py")):
        if module.name in allowed:
            continue
        text = module.read_text(encoding="utf-8")
        if re.search(r"""["']screenshots["']|docs/screenshots|DOCS_SCREENSHOTS""", text):
            offenders.append(str(module.relative_to(ROOT)))
    assert not offenders, f"these test modules build paths into docs/screenshots: {offenders}"


def test_every_test_that_publishes_carries_the_marker() -> None:
    """make screenshots selects by the marker: a publishing test without it is never rerun."""
    unmarked = []
    for module in sorted(TESTS.glob("test_browser_*.py")):
        source = module.read_text(encoding="utf-8")
        for match in re.finditer(r"^def (test_\w+)\((.*?)\) -> None:", source, re.M | re.S):
            name, params = match.groups()
            # The decorators: the lines between the previous blank line and the def.
            decorators = source[source.rfind("\n\n", 0, match.start()) : match.start()]
            if "docs_screenshot" in params and f"mark.{MARKER}" not in decorators:
                unmarked.append(f"{module.name}::{name}")
    assert not unmarked, f"publishing tests without @pytest.mark.{MARKER}: {unmarked}"


def tree_digest(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.mark.slow
@pytest.mark.browser
def test_the_demo_screenshot_test_run_as_make_test_runs_it_leaves_docs_untouched(
    tmp_path: Path,
) -> None:
    before = tree_digest(ROOT / "docs")
    # make test's own command line (PYTEST_ARGS empty), in one process, on one test:
    # its main run, the line of the recipe that starts the parallel pytest.
    (line,) = [line for line in recipe("test").splitlines() if "-m pytest -n" in line]
    command = shlex.split(line.split(";")[0].strip())
    while command and command[0].startswith("$("):
        command.pop(0)  # the environment the recipe sets for it (KEEP_BYTECODE)
    assert command[:3] == [".venv/bin/python", "-m", "pytest"], command
    arguments = command[3:]
    for flag in ("-n", "--dist"):  # one process is enough for one test
        if flag in arguments:
            index = arguments.index(flag)
            del arguments[index : index + 2]
    arguments = [a for a in arguments if not a.startswith("$(")]
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *arguments,
            "-p",
            "no:cacheprovider",
            "-q",
            "--output",
            str(tmp_path / "output"),  # not the outer run's test-results/
            "tests/browser/test_browser_demo.py::test_screenshot_of_the_demo",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "1 passed" in ran.stdout
    assert tree_digest(ROOT / "docs") == before
    assert DOCS_SCREENSHOTS.is_relative_to(ROOT / "docs")
