"""Optional packages that tests use without importing them while the suite is collected.

An import at a test module's top (``pytest.importorskip`` too) runs in every pytest process
the suite starts, whichever tests it goes on to run: for torch or scikit-learn that is
several seconds each time. So skip marks are decided without importing the package, and
what a test needs from one is imported when it is first used.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest


def requires(*packages: str) -> pytest.MarkDecorator:
    """Skip unless every one of ``packages`` (top-level names) is installed."""
    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    return pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)}")


def summary_writer(log_dir: Path, **options: Any) -> Any:
    """torch's TensorBoard ``SummaryWriter`` for ``log_dir``."""
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(log_dir), **options)
