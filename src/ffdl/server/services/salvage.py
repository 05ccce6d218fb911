"""Recovering the output a lost controller had read but not delivered.

A controller writes every output line of its command to a private record in its state
directory (``ffdl.learner.output.OutputRecord``) in the order it queues the lines for the
API. When it dies without a result (killed, or gone), the lines still in its queue never
arrive; the record holds them. The server runs on the host of the local backend's
controllers, so it reads the record, counts the output lines it stored for that learner
attempt (the first k records, since the order is the same), and stores the rest as if
reported, continuing the attempt's ``report_seq``, with a note saying so.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import func, insert, or_, select

from ffdl.core.limits import MAX_LOG_TEXT
from ffdl.core.status import TERMINAL_LEARNER_STATES, LearnerStatus
from ffdl.learner.output import OUTPUT_RECORD
from ffdl.server.platform import Platform
from ffdl.server.services.record_numbers import number_lines
from ffdl.server.store.models import Job, Learner, LogLine

log = logging.getLogger("ffdl.server.salvage")

# Only the record's end is read: what a controller held undelivered is its queue (memory
# and disk spool), far less than this unless the API was away for very long.
MAX_READ_BYTES = 64 * 1024 * 1024
OUTPUT_STREAMS = ("stdout", "stderr")
# A log item the server could not store is kept as a warning in the ``ffdl`` stream
# (``reports._warning_row``); it still counts as one delivered output line.
DROPPED_LOG_PREFIX = "[ffdl] dropped log (report item "


@dataclass(frozen=True, slots=True)
class _Record:
    n: int
    stream: str
    text: str


def salvage_output(
    platform: Platform, job_id: str, index: int, attempt: int, handle: dict[str, Any]
) -> int:
    """Store the lines of (job, learner, attempt) that its record holds and the database
    does not; how many were stored. Call it once the controller is dead and before the
    learner is settled."""
    state_dir = handle.get("state_dir")
    if not isinstance(state_dir, str) or not state_dir:
        return 0
    # The file is read before the write transaction, which holds the database's only writer.
    records = read_record(Path(state_dir) / OUTPUT_RECORD)
    if not records:
        return 0
    with platform.store.write() as session:
        job = session.get(Job, job_id, with_for_update=True)
        if job is None:
            return 0
        learner = session.scalars(
            select(Learner).where(
                Learner.job_id == job_id, Learner.index == index, Learner.attempt == attempt
            )
        ).first()
        if learner is None or LearnerStatus(learner.status) in TERMINAL_LEARNER_STATES:
            return 0
        delivered = session.scalar(
            select(func.count())
            .select_from(LogLine)
            .where(
                LogLine.job_id == job_id,
                LogLine.learner == index,
                LogLine.attempt == attempt,
                or_(
                    LogLine.stream.in_(OUTPUT_STREAMS),
                    (LogLine.stream == "ffdl") & LogLine.text.startswith(DROPPED_LOG_PREFIX),
                ),
            )
        )
        missing = [record for record in records if record.n > (delivered or 0)]
        if not missing:
            return 0
        now = time.time()
        seq = learner.report_seq
        rows: list[dict[str, Any]] = []
        for record in missing:
            seq += 1
            rows.append(_row(job_id, index, attempt, seq, record.stream, record.text, now))
        note = (
            f"[ffdl] recovered {len(missing)} lines of output from learner {index} "
            "after its controller was lost"
        )
        seq += 1
        rows.append(_row(job_id, index, attempt, seq, "ffdl", note, now))
        number_lines(job, rows)
        session.execute(insert(LogLine), rows)
        learner.report_seq = seq
    log.info("recovered %d lines of %s learner %d attempt %d", len(missing), job_id, index, attempt)
    return len(missing)


def read_record(path: Path, max_bytes: int = MAX_READ_BYTES) -> list[_Record]:
    """The usable records at the end of ``path`` (at most ``max_bytes`` of it), in order.
    A line cut short (the controller died writing it, or the read began inside it) is
    skipped; so is the record of a path that is not a plain file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as file:
        try:
            if not _is_regular(file.fileno()):
                return []
            size = os.fstat(file.fileno()).st_size
            start = max(0, size - max_bytes)
            file.seek(start)
            data = file.read(max_bytes)
        except OSError as exc:
            log.warning("cannot read %s: %s", path, exc)
            return []
    lines = data.split(b"\n")
    if start > 0:
        lines = lines[1:]
    records: list[_Record] = []
    for line in lines:
        record = _parse(line)
        if record is not None and (not records or record.n > records[-1].n):
            records.append(record)
    return records


def _is_regular(fd: int) -> bool:
    return stat.S_ISREG(os.fstat(fd).st_mode)


def _parse(line: bytes) -> _Record | None:
    try:
        raw = json.loads(line)
    except ValueError:
        return None
    if not isinstance(raw, dict):
        return None
    n, stream, text = raw.get("n"), raw.get("stream"), raw.get("text")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        return None
    if stream not in OUTPUT_STREAMS or not isinstance(text, str):
        return None
    return _Record(n, stream, text)


def _row(
    job_id: str, index: int, attempt: int, seq: int, stream: str, text: str, at: float
) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "learner": index,
        "attempt": attempt,
        "seq": seq,
        "stream": stream,
        "text": text[:MAX_LOG_TEXT],
        "time": at,
    }
