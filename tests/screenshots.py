"""The screenshots the documentation shows: taken by browser tests, published on request.

Every browser test saves its screenshots in ``test-results/`` (ignored by git). The few
that the README and docs/ show are also copied to ``docs/screenshots/``, but only when
pytest runs with ``--docs-screenshots``, which ``make screenshots`` passes and
``make test`` does not: a test run never rewrites committed files.
"""

from __future__ import annotations

import shutil
from pathlib import Path

#: Where the committed screenshots live.
DOCS_SCREENSHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"

#: The pytest option that publishes them (``make screenshots``).
OPTION = "--docs-screenshots"

#: The marker of every test that takes a published screenshot (``pytest -m``).
MARKER = "docs_screenshot"


def publish(shot: Path, name: str, docs: Path | None) -> Path | None:
    """Copy *shot* to ``docs / name`` when publishing (*docs* given); else write nothing.

    Returns the published path, or None when this run does not publish.
    """
    if not shot.is_file() or shot.stat().st_size == 0:
        raise AssertionError(f"no screenshot at {shot} to publish as {name}")
    if docs is None:
        return None
    docs.mkdir(parents=True, exist_ok=True)
    target = docs / name
    shutil.copyfile(shot, target)
    return target
