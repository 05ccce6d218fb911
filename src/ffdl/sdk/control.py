"""Cooperative halting: letting training code notice that the platform wants it to stop.

The platform halts a learner by sending SIGTERM and, after a grace period, SIGKILL; it may
also ask by creating the file ``$JOB_STATE_DIR/halt``. Training code polls
:func:`should_stop` (e.g. once per epoch or step), saves a checkpoint and exits 0 within the
grace period. This module owns the SIGTERM handler that records the request.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from ffdl.sdk.context import job_directory

HALT_FILE_NAME = "halt"

_stop_requested = threading.Event()
_install_lock = threading.Lock()
_handler_installed = False
_previous_handler: Callable[[int, FrameType | None], Any] | int | None = None


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _stop_requested.set()
    # Chain a Python-level handler someone else installed (a framework, a test harness).
    # SIG_DFL and SIG_IGN are ints, so they are never called: calling the default action
    # would kill the process, which is exactly what this handler exists to prevent.
    previous = _previous_handler
    if callable(previous):
        previous(signum, frame)


def install_stop_handler() -> None:
    """Install the SIGTERM handler behind :func:`should_stop`; later calls do nothing.

    Signal handlers can only be installed from the main thread; called from another thread
    this returns without installing, and the halt file remains the only stop signal until
    a main-thread call installs it.
    """
    global _handler_installed, _previous_handler
    if threading.current_thread() is not threading.main_thread():
        return
    with _install_lock:
        if _handler_installed:
            return
        _previous_handler = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, _on_sigterm)
        _handler_installed = True


def should_stop() -> bool:
    """True once SIGTERM was received, or while ``$JOB_STATE_DIR/halt`` exists."""
    install_stop_handler()
    if _stop_requested.is_set():
        return True
    return (job_directory("JOB_STATE_DIR") / HALT_FILE_NAME).exists()
