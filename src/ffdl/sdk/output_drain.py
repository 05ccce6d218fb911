"""Waiting until whoever reads this process's stdout and stderr pipes has read them.

Under the platform a learner's output goes through pipes to its controller, which records
each line as it reads it (``ffdl.learner.output``). A line still in a pipe when the
controller dies dies with the pipe. A checkpoint saved after such a line would then let the
restarted job resume past a line nobody received, so ``save_checkpoint`` calls
:func:`wait_until_output_is_read` before the checkpoint becomes visible.

Only pipes are waited on (a terminal, file or socket is left alone), and never longer than
the deadline: a reader that stopped reading delays a save, it does not block training.
Linux and standard library only.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import os
import stat
import sys
import termios
import time
from typing import IO

OUTPUT_READ_WAIT_S = 5.0
_POLL_S = 0.002


def _unread_bytes(fd: int) -> int:
    """Bytes written to the pipe ``fd`` and not yet read from it; 0 if ``fd`` is no pipe."""
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return 0
        count = array.array("i", [0])
        # Linux answers FIONREAD on either end of a pipe with what the pipe holds.
        fcntl.ioctl(fd, termios.FIONREAD, count, True)
    except OSError:
        return 0
    return count[0]


def _flush(stream: IO[str] | None) -> None:
    if stream is not None:
        with contextlib.suppress(OSError, ValueError):
            stream.flush()


def wait_until_output_is_read(timeout_s: float = OUTPUT_READ_WAIT_S) -> bool:
    """Flush ``sys.stdout`` and ``sys.stderr``, then wait until their pipes are empty.

    True when nothing printed so far is left unread (or there is no pipe), False when the
    deadline passed first.
    """
    _flush(sys.stdout)
    _flush(sys.stderr)
    deadline = time.monotonic() + timeout_s
    pause = _POLL_S
    while any(_unread_bytes(fd) for fd in (1, 2)):
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    return True
