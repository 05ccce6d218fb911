"""Evaluation metrics a learner produces, and the emetrics files the job (or
``ffdl.sdk.report``) appends to: ffdl's JSON lines and FfDL's evaluation-metrics records.

This module owns ``EMetric``, the checks and conversions every source shares, the parsing
of emetrics lines and the tailing of the emetrics files; FfDL's regex groups over output
lines are in ``regex_metrics``, TensorBoard event files in ``tensorboard``. The controller
turns each ``EMetric`` into a report item.

A metric is sent only with numbers the platform can store (``ffdl.core.limits``): an
iteration of 1e20, a time of 1e308, or a value that is NaN, infinite or absurdly large
drops the whole metric, with a warning line in the job's log. The emetrics file lives in a
directory the job's user can write, and the controller reads it with more rights than the
job has, so it is opened without following a symbolic link and read only if it is a
regular file (a FIFO must not block the tailer either).
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ffdl.core.limits import (
    MAX_METRIC_NAME,
    MAX_METRIC_VALUES,
    iteration_problem,
    metric_value_problem,
    time_problem,
)
from ffdl.core.progress import PROGRESS_KEYS

DEFAULT_GROUP = "train"
# The file FfDL's learners appended their evaluation metrics to, in $LOG_DIR.
FFDL_EMETRICS_FILE = "evaluation-metrics.txt"
# Keys that carry the iteration in the flat emetrics shape, in order of preference.
ITERATION_KEYS = ("iteration", "step", "epoch")
_READ_CHUNK = 1 << 20
# A job writing garbage should not flood its own log with complaints.
MAX_PROBLEMS_REPORTED = 20
# O_NONBLOCK: opening a FIFO planted in place of the file must not hang the tailer.
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# A "line" longer than this is not a metric; it is dropped instead of held in memory.
MAX_LINE_BYTES = 1 << 20


class MetricOutOfRange(ValueError):
    """A well-formed metric holding a number the platform cannot store; it is dropped."""


@dataclass(frozen=True)
class EMetric:
    group: str
    iteration: int | None
    values: dict[str, float]
    time: float | None = None


def convert(text: str, value_type: str) -> tuple[float | None, str | None]:
    """The number ``text`` holds as FfDL's ``value_type`` says, or None and why not.

    The platform stores numbers, so a STRING or JSONSTRING value is kept when it is one.
    """
    stripped = text.strip()
    shown = stripped if len(stripped) <= 40 else stripped[:37] + "..."
    if value_type == "INT":
        try:
            return float(int(stripped)), None
        except ValueError:
            number = _to_float(stripped)
            if number is not None and number.is_integer():
                return number, None
            return None, f"{shown!r} is not an INT"
    number = _to_float(stripped)
    if number is not None:
        return number, None
    if value_type in ("STRING", "JSONSTRING"):
        return None, f"{shown!r} is not a number (only numbers are stored)"
    return None, f"{shown!r} is not a finite FLOAT"


def checked(metric: EMetric) -> EMetric:
    """``metric`` when the platform can store its numbers; else ``MetricOutOfRange``."""
    problem = iteration_problem(metric.iteration)
    if problem is None and metric.time is not None:
        problem = time_problem(metric.time)
    if problem is None and len(metric.values) > MAX_METRIC_VALUES:
        problem = f"more than {MAX_METRIC_VALUES} values"
    for name, value in metric.values.items():
        if problem is not None:
            break
        if len(name) > MAX_METRIC_NAME:
            problem = f"a value name is longer than {MAX_METRIC_NAME} characters"
        else:
            problem = metric_value_problem(name, value)
    if problem is not None:
        raise MetricOutOfRange(problem)
    return metric


def _to_float(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _numeric_values(document: dict[str, Any], skip: set[str]) -> dict[str, float]:
    """The numbers among ``document``'s entries (text and flags are not metrics); a number
    that cannot be stored (NaN, infinite, huge) drops the whole metric."""
    values: dict[str, float] = {}
    for key, value in document.items():
        if key in skip or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if (problem := metric_value_problem(str(key), value)) is not None:
            raise MetricOutOfRange(problem)
        values[str(key)] = float(value)
    return values


def parse_emetrics_line(line: str) -> EMetric:
    """Parse one emetrics line; raise ``ValueError`` saying why a line is unusable.

    Three shapes: ``{"time"?, "group"?, "iteration"?, "values": {...}}``, the flat
    ``{"step"|"iteration"|"epoch": n, "group"?, "time"?, "<name>": number, ...}``, and
    FfDL's record (``{"grouplabel", "etimes": {...}, "values": {...}}``, see
    ``parse_ffdl_record``).
    """
    try:
        document = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg})") from None
    if not isinstance(document, dict):
        raise ValueError("not a JSON object")
    if "grouplabel" in document or "etimes" in document:
        return parse_ffdl_record(document)
    group = document.get("group", DEFAULT_GROUP)
    if not isinstance(group, str) or not group:
        raise ValueError("'group' must be a non-empty string")
    timestamp = document.get("time")
    if timestamp is not None and (isinstance(timestamp, bool) or not _is_number_like(timestamp)):
        raise ValueError("'time' must be a number")
    iteration_key = next((key for key in ITERATION_KEYS if document.get(key) is not None), None)
    iteration: int | None = None
    if iteration_key is not None:
        raw_iteration = document[iteration_key]
        if not _is_number_like(raw_iteration):
            raise ValueError(f"{iteration_key!r} must be an integer")
        if isinstance(raw_iteration, float):
            if not math.isfinite(raw_iteration):
                raise MetricOutOfRange("iteration out of range")
            if not raw_iteration.is_integer():
                raise ValueError(f"{iteration_key!r} must be an integer")
        iteration = int(raw_iteration)
    if isinstance(document.get("values"), dict):
        values = _numeric_values(document["values"], skip=set())
        # The SDK reports progress beside the values (``ffdl.core.progress``): the
        # cumulative sample count, the epoch and the totals a job declares; the platform
        # measures throughput and estimates the time left from them.
        progress = {key: document.get(key) for key in sorted(PROGRESS_KEYS)}
        values.update(_numeric_values(progress, skip=set()))
    else:
        values = _numeric_values(document, skip={"group", "time", iteration_key or ""})
    if not values:
        raise ValueError("no numeric metric values")
    return checked(
        EMetric(
            group=group,
            iteration=iteration,
            values=values,
            time=_as_time(timestamp),
        )
    )


def parse_ffdl_record(document: dict[str, Any]) -> EMetric:
    """One record of FfDL's evaluation-metrics file: ``grouplabel``, ``etimes`` and
    ``values`` holding typed values (``{"type": "FLOAT", "value": "0.5"}``), and an optional
    ``meta.time`` in milliseconds since the epoch, as FfDL wrote it."""
    group = document.get("grouplabel") or DEFAULT_GROUP
    if not isinstance(group, str):
        raise ValueError("'grouplabel' must be a string")
    etimes = document.get("etimes") or {}
    raw_values = document.get("values") or {}
    if not isinstance(etimes, dict) or not isinstance(raw_values, dict):
        raise ValueError("'etimes' and 'values' must be objects")
    values: dict[str, float] = {}
    problems: list[str] = []
    for name, item in raw_values.items():
        number, why = _typed_number(item)
        if number is not None:
            values[str(name)] = number
        else:
            problems.append(f"{name!r}: {why}")
    if not values:
        raise ValueError("no numeric metric values" + (f" ({problems[0]})" if problems else ""))
    iteration = None
    iteration_key = next((key for key in ITERATION_KEYS if key in etimes), None)
    if iteration_key is not None:
        number, why = _typed_number(etimes[iteration_key], "INT")
        if number is None:
            raise ValueError(f"etimes {iteration_key!r}: {why}")
        iteration = int(number)
    meta = document.get("meta")
    millis = meta.get("time") if isinstance(meta, dict) else None
    timestamp = None
    if millis is not None:
        number, why = _typed_number(millis, "INT")
        if number is None:
            raise ValueError(f"meta 'time': {why}")
        timestamp = number / 1000.0
    return checked(EMetric(group=group, iteration=iteration, values=values, time=timestamp))


def _typed_number(item: Any, default_type: str = "FLOAT") -> tuple[float | None, str | None]:
    """The number in an FfDL typed value (or a bare JSON number or text), and why not."""
    value_type = default_type
    if isinstance(item, dict):
        value_type = str(item.get("type") or default_type).upper()
        item = item.get("value")
    if isinstance(item, bool) or not isinstance(item, str | int | float):
        return None, "not a value"
    if isinstance(item, int) and abs(item) > 2**53:
        return None, "out of range"
    return convert(str(item), value_type)


def _as_time(timestamp: int | float | None) -> float | None:
    if timestamp is None:
        return None
    if isinstance(timestamp, int) and abs(timestamp) > 2**53:
        raise MetricOutOfRange("time out of range")  # before float() overflows on it
    return float(timestamp)


def _is_number_like(value: Any) -> bool:
    """A JSON number, finite or not (NaN and Infinity are numbers JSON lets through)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


