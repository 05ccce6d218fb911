"""Backends are a lower layer than the server: they get their configuration handed to them
and never import ``ffdl.server``; Ray is imported only by the Ray backend's own modules."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import ffdl.backends

BACKENDS = Path(ffdl.backends.__file__).parent
RAY_MODULES = {"ray_backend.py", "ray_driver.py", "ray_host.py"}


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The absolute module names an import statement in ``ffdl.backends`` loads."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level == 0:
        return [node.module or ""]
    # Relative to ffdl.backends: one dot is the package itself, two dots ffdl, ...
    base = ["ffdl", "backends"][: max(2 - (node.level - 1), 0)]
    return [".".join([*base, *([node.module] if node.module else [])])]


def _all_imports(tree: ast.Module) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            for name in _imported(node):
                yield node.lineno, name


def _top_level_imports(body: list[ast.stmt]) -> Iterator[tuple[int, str]]:
    """Imports run when the module is imported: at module level, also under ``if``/``try``
    (never inside a function or class body, which run later or on demand)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            for name in _imported(node):
                yield node.lineno, name
        elif isinstance(node, ast.If | ast.Try | ast.With):
            for block in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, block, []):
                    inner = child.body if isinstance(child, ast.ExceptHandler) else [child]
                    yield from _top_level_imports(inner)


def _modules() -> list[Path]:
    modules = sorted(BACKENDS.glob("*.py"))
    assert any(p.name == "local.py" for p in modules), BACKENDS
    return modules


def test_no_backend_imports_the_server() -> None:
    offenders = [
        f"{path.name}:{line} imports {name}"
        for path in _modules()
        for line, name in _all_imports(ast.parse(path.read_text(), str(path)))
        if name == "ffdl.server" or name.startswith("ffdl.server.")
    ]
    assert offenders == []


def test_only_the_ray_modules_import_ray_when_loaded() -> None:
    offenders = [
        f"{path.name}:{line} imports {name}"
        for path in _modules()
        if path.name not in RAY_MODULES
        for line, name in _top_level_imports(ast.parse(path.read_text(), str(path)).body)
        if name == "ray" or name.startswith("ray.")
    ]
    assert offenders == []


def test_the_checks_see_relative_and_nested_imports() -> None:
    tree = ast.parse(
        "from ..server import settings\n"
        "try:\n    import ray.util\nexcept ImportError:\n    pass\n"
        "def f():\n    import ray\n"
    )
    assert [name for _, name in _all_imports(tree)] == ["ffdl.server", "ray.util", "ray"]
    assert [name for _, name in _top_level_imports(tree.body)] == ["ffdl.server", "ray.util"]
