"""Heavy packages that tests import where they use them, not at a test module's top.

A test module's top-level imports run in every pytest process the suite starts, whichever
tests it goes on to run: for torch that is several seconds each time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def summary_writer(log_dir: Path, **options: Any) -> Any:
    """torch's TensorBoard ``SummaryWriter`` for ``log_dir``."""
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(log_dir), **options)
