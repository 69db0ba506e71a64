"""The axe-core fixture finds real violations (so a clean result means something)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.browser


def test_axe_reports_an_unlabelled_button_and_passes_a_labelled_one(
    new_browser_context: Callable[..., Any],
    axe_violations: Callable[[Any], list[dict[str, Any]]],
) -> None:
    page = new_browser_context().new_page()
    page.set_content("<html lang='en'><title>t</title><main><button></button></main></html>")
    assert "button-name" in {v["id"] for v in axe_violations(page)}
    page.set_content("<html lang='en'><title>t</title><main><button>Undo</button></main></html>")
    assert axe_violations(page) == []
