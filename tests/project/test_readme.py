"""The README and the reference pages in docs/: examples that run, tables that match the code.

The quick start, pasted into a new file, works as written; the configuration table,
the history table and the command line page are checked against the code that they
describe; every link and anchor points at something that exists.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click
import pytest

from flask_defer import Defer
from flask_defer.cli import defer_cli
from flask_defer.config import DEFAULTS
from flask_defer.jobs import Job, JobStatus
from flask_defer.undo import ToastState, state_text
from flask_defer.web.formatting import EVENTS

ROOT = Path(__file__).resolve().parent.parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
#: Every page of the documentation: the README and the reference pages it links.
PAGES = [README, *sorted(DOCS.glob("*.md"))]


def quickstart_source() -> str:
    text = README.read_text(encoding="utf-8")
    match = re.search(r"<!-- quickstart:[^>]*-->\s*```python\n(.*?)```", text, re.S)
    assert match, "README.md lost its quick start block"
    return match.group(1)


#: Drives the quick start's app as a client would: send, undo, the 409 and the 404.
QUICKSTART_DRIVER = textwrap.dedent(
    """
    from datetime import UTC, datetime, timedelta
    from app import app, defer

    client = app.test_client()
    first = client.post("/messages/7/send")
    assert first.status_code == 200, first.status_code
    assert client.post("/messages/7/undo").get_json() == {"undone": True}
    assert client.post("/messages/7/undo").get_json() == {"undone": False}
    client.post("/messages/8/send")
    again = client.post("/messages/8/send")  # the same message, still waiting: JobExists
    assert again.status_code == 409, again.status_code
    assert "already" in again.get_json()["error"]
    unknown = client.post("/messages/99/undo")  # never scheduled: JobNotFound
    assert unknown.status_code == 404, unknown.status_code
    with app.app_context():
        assert defer.run_due().ran == 0
        later = datetime.now(UTC) + timedelta(seconds=11)
        assert defer.run_due(now=later).done == 1
        defer.store.engine.dispose()
    print("quickstart ok", first.get_json()["job"], again.status_code, unknown.status_code)
    """
)


def run_quickstart(python: str, folder: Path) -> subprocess.CompletedProcess[str]:
    """Save the README's block as ``app.py`` in *folder* and drive it with *python*."""
    (folder / "app.py").write_text(quickstart_source(), encoding="utf-8")
    (folder / "drive.py").write_text(QUICKSTART_DRIVER, encoding="utf-8")
    return subprocess.run(
        [python, "drive.py"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONWARNINGS": "error"},
    )


def test_readme_quickstart_answers_409_for_a_second_send_and_404_for_an_unknown_undo(
    tmp_path: Path,
) -> None:
    result = run_quickstart(sys.executable, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "sending message 8" in result.stdout
    assert "quickstart ok 1 409 404" in result.stdout


def test_readme_quickstart_sets_a_secret_key() -> None:
    assert 'app.config["SECRET_KEY"]' in quickstart_source()


def configuration_table() -> dict[str, str]:
    """The README's configuration table: key → its default as written."""
    text = README.read_text(encoding="utf-8")
    assert "\n## Configuration\n" in text, "README.md lost its Configuration section"
    section = text.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(DEFER_[A-Z0-9_]+)` \| ([^|]+) \|", section, re.M)
    return {key: default.strip() for key, default in rows}


def written_default(value: object) -> str:
    """How the table writes a default: `2 s`, `10 min`, `1 h`, `7 days`, `None` ..."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
        if seconds and seconds % 86400 == 0:
            days = seconds / 86400
            text = f"{days:g} day" if days == 1 else f"{days:g} days"
        elif seconds and seconds % 3600 == 0:
            text = f"{seconds / 3600:g} h"
        elif seconds >= 60 and seconds % 60 == 0:
            text = f"{seconds / 60:g} min"
        else:
            text = f"{seconds:g} s"
    elif isinstance(value, str):
        text = f'"{value}"'
    else:
        text = repr(value)
    return f"`{text}`"


def test_readme_documents_every_setting() -> None:
    documented = configuration_table()
    missing = sorted(set(DEFAULTS) - set(documented))
    assert not missing, f"the README's configuration table lacks {missing}"
    unknown = sorted(set(documented) - set(DEFAULTS))
    assert not unknown, f"the README documents settings that do not exist: {unknown}"
    wrong = {
        key: (documented[key], written_default(value))
        for key, value in DEFAULTS.items()
        if documented[key] != written_default(value)
    }
    assert not wrong, f"defaults in the README differ from config.DEFAULTS: {wrong}"


def slug(heading: str) -> str:
    """The anchor a Markdown renderer gives *heading* (GitHub's rule)."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return re.findall(r"\]\(((?!https?://)[^)\s]+)\)", text)


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_links_images_and_anchors_point_at_what_exists(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(target)
    assert not broken, f"{page.name} links to what does not exist: {broken}"


def test_readme_shows_the_demo_screenshot() -> None:
    assert "docs/screenshots/demo.png" in links(README)


def test_the_readme_has_a_contents_list_of_its_sections_and_every_docs_page() -> None:
    text = README.read_text(encoding="utf-8")
    assert "\n## Contents\n" in text, "README.md has no contents list"
    contents = text.split("\n## Contents\n", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"\]\(([^)\s]+)\)", contents))
    sections = [h for h in re.findall(r"^## (.+)$", text, re.M) if h != "Contents"]
    missing = [h for h in sections if f"#{slug(h)}" not in listed]
    assert not missing, f"the contents list lacks the README's sections {missing}"
    pages = [f"docs/{p.name}" for p in sorted(DOCS.glob("*.md"))]
    unlisted = [p for p in pages if not any(t.split("#")[0] == p for t in listed)]
    assert not unlisted, f"the contents list lacks the docs pages {unlisted}"


def test_the_readme_is_a_few_screens_and_the_reference_lives_in_docs() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines < 400, f"README.md has {lines} lines; move reference text to docs/"


def prose(page: Path) -> str:
    """*page* without code blocks and tables, its lines joined: the text people read."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    text = "\n".join(line for line in text.splitlines() if not line.startswith("|"))
    return re.sub(r"\s+", " ", text)


#: The pages people write (docs/benchmarks.md is generated by ``make bench``).
WRITTEN = [p for p in PAGES if p.name != "benchmarks.md"]


@pytest.mark.parametrize("page", WRITTEN, ids=[p.name for p in WRITTEN])
def test_no_page_says_the_same_thing_twice(page: Path) -> None:
    """A run of 14 words that appears twice is a paragraph pasted twice, then edited."""
    words = prose(page).split()
    seen: dict[tuple[str, ...], int] = {}
    repeated = []
    for i in range(len(words) - 14):
        run = tuple(words[i : i + 14])
        if run in seen and seen[run] + 14 <= i:
            repeated.append(" ".join(run))
        seen.setdefault(run, i)
    assert not repeated, f"{page.name} repeats itself: {repeated[:3]}"


def test_the_api_reference_names_the_label_an_unlabelled_toast_really_shows() -> None:
    # The reference is generated from this docstring (docs/reference.md).
    doc = " ".join((Defer.undoable.__doc__ or "").split())
    match = re.search(r'without one the toast says "([^"]+)"', doc)
    assert match, "defer.undoable's docstring lost the default label of its toast"
    now = datetime.now(UTC)
    unlabelled = Job(
        id=1,
        name="send_email",
        payload=None,
        status=JobStatus.PENDING,
        run_at=now,
        due_at=now,
        attempts=0,
        max_attempts=5,
        queue="default",
    )
    assert match.group(1) == state_text(unlabelled, ToastState.OPEN)


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_examples_never_label_a_pending_job_with_its_outcome(page: Path) -> None:
    """The label shows while the job waits: "Message sent" would say what has not happened."""
    text = page.read_text(encoding="utf-8")
    assert 'label="Message sent"' not in text
    assert "Message sent · Undo" not in text


def test_the_history_page_has_a_row_for_every_event_the_code_writes() -> None:
    text = (DOCS / "history.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([a-z_]+)` \| [^|]+ \| [^|]+ \|", text, re.M)
    assert sorted(rows) == sorted(EVENTS), "docs/history.md's table differs from the events"


def commands(group: click.Group, prefix: str = "") -> list[tuple[str, click.Command]]:
    found: list[tuple[str, click.Command]] = []
    for name, command in sorted(group.commands.items()):
        found.append((prefix + name, command))
        if isinstance(command, click.Group):
            found += commands(command, f"{prefix}{name} ")
    return found


def test_the_command_line_page_documents_every_command_and_flag() -> None:
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    missing = []
    for name, command in commands(defer_cli):
        if f"flask defer {name}" not in text:
            missing.append(name)
        for param in command.params:
            for flag in param.opts if isinstance(param, click.Option) else ():
                if flag != "--help" and not re.search(rf"`[^`]*{re.escape(flag)}\b", text):
                    missing.append(f"{name} {flag}")
    assert not missing, f"docs/cli.md does not document {missing}"


def test_the_recurring_section_says_a_tick_job_is_at_least_once() -> None:
    """Issue 28: exactly one job per tick, but a worker killed mid-run re-runs it."""
    page = next(p for p in PAGES if "\n## Recurring jobs\n" in p.read_text(encoding="utf-8"))
    text = page.read_text(encoding="utf-8")
    section = text.split("\n## Recurring jobs\n", 1)[1].split("\n## ", 1)[0]
    flat = " ".join(section.split())
    assert "Exactly one *job* per tick; the job itself runs **at least once**" in flat
    assert "a slow handler cut off this way starts twice for one tick" in flat
