"""The archive store of old log lines and metrics: how a chunk of records is named,
encoded and decoded, and ``RecordArchive``, the store a platform reads chunks back from
(with the last few decoded chunks kept in memory). What moves records into it, and when, is
``ffdl.server.services.record_archive``.
"""

from __future__ import annotations

import gzip
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ffdl.core.errors import Unavailable
from ffdl.server.settings import Settings
from ffdl.server.store.models import Job, LogLine, Metric, RecordChunk
from ffdl.server.telemetry.instruments import ARCHIVE_FAILURES
from ffdl.storage.base import StorageError
from ffdl.storage.blobs import BlobStore, open_blob_store

log = logging.getLogger("ffdl.archive")

LOG = "log"
METRIC = "metric"
# Decoded chunks kept in memory for readers paging through them.
CACHED_CHUNKS = 8


@dataclass(frozen=True, slots=True)
class ChunkRef:
    """What a reader needs of a ``RecordChunk``, copied out of its session."""

    job_id: str
    kind: str
    first: int
    last: int
    min_time: float
    max_time: float
    key: str

    @classmethod
    def of(cls, row: RecordChunk) -> ChunkRef:
        return cls(
            job_id=row.job_id,
            kind=row.kind,
            first=row.first_number,
            last=row.last_number,
            min_time=row.min_time,
            max_time=row.max_time,
            key=row.key,
        )


def kind_of(model: Any) -> str:
    return LOG if model is LogLine else METRIC


def archived_mark(job: Job, model: Any) -> int:
    """The number up to which ``job``'s records of ``model`` are in the archive."""
    return int(job.archived_line_number if model is LogLine else job.archived_metric_number)


def last_number(job: Job, model: Any) -> int:
    return int(job.last_line_number if model is LogLine else job.last_metric_number)


def chunk_key(job_id: str, kind: str, first: int, last: int) -> str:
    return f"records/{job_id}/{kind}-{first:012d}-{last:012d}.jsonl.gz"


def _row_fields(kind: str, row: Any) -> dict[str, Any]:
    fields = {
        "number": row.number,
        "time": row.time,
        "learner": row.learner,
        "attempt": row.attempt,
        "seq": row.seq,
    }
    if kind == LOG:
        fields.update(stream=row.stream, text=row.text)
    else:
        fields.update(group=row.group, iteration=row.iteration, values=row.values)
    return fields


def encode_chunk(kind: str, rows: Sequence[Any]) -> bytes:
    lines = (json.dumps(_row_fields(kind, row), separators=(",", ":")) for row in rows)
    # No timestamp in the header: two replicas moving the same chunk must write the
    # same bytes under its key, whenever each of them compressed it.
    return gzip.compress(("\n".join(lines) + "\n").encode(), compresslevel=6, mtime=0)


def _chunk_lines(chunk: ChunkRef, data: bytes) -> list[str]:
    lines = [line for line in gzip.decompress(data).decode().split("\n") if line]
    if len(lines) != chunk.last - chunk.first + 1:
        raise StorageError(f"archived chunk {chunk.key} does not hold the records it should")
    return lines


def _record(chunk: ChunkRef, line: str, number: int | None = None) -> Any:
    fields = json.loads(line)
    if number is not None and fields.get("number") != number:
        raise StorageError(f"archived chunk {chunk.key} does not hold the records it should")
    return (LogLine if chunk.kind == LOG else Metric)(job_id=chunk.job_id, **fields)


