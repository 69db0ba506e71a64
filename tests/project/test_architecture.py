"""The shape of DESIGN §3: the import-linter contracts, module and function sizes."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

#: One module, one idea: a longer one says in its docstring why it is one piece
#: ("... over 400 lines because ..."), so it is never cut in two only for length.
MAX_MODULE_LINES = 400
MODULE_REASON = re.compile(r"over 400 lines because", re.IGNORECASE)
MAX_FUNCTION_LINES = 60
#: The comment a longer function carries, inside it, saying why it is one piece.
LONG_REASON = re.compile(r"#\s*long (because|on purpose):", re.IGNORECASE)
#: Shipped revisions are frozen steps (DDL scripts), never edited, not even for a comment.
FROZEN = ("migrations/versions/",)


def modules(package: Path) -> list[Path]:
    return sorted(
        path
        for path in package.rglob("*.py")
        if not any(part in path.relative_to(package).as_posix() for part in FROZEN)
    )


def oversized_modules(package: Path) -> list[str]:
    """Modules over the line limit whose docstring does not say why, as ``path: lines``."""
    found = []
    for path in modules(package):
        source = path.read_text()
        lines = len(source.splitlines())
        docstring = ast.get_docstring(ast.parse(source)) or ""
        if lines > MAX_MODULE_LINES and not MODULE_REASON.search(" ".join(docstring.split())):
            name = path.relative_to(package).as_posix()
            found.append(f"{name}: {lines} lines, and its docstring does not say why")
    return found


def long_functions_without_a_reason(package: Path) -> list[str]:
    """Functions over MAX_FUNCTION_LINES whose body has no ``# long because:`` comment."""
    found = []
    for path in modules(package):
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            end = node.end_lineno or node.lineno
            length = end - node.lineno + 1
            body = lines[node.lineno - 1 : end]
            if length > MAX_FUNCTION_LINES and not any(map(LONG_REASON.search, body)):
                name = path.relative_to(package).as_posix()
                found.append(f"{name}:{node.lineno} {node.name}() is {length} lines")
    return found


def test_a_module_over_400_lines_says_why_in_its_docstring() -> None:
    assert oversized_modules(ROOT / "flask_defer") == []


def test_no_function_is_over_60_lines_without_a_comment_saying_why() -> None:
    assert long_functions_without_a_reason(ROOT / "flask_defer") == []


def test_the_size_checks_report_a_long_module_and_an_unexplained_long_function(
    tmp_path: Path,
) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    explained = f"def explained():\n    # Long because: one table, one place.\n{body}"
    (package / "long.py").write_text(f"def unexplained():\n{body}\n\n{explained}")
    reason = '"""One idea. Over 400 lines because: one table of statements."""\n'
    (package / "explained.py").write_text(reason + "x = 1\n" * MAX_MODULE_LINES)
    (package / "big.py").write_text('"""Big."""\n' + "x = 1\n" * MAX_MODULE_LINES)
    (package / "migrations" / "versions").mkdir(parents=True)
    (package / "migrations" / "versions" / "0001.py").write_text(
        f"def upgrade():\n{body}" + "x = 1\n" * MAX_MODULE_LINES
    )
    assert long_functions_without_a_reason(package) == [
        f"long.py:1 unexplained() is {MAX_FUNCTION_LINES + 1} lines"
    ]
    # The module that says why passes; the frozen revision is not looked at.
    assert oversized_modules(package) == [
        f"big.py: {MAX_MODULE_LINES + 1} lines, and its docstring does not say why"
    ]


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
    assert "4 kept, 0 broken" in result.stdout


def test_an_upward_import_breaks_the_layers_contract(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "flask_defer", tmp_path / "flask_defer")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    versioning = tmp_path / "flask_defer" / "store" / "versioning.py"
    upward = "\nfrom ..operations.state import DeferState  # upward\n"
    versioning.write_text(versioning.read_text() + upward)
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "flask_defer.store is not allowed to import flask_defer.operations" in result.stdout


def test_flask_in_the_engine_breaks_the_forbidden_contract(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "flask_defer", tmp_path / "flask_defer")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    runner = tmp_path / "flask_defer" / "engine" / "runner.py"
    runner.write_text(runner.read_text() + "\nimport flask  # not in the engine\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "flask_defer.engine.runner -> flask" in result.stdout


def import_circles(package: str, path: Path) -> list[list[str]]:
    """Groups of modules of *package* that import each other, directly or through
    others (strongly connected components of the import graph, TYPE_CHECKING too)."""
    import grimp

    sys.path.insert(0, str(path))
    try:
        graph = grimp.build_graph(package, cache_dir=None)
    finally:
        sys.path.remove(str(path))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(start: str) -> None:  # iterative Tarjan
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        while work:
            module, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append(
                        (target, iter(sorted(graph.find_modules_directly_imported_by(target))))
                    )
                elif target in on_stack:
                    low[module] = min(low[module], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == module:
                        break
                if len(group) > 1:
                    circles.append(sorted(group))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return circles


def test_no_module_of_the_package_imports_itself_through_others() -> None:
    assert import_circles("flask_defer", ROOT) == []


def test_the_circle_check_finds_a_circle_even_under_type_checking(tmp_path: Path) -> None:
    package = tmp_path / "circled"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n"
    )
    (package / "c.py").write_text("from . import a\n")
    assert import_circles("circled", tmp_path) == [["circled.a", "circled.b"]]
