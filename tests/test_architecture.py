"""The dependency direction of DESIGN §3, as the import-linter contracts enforce it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo"],
        cwd=cwd,
        env={"PYTHONPATH": str(cwd), "PATH": str(LINT_IMPORTS.parent)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_make_lint_runs_the_import_contracts() -> None:
    recipe = (ROOT / "Makefile").read_text().split("\nlint:", 1)[1].split("\n\n", 1)[0]
    assert "lint-imports" in recipe


def test_the_package_keeps_every_import_contract() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 kept, 0 broken" in result.stdout


def test_an_upward_import_breaks_the_layers_contract(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "flask_defer", tmp_path / "flask_defer")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    tuning = tmp_path / "flask_defer" / "store" / "tuning.py"
    tuning.write_text(tuning.read_text() + "\nfrom ..state import DeferState  # upward\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "flask_defer.store is not allowed to import flask_defer.state" in result.stdout


def test_flask_in_the_engine_breaks_the_forbidden_contract(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "flask_defer", tmp_path / "flask_defer")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    runner = tmp_path / "flask_defer" / "runner.py"
    runner.write_text(runner.read_text() + "\nimport flask  # not in the engine\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "flask_defer.runner is not allowed to import flask" in result.stdout
