"""Evaluation metrics from a job's TensorBoard event files (FfDL's ``type: tensorboard``).

This module owns finding the metrics directory a manifest names (``in:``, expanded against
the learner's environment and kept inside the job's own directories), following the event
files under it while the job runs, and turning their scalars into ``EMetric`` values: one
per run directory and step, the group named after the run directory as FfDL named it
(``tb/train`` -> ``train``; event files directly in the directory -> its own name), the
iteration the step, the time the event's wall time, the values by tag.

Event files are decoded by the ``tensorboard`` package's reader, which passes both TF1
``simple_value`` summaries and tensor-based scalars (TF2, ``torch.utils.tensorboard``)
through its compatibility layers. The directory belongs to the job and the controller
reads it with more rights than the job has: every directory is opened relative to its
parent without following a link, each event file only when it is a regular file, and the
reader is handed the open descriptor (through ``/proc/self/fd``), never the job's path.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import math
import os
import re
import stat
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.util import tensor_util

from ffdl.core.limits import MAX_GROUP_NAME, MAX_METRIC_NAME
from ffdl.learner.metrics import EMetric, MetricOutOfRange, checked

DEFAULT_DIR = "$LOG_DIR/tb"
EVENT_FILE_MARKER = "tfevents"
SCALARS_PLUGIN = "scalars"
# The job's directories a metrics directory may lie in, by the variable that names them.
JOB_DIR_VARIABLES = ("JOB_STATE_DIR", "LOG_DIR", "RESULT_DIR", "CHECKPOINT_DIR")
# Bounds on what one job can make the controller walk and hold open.
MAX_DEPTH = 6
MAX_FILES = 256
MAX_ENTRIES = 10_000
MAX_PROBLEMS_REPORTED = 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO named like an event file must not hang the reader.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


class MetricsDirError(ValueError):
    """The metrics directory cannot be used; the message names it and says why."""


def expand(text: str, env: Mapping[str, str]) -> str:
    """``text`` with ``$VAR`` and ``${VAR}`` replaced from ``env`` (the learner's
    environment, not the controller's); an unknown variable is an error."""

    def value(found: re.Match[str]) -> str:
        name = found.group(1) or found.group(2)
        if name not in env:
            raise MetricsDirError(f"{text!r} names ${name}, which the learner does not have")
        return env[name]

    return _VARIABLE.sub(value, text)


class MetricsDir(NamedTuple):
    """A metrics directory: where the controller finds it (``directory``), the outermost
    of the job's directories holding it (``anchor``, where a safe walk starts), and the
    path as the learner's command sees it (``seen``, for messages)."""

    anchor: str
    directory: str
    seen: str


def resolve_dir(
    raw: str | None,
    env: Mapping[str, str],
    to_host: Callable[[str], str] = lambda path: path,
) -> MetricsDir:
    """The metrics directory ``raw`` names (default ``$LOG_DIR/tb``; relative paths are
    taken from ``$LOG_DIR``), expanded as the learner's command sees it; ``to_host`` maps
    such a path to where the controller finds it."""
    text = (raw or "").strip() or DEFAULT_DIR
    expanded = expand(text, env)
    if not os.path.isabs(expanded):
        if not env.get("LOG_DIR"):
            raise MetricsDirError(f"{text!r} is relative and the learner has no LOG_DIR")
        expanded = os.path.join(env["LOG_DIR"], expanded)
    seen = os.path.normpath(expanded)
    directory = os.path.normpath(to_host(seen))
    anchors = sorted(
        {os.path.normpath(to_host(env[name])) for name in JOB_DIR_VARIABLES if env.get(name)},
        key=len,
    )
    for anchor in anchors:
        if directory == anchor or directory.startswith(anchor.rstrip("/") + "/"):
            return MetricsDir(anchor, directory, seen)
    names = ", ".join(f"${name}" for name in JOB_DIR_VARIABLES)
    raise MetricsDirError(f"{expanded} (from {text!r}) is not inside the job's {names}")


@dataclass
class _Pending:
    """The scalars of one run at one step, held until the step is complete."""

    step: int
    time: float
    values: dict[str, float] = field(default_factory=dict)


@dataclass
class _EventFile:
    fd: int
    inode: tuple[int, int]
    loader: EventFileLoader
    run: str
    # A tag's plugin is written with its first value only (TF2, tensorboard.summary).
    plugins: dict[str, str] = field(default_factory=dict)


class TensorBoardReader:
    """Follows the event files under a directory from a thread and reports their scalars.

    A step is reported once it is complete: when a later step (or the same tag again)
    appears in its run, when a poll finds nothing new in the run, or at the final read.
    ``skip_existing`` passes over what the files already hold when the reader starts
    (an earlier attempt reported it), so nothing is reported twice.
    """

    def __init__(
        self,
        anchor: str,
        directory: str,
        on_metric: Callable[[EMetric], None],
        on_problem: Callable[[str], None],
        poll_s: float = 1.0,
        skip_existing: bool = True,
        seen: str | None = None,
    ) -> None:
        """``seen`` is the directory as the job sees it, used in what the reader says."""
        self.anchor = anchor
        self.directory = directory
        self.seen = seen or directory
        self._on_metric = on_metric
        self._on_problem = on_problem
        self._poll_s = poll_s
        self._files: dict[str, _EventFile] = {}
        self._pending: dict[str, _Pending] = {}
        self._problems = 0
        self._told: set[str] = set()
        self._broken: set[tuple[int, int]] = set()
        self._skipping = skip_existing
        self.dir_found = False
        self.files_found = 0
        self.reported = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tensorboard-reader", daemon=True)

    def start(self) -> None:
        if self._skipping:
            self._guarded_poll(final=False)
            self._skipping = False
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop polling after one last read that reports every step still held."""
        self._stop.set()
        self._thread.join(timeout_s)
        self.close()

    def close(self) -> None:
        for handle in self._files.values():
            with contextlib.suppress(OSError):
                os.close(handle.fd)
        self._files.clear()

    def nothing_found(self) -> str:
        """Where the reader looked, for a job that produced no metrics."""
        if not self.dir_found:
            return f"no TensorBoard directory {self.seen}"
        if not self.files_found:
            return f"no TensorBoard event files (*{EVENT_FILE_MARKER}*) in {self.seen}"
        return f"no scalars in the TensorBoard event files in {self.seen}"

    def _run(self) -> None:
        while True:
            stopping = self._stop.is_set()
            self._guarded_poll(final=stopping)
            if stopping:
                return
            self._stop.wait(self._poll_s)

    def _guarded_poll(self, final: bool) -> None:
        try:
            self.poll(final=final)
        except Exception as exc:
            self._problem(f"cannot read TensorBoard directory {self.seen}: {exc}")

    def poll(self, final: bool = False) -> None:
        """Read what is new in every event file and report the steps that are complete."""
        ready: list[EMetric] = []
        touched: set[str] = set()
        for path, shown, handle in self._scan():
            try:
                for event in handle.loader.Load():
                    touched.add(handle.run)
                    self._take(handle, event, ready)
            except Exception as exc:
                # A file the reader chokes on is dropped, not retried forever.
                why = f"{type(exc).__name__}: {exc}".rstrip(": ")
                self._problem(f"cannot read TensorBoard event file {shown} ({why}); no longer read")
                self._broken.add(handle.inode)
                self._forget(path)
        if self._skipping:
            self._pending.clear()  # an earlier attempt's steps, complete or not
            return
        for run in list(self._pending):
            if final or run not in touched:
                self._flush(run, ready)
        ready.sort(key=lambda metric: metric.time or 0.0)
        for metric in ready:
            self.reported += 1
            self._on_metric(metric)

    def _take(self, handle: _EventFile, event: Any, ready: list[EMetric]) -> None:
        if not event.HasField("summary"):
            return
        for value in event.summary.value:
            number = self._scalar(handle, value)
            if number is None:
                continue
            tag = value.tag
            if not math.isfinite(number):
                self._problem(f"dropped value {tag!r} at step {event.step}: {number}")
                continue
            if len(tag) > MAX_METRIC_NAME:
                self._problem(f"dropped a value whose tag is over {MAX_METRIC_NAME} characters")
                continue
            pending = self._pending.get(handle.run)
            if pending is not None and (pending.step != event.step or tag in pending.values):
                self._flush(handle.run, ready)
                pending = None
            if pending is None:
                pending = self._pending[handle.run] = _Pending(event.step, event.wall_time)
            pending.values[tag] = number

    @staticmethod
    def _scalar(handle: _EventFile, value: Any) -> float | None:
        kind = value.WhichOneof("value")
        if kind == "simple_value":
            return float(value.simple_value)
        if kind != "tensor":
            return None
        plugin = value.metadata.plugin_data.plugin_name if value.HasField("metadata") else ""
        if plugin:
            handle.plugins[value.tag] = plugin
        else:
            plugin = handle.plugins.get(value.tag, "")
        if plugin != SCALARS_PLUGIN:
            return None
        array = tensor_util.make_ndarray(value.tensor)
        if array.size != 1 or array.dtype.kind not in "fiub":
            return None
        return float(array.reshape(()).item())

    def _flush(self, run: str, ready: list[EMetric]) -> None:
        pending = self._pending.pop(run, None)
        if pending is None:
            return
        metric = EMetric(
            group=run, iteration=pending.step, values=pending.values, time=pending.time
        )
        try:
            ready.append(checked(metric))
        except MetricOutOfRange as exc:
            self._problem(f"dropped metric of run {run!r} at step {pending.step}: {exc}")

    # -- the walk -------------------------------------------------------------------------

    def _scan(self) -> Iterator[tuple[str, str, _EventFile]]:
        """Every event file under the directory, opened safely, in a stable order."""
        root = self._open_directory()
        if root is None:
            return
        self.dir_found = True
        seen: set[str] = set()
        try:
            yield from self._walk(root, "", 0, seen)
        finally:
            os.close(root)
        for gone in set(self._files) - seen:
            self._forget(gone)
        self.files_found = max(self.files_found, len(seen))

    def _open_directory(self) -> int | None:
        """The metrics directory, reached from the anchor one directory at a time."""
        try:
            fd = os.open(self.anchor, _DIR_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                self._tell_once(f"{self.anchor} is not a directory (or is a link); not read")
                return None
            raise
        relative = os.path.relpath(self.directory, self.anchor)
        parts = [] if relative == "." else relative.split(os.sep)
        for index, part in enumerate(parts):
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                os.close(fd)
                return None
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    where = os.path.join(self.anchor, *parts[: index + 1])
                    self._tell_once(f"{where} is a symbolic link or not a directory; not read")
                    return None
                raise
            os.close(fd)
            fd = child
        return fd

    def _walk(
        self, dir_fd: int, relative: str, depth: int, seen: set[str]
    ) -> Iterator[tuple[str, str, _EventFile]]:
        with os.scandir(dir_fd) as listing:
            entries = sorted(itertools.islice(listing, MAX_ENTRIES + 1), key=lambda e: e.name)
        if len(entries) > MAX_ENTRIES:
            where = os.path.join(self.seen, relative)
            self._tell_once(f"{where} holds more than {MAX_ENTRIES} entries; not all read")
            entries = entries[:MAX_ENTRIES]
        for entry in entries:
            path = os.path.join(relative, entry.name)
            shown = os.path.join(self.seen, path)
            if entry.is_symlink():
                self._tell_once(f"{shown} is a symbolic link; not read")
            elif entry.is_dir(follow_symlinks=False):
                if depth >= MAX_DEPTH:
                    self._tell_once(f"{shown} is more than {MAX_DEPTH} levels deep; not read")
                    continue
                try:
                    child = os.open(entry.name, _DIR_FLAGS, dir_fd=dir_fd)
                except OSError as exc:
                    self._tell_once(f"{shown} cannot be opened ({exc}); not read")
                    continue
                try:
                    yield from self._walk(child, path, depth + 1, seen)
                finally:
                    os.close(child)
            elif EVENT_FILE_MARKER in entry.name:
                handle = self._event_file(dir_fd, entry.name, relative, path, shown)
                if handle is not None:
                    seen.add(path)
                    yield path, shown, handle

    def _event_file(
        self, dir_fd: int, name: str, relative: str, path: str, shown: str
    ) -> _EventFile | None:
        known = self._files.get(path)
        try:
            status = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(status.st_mode):
            self._tell_once(f"{shown} is not a regular file; not read")
            return None
        if known is not None and known.inode == (status.st_dev, status.st_ino):
            return known
        if (status.st_dev, status.st_ino) in self._broken:
            return None
        if known is not None:
            self._forget(path)  # replaced by a new file: read the new one from its start
        if len(self._files) >= MAX_FILES:
            self._tell_once(f"more than {MAX_FILES} event files in {self.seen}; not all read")
            return None
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            self._tell_once(f"{shown} cannot be opened ({exc}); not read")
            return None
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            os.close(fd)
            self._tell_once(f"{shown} is not a regular file; not read")
            return None
        # The reader gets the descriptor, never the job's path: a path swapped for a link
        # after this check still reads this file.
        loader = EventFileLoader(f"/proc/self/fd/{fd}")
        handle = _EventFile(
            fd=fd, inode=(opened.st_dev, opened.st_ino), loader=loader, run=self._run_name(relative)
        )
        self._files[path] = handle
        return handle

    def _run_name(self, relative: str) -> str:
        name = relative or os.path.basename(self.seen.rstrip("/")) or "tb"
        return name[-MAX_GROUP_NAME:]

    def _forget(self, path: str) -> None:
        handle = self._files.pop(path, None)
        if handle is not None:
            with contextlib.suppress(OSError):
                os.close(handle.fd)

    def _tell_once(self, message: str) -> None:
        if message not in self._told and len(self._told) < MAX_PROBLEMS_REPORTED:
            self._told.add(message)
            self._problem(message)

    def _problem(self, message: str) -> None:
        self._problems += 1
        if self._problems <= MAX_PROBLEMS_REPORTED:
            self._on_problem(message)
        if self._problems == MAX_PROBLEMS_REPORTED:
            self._on_problem("further TensorBoard problems are not reported")
