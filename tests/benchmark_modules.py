"""Loading a benchmark script as a module, for the short versions of long runs in tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(script: str) -> ModuleType:
    """``benchmarks/SCRIPT`` as a module (its own helpers, ``_server``, importable)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    name = f"ffdl_benchmark_{Path(script).stem}"
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module
