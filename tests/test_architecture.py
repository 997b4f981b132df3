"""The layering of docs/architecture.md: the import-linter contracts hold, and no two modules
import each other, even through a chain inside one package."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import grimp
from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[1]


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


def _layers_in(text: str) -> list[str]:
    block = text.split("<!-- layers:", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.strip().splitlines()]


def test_architecture_doc_lists_the_enforced_layers() -> None:
    # pyproject.toml's `layers = [...]` array, one quoted layer per line (tomllib is 3.11+).
    pyproject = (ROOT / "pyproject.toml").read_text()
    array = pyproject.split("[tool.importlinter]", 1)[1].split("layers = [", 1)[1].split("]", 1)[0]
    enforced = [line.strip().strip(",").strip('"') for line in array.strip().splitlines()]
    documented = _layers_in((ROOT / "docs" / "architecture.md").read_text())
    assert documented == enforced


def _function_level_rlfleet_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rlfleet"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.module}")
            elif isinstance(node, ast.Import) and any(
                alias.name.startswith("rlfleet") for alias in node.names
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_only_the_cli_imports_rlfleet_modules_inside_functions() -> None:
    # The CLI imports a command's modules when the command runs, so `rlfleet --help` stays
    # fast; anywhere else an import inside a function would only hide a dependency.
    package = ROOT / "rlfleet"
    found = [
        hit
        for path in sorted(package.rglob("*.py"))
        if "cli" not in path.relative_to(package).parts
        for hit in _function_level_rlfleet_imports(path)
    ]
    assert found == []


def test_every_trainer_runs_on_the_one_training_loop() -> None:
    # docs/architecture.md: "the loop every trainer runs on (train/loop.py)".
    import importlib
    import inspect
    import pkgutil

    import rlfleet
    from rlfleet.train.loop import TrainingLoop

    trainers = set()
    for info in pkgutil.walk_packages(rlfleet.__path__, "rlfleet."):
        if info.name.startswith("rlfleet.cli"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and name.endswith("Trainer")
                and value.__module__ == info.name
            ):
                trainers.add(value)
    assert {t.__name__ for t in trainers} >= {
        "Trainer", "OnPolicyTrainer", "OffPolicyTrainer", "DecentralizedTrainer",
        "DistributedTrainer",
    }  # fmt: skip
    assert [t.__name__ for t in trainers if not issubclass(t, TrainingLoop)] == []
