"""Passing a new batch on to a running learner's training code.

For a job that takes a new batch while it runs (``elastic.rebatch_in_place``), the API's
answers to the learner's reports carry the batch it should use; the reporter hands each
change to ``BatchUpdates``, which writes it where ``ffdl.sdk.context()`` reads it
(``ffdl.sdk.batch_file``) and says so in the learner's log.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ffdl.learner.spec import LearnerSpec
from ffdl.sdk.batch_file import write_batch


class BatchUpdates:
    def __init__(self, spec: LearnerSpec, log: Callable[[str], None]) -> None:
        self._directory = Path(spec.env.get("JOB_STATE_DIR") or spec.state_dir)
        self._attempt = spec.attempt
        self._log = log

    def __call__(self, told: dict[str, Any]) -> None:
        try:
            write_batch(self._directory, self._attempt, told)
        except (OSError, ValueError) as exc:
            self._log(f"[ffdl] the new batch {told!r} could not be passed on: {exc}")
            return
        self._log(f"[ffdl] batch now {told['batch_size']}, taken at the training loop's next epoch")
