"""The package's shape: imports point one way (no circle, lazy imports included), storage code does not import the
package root, no module grows past 400 lines."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "charlm"


def _imports(path: Path) -> set[str]:
    """The charlm modules a file imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("charlm"):
            if node.module == "charlm":  # from charlm import x: x is a submodule, or something of the root
                found |= {f"charlm.{a.name}" if (PACKAGE / f"{a.name}.py").exists() else "charlm" for a in node.names}
            else:
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("charlm")}
    return found


def _graph() -> dict[str, set[str]]:
    return {
        f"charlm.{p.stem}": _imports(p) - {f"charlm.{p.stem}"} for p in PACKAGE.glob("*.py") if p.stem != "__init__"
    }


def test_no_import_circle_in_the_package():
    graph = _graph()
    state: dict[str, str] = {}

    def visit(module: str, trail: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                raise AssertionError("import circle: " + " -> ".join(trail[trail.index(target) :] + [target]))
            if target in graph and target not in state:
                visit(target, trail + [target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_storage_code_does_not_import_the_package_root():
    for name in ("checkpoint", "export", "files", "prepare", "loading", "download", "tokenizer", "config"):
        assert "charlm" not in _graph()[f"charlm.{name}"], name


def test_no_module_is_over_400_lines():
    long = {p.name: n for p in PACKAGE.glob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long
