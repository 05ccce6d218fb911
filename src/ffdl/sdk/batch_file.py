"""The batch a running learner is told to take now: ``$JOB_STATE_DIR/batch.json``.

A job whose manifest says ``elastic.rebatch_in_place: true`` may have its global batch
changed while it runs. The API puts the new batch in its answers to the learner's reports;
the learner's controller writes it here (``write_batch``, atomically, with the attempt it
belongs to) and :func:`ffdl.sdk.context` reads it (``read_batch``) over the values the
learner started with, so training code that calls ``context()`` at each epoch picks it up.
A file left by an earlier attempt of the job is ignored: each attempt starts from its own
environment (``FFDL_ATTEMPT``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

BATCH_FILE_NAME = "batch.json"
_FIELDS = ("batch_size", "micro_batch_size", "accumulation_steps")


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def valid_batch(told: Mapping[str, Any]) -> bool:
    """Whether ``told`` is a batch as the API sends it: a batch size and accumulation steps
    of at least 1, and a micro-batch of at least 1 or none."""
    micro = told.get("micro_batch_size")
    return (
        _positive(told.get("batch_size"))
        and _positive(told.get("accumulation_steps"))
        and (micro is None or _positive(micro))
    )


def write_batch(directory: Path, attempt: int, told: Mapping[str, Any]) -> None:
    """Replace the batch file in ``directory`` with ``told`` for ``attempt``; a reader sees
    the old file or the new one, never a part of either."""
    if not valid_batch(told):
        raise ValueError(f"not a batch: {dict(told)!r}")
    directory.mkdir(parents=True, exist_ok=True)
    record = {"attempt": attempt, **{name: told.get(name) for name in _FIELDS}}
    partial = directory / f".{BATCH_FILE_NAME}.{os.getpid()}"
    partial.write_text(json.dumps(record), encoding="utf-8")
    os.replace(partial, directory / BATCH_FILE_NAME)


def read_batch(directory: Path, attempt: int | None) -> dict[str, Any] | None:
    """The batch written for ``attempt`` in ``directory``; None when there is none, it
    belongs to another attempt, or it cannot be read."""
    if attempt is None:
        return None
    try:
        record = json.loads((directory / BATCH_FILE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("attempt") != attempt:
        return None
    return record if valid_batch(record) else None
