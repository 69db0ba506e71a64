"""The README's quick start, pasted into a new file, works as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def quickstart_source() -> str:
    text = README.read_text(encoding="utf-8")
    match = re.search(r"<!-- quickstart:[^>]*-->\s*```python\n(.*?)```", text, re.S)
    assert match, "README.md lost its quick start block"
    return match.group(1)


def test_readme_quickstart_runs_as_written(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(quickstart_source(), encoding="utf-8")
    driver = textwrap.dedent(
        """
        from datetime import UTC, datetime, timedelta
        from app import app, defer

        client = app.test_client()
        first = client.post("/messages/7/send").get_json()
        assert client.post("/messages/7/undo").get_json() == {"undone": True}
        assert client.post("/messages/7/undo").get_json() == {"undone": False}
        client.post("/messages/8/send")
        with app.app_context():
            assert defer.run_due().ran == 0
            later = datetime.now(UTC) + timedelta(seconds=11)
            assert defer.run_due(now=later).done == 1
            defer.store.engine.dispose()
        print("quickstart ok", first["job"])
        """
    )
    (tmp_path / "drive.py").write_text(driver, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "drive.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONWARNINGS": "error"},
    )
    assert result.returncode == 0, result.stderr
    assert "sending message 8" in result.stdout
    assert "quickstart ok 1" in result.stdout
