"""Where the blueprint's templates and static files are, installed or in a checkout.

The repository keeps ``templates/`` and ``static/`` at its top level, beside the
package; the wheel carries them inside it as ``flask_defer/templates`` and
``flask_defer/static`` (``force-include`` in ``pyproject.toml``). The copy inside the
package wins, because that is the one an installed wheel has; an editable install or a
plain checkout has no such copy and falls back to the top-level folders.
"""

from __future__ import annotations

from pathlib import Path

#: The ``flask_defer`` package's folder (this module lives in its ``web/``).
PACKAGE_DIR = Path(__file__).resolve().parent.parent


def resource_dir(name: str, package_dir: Path = PACKAGE_DIR) -> Path:
    """The folder *name* (``"templates"`` or ``"static"``) for this installation.

    Raises ``RuntimeError`` naming both places looked at when neither exists, since a
    blueprint without its templates would only fail later, on the first request.
    """
    candidates = (package_dir / name, package_dir.parent / name)
    for candidate in candidates:
        if (candidate / "defer").is_dir():
            return candidate
    looked = " and ".join(str(c) for c in candidates)
    raise RuntimeError(
        f"flask_defer cannot find its {name} folder (looked in {looked}); "
        "reinstall the package, or run from a complete source checkout"
    )


def templates_dir() -> Path:
    """The folder holding ``defer/*.html``."""
    return resource_dir("templates")


def static_dir() -> Path:
    """The folder holding ``defer/defer.css``, ``defer/defer.js`` and the vendored htmx."""
    return resource_dir("static")
