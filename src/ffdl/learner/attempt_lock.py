"""The one-controller-per-attempt lock: a controller holds ``controller.lock`` in its attempt's
state directory for its whole life, so a second controller started for the same attempt
(its launcher killed before it recorded the first one's pid) sees it taken and leaves the
attempt alone. The kernel drops the lock when its holder dies, however it dies.
"""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import TextIO

CONTROLLER_LOCK = "controller.lock"
# The exit of a controller started for an attempt another controller already runs.
ALREADY_RUNNING_EXIT = 75


def claim_attempt(state_dir: Path) -> TextIO | None:
    """The held lock file of the attempt in ``state_dir`` (keep it open), or None if
    another process holds it."""
    handle = open(state_dir / CONTROLLER_LOCK, "a")  # noqa: SIM115 - held by the caller
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle
