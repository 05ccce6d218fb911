"""The public SDK for training code: ``from ffdl.sdk.api import context, report, ...``.

This module owns the user-facing surface and nothing else; the behaviour lives in
:mod:`ffdl.sdk.context`, :mod:`ffdl.sdk.metrics`, :mod:`ffdl.sdk.checkpoint` and
:mod:`ffdl.sdk.control`. Everything here depends only on the standard library; torch is
imported lazily by the checkpoint functions when it is installed.
"""

from __future__ import annotations

from ffdl.sdk.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from ffdl.sdk.context import JobContext, context
from ffdl.sdk.control import install_stop_handler, should_stop
from ffdl.sdk.metrics import report, report_gradient_stats

__all__ = [
    "JobContext",
    "context",
    "install_stop_handler",
    "latest_checkpoint",
    "load_checkpoint",
    "report",
    "report_gradient_stats",
    "save_checkpoint",
    "should_stop",
]
