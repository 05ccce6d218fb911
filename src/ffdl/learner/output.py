"""The learner command's output: its pipes read line by line, and the training log.

``OutputReaders`` reads stdout and stderr on one thread, whichever has output first, and
hands every line, decoded, to the controller in the order the lines arrived, so a line the
job printed before its traceback comes before it. (Two pipes carry no order between them:
when both hold output at once, stdout's is taken first, which is right for the common case
of progress followed by an error.) Before each read it asks for room in the report queue,
so when the queue can take no more (see ``reporter``) it stops reading and the command
blocks on its pipe: back-pressure instead of memory. ``TrainingLog`` mirrors the lines to
``$LOG_DIR/training-log.txt``, which is stored with the results. ``OutputRecord`` writes
each line, as it is handed to the reporter, to a record in the controller's state directory:
a controller killed with lines still undelivered leaves them there for the platform to
recover. Standard library only.
"""

from __future__ import annotations

import codecs
import json
import os
import selectors
import threading
import time
from collections.abc import Callable
from typing import IO

LINE_LIMIT_BYTES = 16 * 1024
TRAINING_LOG = "training-log.txt"
# In the controller's state directory, which the sandbox cannot see: one JSON object a line,
# {"n": ordinal from 1, "stream": "stdout" | "stderr", "text": the line}, in the order the
# lines went to the reporter. The server reads it when a controller is lost
# (``ffdl.server.services.salvage``).
OUTPUT_RECORD = "output-record.jsonl"
# The training log is written in blocks of this size, and at least this often.
MIRROR_BUFFER_BYTES = 64 * 1024
MIRROR_FLUSH_S = 0.5

LineHandler = Callable[[str, str], None]


class _Stream:
    """One pipe's bytes, cut into decoded lines (at most ``LINE_LIMIT_BYTES`` each)."""

    def __init__(self, pipe: IO[bytes], name: str) -> None:
        self.pipe = pipe
        self.name = name
        self.fd = pipe.fileno()
        self._pending = b""
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def lines(self, chunk: bytes) -> list[str]:
        """The whole lines ``chunk`` completes; at the end (``b""``), whatever is left."""
        if not chunk:
            rest = self._pending
            self._pending = b""
            text = self._decoder.decode(rest, final=True)
            return [text] if text else []
        self._pending += chunk
        found: list[str] = []
        while True:
            end = self._pending.find(b"\n", 0, LINE_LIMIT_BYTES)
            if end < 0 and len(self._pending) < LINE_LIMIT_BYTES:
                return found
            cut = end + 1 if end >= 0 else LINE_LIMIT_BYTES
            piece, self._pending = self._pending[:cut], self._pending[cut:]
            text = self._decoder.decode(piece, final=end >= 0)
            found.append(text[:-1].removesuffix("\r") if end >= 0 else text)


class OutputReaders:
    """One reader thread for all the pipes; ``on_line(stream, text)`` gets every line in the
    order the lines arrived."""

    def __init__(
        self,
        pipes: list[tuple[IO[bytes], str]],
        on_line: LineHandler,
        wait_for_room: Callable[[], None],
    ) -> None:
        self._on_line = on_line
        self._wait_for_room = wait_for_room
        self._last_line_at = time.monotonic()
        self._streams = [_Stream(pipe, name) for pipe, name in pipes]
        self._thread = threading.Thread(target=self._read, daemon=True, name="output")

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float) -> None:
        self._thread.join(max(0.0, timeout_s))

    def alive(self) -> bool:
        return self._thread.is_alive()

    def idle_s(self) -> float:
        """Seconds since a line was last read."""
        return time.monotonic() - self._last_line_at

    def _read(self) -> None:
        with selectors.DefaultSelector() as selector:
            for each in self._streams:
                selector.register(each.fd, selectors.EVENT_READ, each)
            order = {each.fd: index for index, each in enumerate(self._streams)}
            while selector.get_map():
                self._wait_for_room()
                ready = sorted(selector.select(), key=lambda event: order[event[0].fd])
                for key, _events in ready:
                    stream: _Stream = key.data
                    chunk = os.read(stream.fd, LINE_LIMIT_BYTES)
                    if not chunk:
                        selector.unregister(stream.fd)
                        stream.pipe.close()
                    self._deliver(stream, chunk)

    def _deliver(self, stream: _Stream, chunk: bytes) -> None:
        lines = stream.lines(chunk)
        if lines:
            self._last_line_at = time.monotonic()
        for text in lines:
            self._on_line(stream.name, text)


