"""Evaluation metrics a learner produces: FfDL regex groups over log lines, and the
JSON-lines emetrics file the job (or ``ffdl.sdk.report``) appends to.

This module owns the parsing of both sources into ``EMetric`` values and the tailing of the
emetrics file; the controller turns each ``EMetric`` into a report item.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DEFAULT_GROUP = "train"
# Keys that carry the iteration in the flat emetrics shape, in order of preference.
ITERATION_KEYS = ("iteration", "step", "epoch")
# Go's regexp accepts (?<name>...), Python wants (?P<name>...); FfDL manifests use both.
_GO_NAMED_GROUP = re.compile(r"\(\?<(?=[A-Za-z_])")
_READ_CHUNK = 1 << 20
# A job writing garbage should not flood its own log with complaints.
MAX_PROBLEMS_REPORTED = 20


@dataclass(frozen=True)
class EMetric:
    group: str
    iteration: int | None
    values: dict[str, float]
    time: float | None = None


@dataclass(frozen=True)
class RegexGroup:
    """One FfDL metric group: a regex whose named groups feed scalars and the iteration."""

    name: str
    pattern: re.Pattern[str]
    scalars: dict[str, str]
    iteration_group: str | None

    def match(self, line: str) -> EMetric | None:
        found = self.pattern.search(line)
        if found is None:
            return None
        captured = found.groupdict()
        values = {}
        for scalar, group in self.scalars.items():
            number = _to_float(captured.get(group))
            if number is not None:
                values[scalar] = number
        if not values:
            return None
        iteration = None
        if self.iteration_group is not None:
            iteration = _to_iteration(_to_float(captured.get(self.iteration_group)))
        return EMetric(group=self.name, iteration=iteration, values=values)


def _group_ref(reference: Any) -> str | None:
    """FfDL writes group references as ``$name``; a bare ``name`` means the same."""
    if not isinstance(reference, str) or not reference.strip("$ "):
        return None
    return reference.strip().removeprefix("$")


def _to_float(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _to_iteration(number: float | None) -> int | None:
    if number is None or not number.is_integer():
        return None
    return int(number)


def compile_groups(groups: dict[str, dict[str, Any]]) -> tuple[list[RegexGroup], list[str]]:
    """Compile the manifest's metric groups; unusable groups become problem messages."""
    compiled: list[RegexGroup] = []
    problems: list[str] = []
    for name, definition in groups.items():
        regex = definition.get("regex")
        if not isinstance(regex, str) or not regex:
            problems.append(f"metric group {name!r} has no regex; ignored")
            continue
        try:
            pattern = re.compile(_GO_NAMED_GROUP.sub("(?P<", regex))
        except re.error as exc:
            problems.append(f"metric group {name!r} has an invalid regex ({exc}); ignored")
            continue
        raw_scalars = definition.get("scalars") or {}
        raw_etimes = definition.get("etimes") or {}
        if not isinstance(raw_scalars, dict) or not isinstance(raw_etimes, dict):
            problems.append(f"metric group {name!r}: scalars and etimes must be maps; ignored")
            continue
        scalars = {
            str(scalar): ref
            for scalar, reference in raw_scalars.items()
            if (ref := _group_ref(reference)) is not None
        }
        compiled.append(
            RegexGroup(
                name=name,
                pattern=pattern,
                scalars=scalars,
                iteration_group=_group_ref(raw_etimes.get("iteration")),
            )
        )
    return compiled, problems


def match_line(groups: list[RegexGroup], line: str) -> list[EMetric]:
    return [metric for group in groups if (metric := group.match(line)) is not None]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _numeric_values(document: dict[str, Any], skip: set[str]) -> dict[str, float]:
    return {
        str(key): float(value)
        for key, value in document.items()
        if key not in skip and _is_number(value)
    }


def parse_emetrics_line(line: str) -> EMetric:
    """Parse one emetrics line; raise ``ValueError`` saying why a line is unusable.

    Two shapes: ``{"time"?, "group"?, "iteration"?, "values": {...}}`` and the flat
    ``{"step"|"iteration"|"epoch": n, "group"?, "time"?, "<name>": number, ...}``.
    """
    try:
        document = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg})") from None
    if not isinstance(document, dict):
        raise ValueError("not a JSON object")
    group = document.get("group", DEFAULT_GROUP)
    if not isinstance(group, str) or not group:
        raise ValueError("'group' must be a non-empty string")
    timestamp = document.get("time")
    if timestamp is not None and not _is_number(timestamp):
        raise ValueError("'time' must be a number")
    iteration_key = next((key for key in ITERATION_KEYS if document.get(key) is not None), None)
    iteration: int | None = None
    if iteration_key is not None:
        raw_iteration = document[iteration_key]
        if not _is_number(raw_iteration) or not float(raw_iteration).is_integer():
            raise ValueError(f"{iteration_key!r} must be an integer")
        iteration = int(raw_iteration)
    if isinstance(document.get("values"), dict):
        values = _numeric_values(document["values"], skip=set())
        # The SDK reports the cumulative sample count beside the values; the platform
        # measures a job's throughput from it.
        if _is_number(document.get("samples")):
            values["samples"] = float(document["samples"])
    else:
        values = _numeric_values(document, skip={"group", "time", iteration_key or ""})
    if not values:
        raise ValueError("no numeric metric values")
    return EMetric(
        group=group,
        iteration=iteration,
        values=values,
        time=float(timestamp) if timestamp is not None else None,
    )


class EmetricsTailer:
    """Follows an emetrics file from a thread: waits for it to appear, keeps partial last
    lines until they are finished, and starts over when the file is replaced or truncated.
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
        if skip_existing:
            try:
                status = os.stat(path)
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
        try:
            status = os.stat(self._path)
        except FileNotFoundError:
            return
        if status.st_ino != self._inode or status.st_size < self._offset:
            self._inode, self._offset, self._partial = status.st_ino, 0, b""
        if status.st_size > self._offset:
            with open(self._path, "rb") as handle:
                handle.seek(self._offset)
                while chunk := handle.read(_READ_CHUNK):
                    self._offset += len(chunk)
                    *lines, self._partial = (self._partial + chunk).split(b"\n")
                    for raw in lines:
                        self._handle(raw)
        if final and self._partial:
            raw, self._partial = self._partial, b""
            self._handle(raw)

    def _handle(self, raw: bytes) -> None:
        self._line_number += 1
        text = raw.decode("utf-8", errors="replace").strip()
        if not text:
            return
        try:
            metric = parse_emetrics_line(text)
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
