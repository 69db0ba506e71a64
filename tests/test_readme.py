"""The README's quick start, pasted into a new file, works as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

from flask_defer.config import DEFAULTS

README = Path(__file__).resolve().parent.parent / "README.md"


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


def test_readme_links_and_images_point_at_files_that_exist() -> None:
    text = README.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(((?!https?://|#)[^)\s]+)\)", text)
    assert "docs/screenshots/toast.png" in targets and "docs/screenshots/demo.png" in targets
    # docs/dashboard.md arrives with the dashboard.
    missing = [t for t in targets if not (README.parent / t).exists() and t != "docs/dashboard.md"]
    assert not missing, f"README links to missing files: {missing}"


def test_readme_recurring_section_says_a_tick_job_is_at_least_once() -> None:
    """Issue 28: exactly one job per tick, but a worker killed mid-run re-runs it."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Recurring jobs\n", 1)[1].split("\n## ", 1)[0]
    flat = " ".join(section.split())
    assert "Exactly one *job* per tick; the job itself runs **at least once**" in flat
    assert "a slow handler cut off this way starts twice for one tick" in flat
