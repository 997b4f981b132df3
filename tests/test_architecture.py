"""The layering of docs/architecture.md: the import-linter contracts hold, and no two modules
import each other, even through a chain inside one package."""

from __future__ import annotations

import sys

import grimp
from importlinter.cli import lint_imports


def test_import_linter_contracts_hold() -> None:
    assert lint_imports(no_cache=True) == 0


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for module in sorted(graph.modules):
            if module not in index:
                visit(module)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_no_module_imports_itself_through_a_cycle() -> None:
    graph = grimp.build_graph("rlfleet", include_external_packages=False)
    # The root package re-exports the public API from every layer; it is the one module
    # allowed to sit above all of them, and nothing inside rlfleet imports it.
    graph.remove_module("rlfleet")
    assert _cycles(graph) == []


def test_no_module_imports_the_root_package() -> None:
    graph = grimp.build_graph("rlfleet", include_external_packages=False)
    assert graph.find_modules_that_directly_import("rlfleet") == set()
