"""The report queue of one learner attempt: first in, first out, in bounded memory.

Items are JSON texts of one line each (the reporter numbers them only when it sends them).
The oldest wait in memory, up to ``MEMORY_BYTES``; once that is full, later items gather in
a small write buffer and are appended to segment files in the spool directory (the
controller's own state directory, which the learner's sandbox cannot see), and they are
read back, in order, as the memory head empties. A segment is deleted once read.

Memory is bounded: the head holds at most ``MEMORY_BYTES`` and the write buffer normally
``WRITE_CHUNK_BYTES``. The buffer grows only while the disk cannot take it (a write failed,
or the segments reach ``DISK_BYTES``), and up to ``MEMORY_BYTES``: past that the spool is
``full`` and producers that can wait do (``Reporter.wait_for_room``), so the learner's
output waits in its pipe instead of in memory. Nothing is ever dropped here.

Not thread-safe: the reporter calls it under its lock. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections import deque
from dataclasses import dataclass

MEMORY_BYTES = 4 * 1024 * 1024
WRITE_CHUNK_BYTES = 64 * 1024
READ_CHUNK_BYTES = 1024 * 1024
SEGMENT_BYTES = 16 * 1024 * 1024
DISK_BYTES = 1024 * 1024 * 1024
# After a failed write the buffer holds new items this long before the disk is tried again.
DISK_RETRY_S = 1.0
# What one item costs in memory beside its text: the str object's header and a deque slot.
ITEM_OVERHEAD = 64
SEGMENT_PREFIX = "segment-"


@dataclass
class _Segment:
    path: str
    fd: int
    size: int = 0  # bytes written
    read_at: int = 0  # bytes read back


class Spool:
    """A FIFO of one-line texts that keeps its head in memory and the rest on disk.

    ``directory`` is where segments go (made if missing, emptied of an earlier run's
    segments); None makes a private temporary directory on the first spill.
    """

    def __init__(
        self,
        directory: str | None = None,
        *,
        memory_bytes: int = MEMORY_BYTES,
        disk_bytes: int = DISK_BYTES,
        segment_bytes: int = SEGMENT_BYTES,
        write_chunk_bytes: int = WRITE_CHUNK_BYTES,
    ) -> None:
        self._directory = directory
        self._own_directory = False
        self._memory_limit = memory_bytes
        self._disk_limit = disk_bytes
        self._segment_limit = segment_bytes
        self._write_chunk = min(write_chunk_bytes, memory_bytes)
        self._head: deque[str] = deque()
        self._head_bytes = 0
        self._segments: deque[_Segment] = deque()
        self._disk_bytes = 0
        self._tail: deque[str] = deque()
        self._tail_bytes = 0
        self._count = 0
        self._segment_number = 0
        self._write_failed_at: float | None = None
        self.spilled_items = 0
        # The last disk error, once: the reporter passes it on to its diagnostics.
        self.problem: str | None = None
        if directory is not None:
            self._prepare(directory)

    # -- state ----------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._count

    @property
    def memory_bytes(self) -> int:
        """What the queued items take in memory (texts and per-item overhead)."""
        return self._head_bytes + self._tail_bytes

    @property
    def disk_bytes(self) -> int:
        return self._disk_bytes

    @property
    def full(self) -> bool:
        """True while the write buffer is at its limit: producers that can wait should."""
        return self._tail_bytes >= self._memory_limit

    # -- queueing -------------------------------------------------------------------------

    def put(self, text: str) -> None:
        """Queue ``text`` (one line, no newline) after everything queued before."""
        size = len(text) + ITEM_OVERHEAD
        self._count += 1
        if not self._segments and not self._tail and self._head_bytes + size <= self._memory_limit:
            self._head.append(text)
            self._head_bytes += size
            return
        self._tail.append(text)
        self._tail_bytes += size
        self.spilled_items += 1
        if self._tail_bytes >= self._write_chunk:
            self.flush()

    def peek(self, count: int, max_bytes: int) -> list[str]:
        """The oldest items, at most ``count`` and ``max_bytes`` of text (but one at least)."""
        if len(self._head) < count and (self._segments or self._tail):
            self._refill()
        batch: list[str] = []
        total = 0
        for text in self._head:
            if len(batch) == count or (batch and total + len(text) > max_bytes):
                break
            batch.append(text)
            total += len(text)
        return batch

    def pop(self, count: int) -> None:
        """Remove the ``count`` oldest items (they were peeked)."""
        for _ in range(count):
            self._head_bytes -= len(self._head.popleft()) + ITEM_OVERHEAD
        self._count -= count

    def flush(self) -> None:
        """Write the buffered items to disk, unless the disk failed just now or is full."""
        if not self._tail or self._disk_bytes >= self._disk_limit:
            return
        now = time.monotonic()
        if self._write_failed_at is not None and now - self._write_failed_at < DISK_RETRY_S:
            return
        data = ("\n".join(self._tail) + "\n").encode()
        try:
            segment = self._writable_segment()
            written = 0
            while written < len(data):
                # At the segment's known size: a failed write leaves nothing that is read.
                written += os.pwrite(segment.fd, data[written:], segment.size + written)
        except OSError as exc:
            self._write_failed_at = now
            if self.problem is None:
                self.problem = f"cannot spool report items to disk: {exc}"
            return
        self._write_failed_at = None
        segment.size += len(data)
        self._disk_bytes += len(data)
        self._tail.clear()
        self._tail_bytes = 0

    def clear(self) -> None:
        """Forget every item and delete the segments."""
        self._head.clear()
        self._tail.clear()
        self._head_bytes = self._tail_bytes = self._count = 0
        while self._segments:
            self._drop_first_segment()

    def close(self) -> None:
        """``clear``, and remove the directory if this spool made it."""
        self.clear()
        if self._own_directory and self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None
            self._own_directory = False

    # -- disk -----------------------------------------------------------------------------

    @staticmethod
    def _prepare(directory: str) -> None:
        # A directory that cannot be made shows as failed writes later: items stay in
        # memory (up to the bound) and the reporter hears why.
        with contextlib.suppress(OSError):
            os.makedirs(directory, mode=0o700, exist_ok=True)
            # Segments of a controller that died before delivering them: their items were
            # never numbered for this controller's stream, so they cannot be sent.
            for name in os.listdir(directory):
                if name.startswith(SEGMENT_PREFIX):
                    os.unlink(os.path.join(directory, name))

    def _writable_segment(self) -> _Segment:
        if self._segments and self._segments[-1].size < self._segment_limit:
            return self._segments[-1]
        if self._directory is None:
            self._directory = tempfile.mkdtemp(prefix="ffdl-spool-")
            self._own_directory = True
        self._segment_number += 1
        path = os.path.join(self._directory, f"{SEGMENT_PREFIX}{self._segment_number:06d}")
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
        segment = _Segment(path, os.open(path, flags, 0o600))
        self._segments.append(segment)
        return segment

    def _refill(self) -> None:
        """Move items from disk, then from the write buffer, into the head, in order."""
        while self._head_bytes < self._memory_limit:
            if self._segments:
                segment = self._segments[0]
                if segment.read_at >= segment.size:
                    self._drop_first_segment()
                elif not self._read_some(segment):
                    return
            elif self._tail:
                text = self._tail.popleft()
                size = len(text) + ITEM_OVERHEAD
                self._tail_bytes -= size
                self._head.append(text)
                self._head_bytes += size
            else:
                return

    def _read_some(self, segment: _Segment) -> bool:
        """Read whole lines from ``segment`` into the head; False if it cannot be read."""
        room = max(self._memory_limit - self._head_bytes, 1)
        length = min(segment.size - segment.read_at, READ_CHUNK_BYTES, room)
        while True:
            try:
                data = os.pread(segment.fd, length, segment.read_at)
            except OSError as exc:
                if self.problem is None:
                    self.problem = f"cannot read spooled report items: {exc}"
                return False
            end = data.rfind(b"\n")
            if end >= 0 or segment.read_at + len(data) >= segment.size:
                break
            # One line longer than the chunk: read it whole.
            length *= 2
        if end < 0:
            # Never written so: a segment grows by whole lines only.
            if self.problem is None:
                self.problem = f"spool segment {segment.path} ends in a partial line"
            return False
        for line in data[:end].split(b"\n"):
            text = line.decode("utf-8", errors="replace")
            self._head.append(text)
            self._head_bytes += len(text) + ITEM_OVERHEAD
        segment.read_at += end + 1
        return True

    def _drop_first_segment(self) -> None:
        segment = self._segments.popleft()
        self._disk_bytes -= segment.size
        with contextlib.suppress(OSError):
            os.close(segment.fd)
        with contextlib.suppress(OSError):
            os.unlink(segment.path)