class EmetricsTailer:
    """Follows an emetrics file from a thread: waits for it to appear, keeps partial last
    lines until they are finished, and starts over when the file is replaced or truncated.

    The file (and its directory) is opened with ``O_NOFOLLOW`` and read only when it is a
    regular file; anything else is reported once and left alone.
    """

    def __init__(
        self,
        path: str,
        on_metric: Callable[[EMetric], None],
        on_problem: Callable[[str], None],
        poll_s: float = 0.25,
        skip_existing: bool = False,
    ) -> None:
        """``skip_existing`` ignores what the file already holds, e.g. an earlier attempt's
        lines when a halted job resumes."""
        self._path = path
        self._on_metric = on_metric
        self._on_problem = on_problem
        self._poll_s = poll_s
        self._offset = 0
        self._inode: int | None = None
        self._partial = b""
        self._line_number = 0
        self._problems = 0
        self._refusal: str | None = None
        self._discarding = False
        if skip_existing:
            try:
                status = os.stat(path, follow_symlinks=False)
            except OSError:
                pass
            else:
                self._inode, self._offset = status.st_ino, status.st_size
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="emetrics-tailer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop polling after one last read; a trailing unfinished line counts as finished."""
        self._stop.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            stopping = self._stop.is_set()
            try:
                self.poll(final=stopping)
            except Exception as exc:
                self._problem(f"cannot read emetrics file {self._path}: {exc}")
            if stopping:
                return
            self._stop.wait(self._poll_s)

    def poll(self, final: bool = False) -> None:
        fd = self._open()
        if fd is not None:
            with os.fdopen(fd, "rb") as handle:
                status = os.fstat(handle.fileno())
                if status.st_ino != self._inode or status.st_size < self._offset:
                    self._inode, self._offset, self._partial = status.st_ino, 0, b""
                    self._discarding = False
                if status.st_size > self._offset:
                    handle.seek(self._offset)
                    while chunk := handle.read(_READ_CHUNK):
                        self._offset += len(chunk)
                        self._take(chunk)
        if final and self._partial:
            raw, self._partial = self._partial, b""
            self._handle(raw)

    def _open(self) -> int | None:
        """A descriptor of the emetrics file when it is a regular file reached without
        following a link; None (reported once) otherwise, or while it does not exist."""
        directory, name = os.path.split(self._path)
        try:
            dir_fd = os.open(directory or ".", _DIR_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                self._refuse(f"the directory of emetrics file {self._path} is a link; not read")
                return None
            raise
        try:
            fd = os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                self._refuse(f"emetrics file {self._path} is a symbolic link; it is not read")
                return None
            raise
        finally:
            os.close(dir_fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            self._refuse(f"emetrics file {self._path} is not a regular file; it is not read")
            return None
        self._refusal = None
        return fd

    def _refuse(self, message: str) -> None:
        if message != self._refusal:
            self._refusal = message
            self._problem(message)

    def _take(self, chunk: bytes) -> None:
        """Split new bytes into lines, holding an unfinished last line up to a bound."""
        *lines, rest = (self._partial + chunk).split(b"\n")
        for raw in lines:
            if self._discarding:
                self._discarding = False  # the end of the over-long line
                continue
            self._handle(raw)
        if len(rest) > MAX_LINE_BYTES and not self._discarding:
            self._line_number += 1
            self._problem(
                f"line {self._line_number} in emetrics file {self._path} is longer than "
                f"{MAX_LINE_BYTES} bytes; dropped"
            )
            rest, self._discarding = b"", True
        self._partial = b"" if self._discarding else rest

    def _handle(self, raw: bytes) -> None:
        self._line_number += 1
        text = raw.decode("utf-8", errors="replace").strip()
        if not text:
            return
        try:
            metric = parse_emetrics_line(text)
        except MetricOutOfRange as exc:
            self._problem(
                f"dropped metric (line {self._line_number} of emetrics file {self._path}): {exc}"
            )
            return
        except ValueError as exc:
            self._problem(
                f"malformed line {self._line_number} in emetrics file {self._path}: {exc}"
            )
            return
        self._on_metric(metric)

    def _problem(self, message: str) -> None:
        self._problems += 1
        if self._problems <= MAX_PROBLEMS_REPORTED:
            self._on_problem(message)
        if self._problems == MAX_PROBLEMS_REPORTED:
            self._on_problem("further emetrics problems are not reported")
