"""The simulator's modules import one another without a circle (type-only imports count):
the engine calls policies through ``ffdl.sim.state.Policy`` and never imports them."""

from __future__ import annotations

import ast
from pathlib import Path

import ffdl.sim

SIM = Path(ffdl.sim.__file__).parent


def _imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in SIM.glob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ffdl.sim."):
                found.add(str(node.module).split(".")[2])
        graph[path.stem] = found
    return graph


def test_the_engine_never_imports_the_policies_or_the_snapshots() -> None:
    assert not _imports()["engine"] & {"policies", "snapshots", "experiments"}


def test_the_simulator_modules_import_each_other_without_a_circle() -> None:
    graph = _imports()
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, " -> ".join((*path, module))
        if module in done:
            return
        for dependency in graph.get(module, set()):
            visit(dependency, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())