class RecordArchive:
    """The archive store (opened on first use, by ``opener``) and the chunks read lately.

    A chunk is kept as its JSON lines, and only the records a read asks for become objects:
    a page of 100 from a chunk of 10,000 builds 100.
    """

    def __init__(self, opener: Callable[[], BlobStore]) -> None:
        self._opener = opener
        self._store: BlobStore | None = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, list[str]] = OrderedDict()

    @classmethod
    def for_settings(cls, settings: Settings) -> RecordArchive:
        """The archive ``archive_store`` names (HOME/archive when it names none)."""
        url = settings.archive_store or str(settings.home / "archive")
        return cls(lambda: open_blob_store(url, settings.archive_store_options))

    @property
    def store(self) -> BlobStore:
        with self._lock:
            if self._store is None:
                self._store = self._opener()
            return self._store

    def records(self, chunk: ChunkRef, *, after: int, limit: int) -> list[Any]:
        """At most ``limit`` of the chunk's records numbered after ``after``, in order."""
        lines = self._lines(chunk)
        first = max(after + 1, chunk.first)
        picked = lines[first - chunk.first : first - chunk.first + max(limit, 0)]
        return self._built(
            chunk, lambda: [_record(chunk, line, first + i) for i, line in enumerate(picked)]
        )

    def records_from(self, chunk: ChunkRef, since: float, limit: int | None = None) -> list[Any]:
        """The chunk's records at or after ``since`` (epoch seconds), in number order."""
        lines = self._lines(chunk)

        def build() -> list[Any]:
            found = []
            for line in lines:
                if json.loads(line)["time"] >= since:
                    found.append(_record(chunk, line))
                    if limit is not None and len(found) >= limit:
                        break
            return found

        return self._built(chunk, build)

    def _lines(self, chunk: ChunkRef) -> list[str]:
        with self._lock:
            cached = self._cache.get(chunk.key)
            if cached is not None:
                self._cache.move_to_end(chunk.key)
                return cached
        lines = self._built(chunk, lambda: _chunk_lines(chunk, self.store.get(chunk.key)))
        with self._lock:
            self._cache[chunk.key] = lines
            while len(self._cache) > CACHED_CHUNKS:
                self._cache.popitem(last=False)
        return lines

    def _built(self, chunk: ChunkRef, build: Callable[[], list[Any]]) -> list[Any]:
        """``build()``, with what the store or the chunk's bytes fail with turned into
        ``Unavailable`` (a 503 naming the chunk and why)."""
        try:
            return build()
        except (StorageError, OSError, ValueError, TypeError, KeyError) as exc:
            ARCHIVE_FAILURES.labels("read").inc()
            log.warning("reading archived records failed: %s", exc)
            what = "log lines" if chunk.kind == LOG else "metrics"
            raise Unavailable(
                f"{what} {chunk.first}..{chunk.last} of {chunk.job_id} are archived and could "
                f"not be read from the archive store: {exc}",
                retry_after_s=30,
            ) from None

    def forget_job(self, job_id: str) -> None:
        """Delete a deleted job's chunks from the store (failures are logged, not raised:
        the job itself is gone already)."""
        with self._lock:
            for key in [k for k in self._cache if k.startswith(f"records/{job_id}/")]:
                del self._cache[key]
        try:
            self.store.delete(f"records/{job_id}")
        except (StorageError, ValueError) as exc:
            ARCHIVE_FAILURES.labels("delete").inc()
            log.warning("could not delete the archived records of %s: %s", job_id, exc)


def chunks_between(
    session: Session, job_id: str, model: Any, after: int, upto: int
) -> list[ChunkRef]:
    """The chunks holding ``job_id``'s records of ``model`` numbered after ``after`` up to
    ``upto``, in order."""
    return _chunks(
        session,
        job_id,
        model,
        RecordChunk.last_number > after,
        RecordChunk.first_number <= upto,
    )


def chunks_from_time(session: Session, job_id: str, model: Any, since: float) -> list[ChunkRef]:
    """The chunks holding any of ``job_id``'s records of ``model`` at or after ``since``."""
    return _chunks(session, job_id, model, RecordChunk.max_time >= since)


def _chunks(session: Session, job_id: str, model: Any, *conditions: Any) -> list[ChunkRef]:
    query = (
        select(RecordChunk)
        .where(RecordChunk.job_id == job_id, RecordChunk.kind == kind_of(model), *conditions)
        .order_by(RecordChunk.first_number)
    )
    return [ChunkRef.of(row) for row in session.scalars(query)]