class TrainingLog:
    """``$LOG_DIR/training-log.txt``: every output line, written in blocks and flushed at
    least every ``MIRROR_FLUSH_S`` (so a quiet job's last lines show there soon).

    ``on_problem`` hears why the file cannot be written; writing then stops, the report
    stream goes on.
    """

    def __init__(self, log_dir: str | None, on_problem: Callable[[str], None]) -> None:
        self._log_dir = log_dir
        self._on_problem = on_problem
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        self._closed = threading.Event()

    def open(self) -> None:
        if not self._log_dir:
            return
        try:
            os.makedirs(self._log_dir, exist_ok=True)
            path = os.path.join(self._log_dir, TRAINING_LOG)
            # The directory is the job's own: never write through a link it planted there.
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(path, flags, 0o644)
            self._file = open(  # noqa: SIM115 - closed in close()
                fd, "a", encoding="utf-8", errors="replace", buffering=MIRROR_BUFFER_BYTES
            )
        except OSError as exc:
            self._on_problem(f"[ffdl] cannot write {self._log_dir}/{TRAINING_LOG}: {exc}")
            return
        threading.Thread(target=self._flush_often, name="training-log", daemon=True).start()

    def write(self, text: str) -> None:
        with self._lock:
            if self._file is None:
                return
            try:
                self._file.write(text + "\n")
            except OSError as exc:
                self._stop_locked(exc)

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            if self._file is not None:
                try:
                    self._file.close()
                except OSError as exc:
                    self._stop_locked(exc)
                self._file = None

    def _flush_often(self) -> None:
        while not self._closed.wait(MIRROR_FLUSH_S):
            with self._lock:
                if self._file is None:
                    return
                try:
                    self._file.flush()
                except OSError as exc:
                    self._stop_locked(exc)

    def _stop_locked(self, exc: OSError) -> None:
        self._file = None
        self._on_problem(f"[ffdl] stopped writing {TRAINING_LOG}: {exc}")


class OutputRecord:
    """The controller's private write-ahead record of the command's output.

    Each line is one ``os.write`` with no buffer of ours: once written it sits in the page
    cache, which outlives a SIGKILL of this process (a host crash is not covered; there is
    no fsync, which would cost far more than the record is worth). The caller writes lines
    in the order it hands them to the reporter, under one lock, so that the server may
    equate "the first k output lines it stored" with "the first k records". A new
    controller of the same attempt starts the record afresh: its predecessor's lines can no
    longer be lined up with what was stored, and a short record only under-recovers.
    ``on_problem`` hears why the record cannot be written; recording then stops.
    """

    def __init__(self, path: str, on_problem: Callable[[str], None]) -> None:
        self._path = path
        self._on_problem = on_problem
        self._fd: int | None = None
        self._count = 0

    def open(self) -> None:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            self._fd = os.open(self._path, flags, 0o600)
        except OSError as exc:
            self._on_problem(f"[ffdl] cannot record output for recovery: {exc}")

    def write(self, stream: str, text: str) -> None:
        """Record one line; the caller serialises calls (see the class docstring)."""
        if self._fd is None:
            return
        self._count += 1
        record = {"n": self._count, "stream": stream, "text": text}
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8", "replace")
        try:
            while data:
                data = data[os.write(self._fd, data) :]
        except OSError as exc:
            self._stop(exc)

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.close(fd)
            except OSError as exc:
                self._on_problem(f"[ffdl] output record: {exc}")

    def _stop(self, exc: OSError) -> None:
        # Later lines are not recorded: the record stays a true prefix of the output.
        self.close()
        self._on_problem(f"[ffdl] stopped recording output for recovery: {exc}")
