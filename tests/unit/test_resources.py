"""Finding the blueprint's templates and static files, installed or in a checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

from flask_defer.web.resources import resource_dir, static_dir, templates_dir


def test_a_source_checkout_uses_the_top_level_folders(tmp_path: Path) -> None:
    package = tmp_path / "flask_defer"
    package.mkdir()
    (tmp_path / "templates" / "defer").mkdir(parents=True)
    assert resource_dir("templates", package) == tmp_path / "templates"


def test_an_installed_wheel_uses_the_folders_inside_the_package(tmp_path: Path) -> None:
    package = tmp_path / "site-packages" / "flask_defer"
    (package / "static" / "defer").mkdir(parents=True)
    # A stray top-level folder next to site-packages must not win.
    (tmp_path / "site-packages" / "static" / "defer").mkdir(parents=True)
    assert resource_dir("static", package) == package / "static"


def test_a_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="cannot find its templates folder"):
        resource_dir("templates", tmp_path / "flask_defer")


def test_this_checkout_has_the_blueprints_files() -> None:
    assert (templates_dir() / "defer" / "toasts.html").is_file()
    assert (static_dir() / "defer" / "defer.js").is_file()
    assert sorted(p.name for p in (static_dir() / "defer").glob("htmx*")) == [
        "htmx-2.0.11.min.js",
        "htmx.LICENSE",
    ]
