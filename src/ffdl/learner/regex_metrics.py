"""FfDL's regex groups: metrics matched in a job's output lines.

This module owns how a manifest's ``evaluation_metrics.groups`` become ``EMetric`` values:
the regex (FfDL's dialect, see ``ffdl.core.metric_regex``), its typed or short scalars and
``etimes``, and FfDL's ``line_lookahead`` window over several lines.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ffdl.core.metric_regex import MetricRegexError, compile_metric_regex
from ffdl.learner.metrics import (
    ITERATION_KEYS,
    MAX_LINE_BYTES,
    EMetric,
    MetricOutOfRange,
    checked,
    convert,
)


@dataclass(frozen=True)
class ValueSpec:
    """Where one value of a regex group comes from: a named capture of the regex (``$acc``)
    or a constant, read as FfDL's ``type`` says (FLOAT, INT, STRING, JSONSTRING)."""

    type: str
    capture: str | None
    constant: str | None = None

    def text(self, captured: dict[str, str | None]) -> str | None:
        return captured.get(self.capture) if self.capture is not None else self.constant


@dataclass(frozen=True)
class RegexGroup:
    """One FfDL metric group: a regex whose named groups feed scalars and the iteration."""

    name: str
    pattern: re.Pattern[str]
    scalars: dict[str, ValueSpec]
    iteration: ValueSpec | None

    def match(self, text: str, on_problem: Callable[[str], None] | None = None) -> EMetric | None:
        """The metric ``text`` yields, or None. A value whose text does not read as its
        type is left out and, when ``on_problem`` is given, reported to it."""
        found = self.pattern.search(text)
        if found is None:
            return None
        captured = found.groupdict()
        values: dict[str, float] = {}
        for scalar, spec in self.scalars.items():
            number = self._read(scalar, spec, captured, on_problem)
            if number is not None:
                values[scalar] = number
        if not values:
            return None
        iteration = None
        if self.iteration is not None:
            number = self._read("iteration", self.iteration, captured, on_problem)
            iteration = _to_iteration(number)
        return checked(EMetric(group=self.name, iteration=iteration, values=values))

    def _read(
        self,
        name: str,
        spec: ValueSpec,
        captured: dict[str, str | None],
        on_problem: Callable[[str], None] | None,
    ) -> float | None:
        text = spec.text(captured)
        if text is None:
            return None  # an optional part of the regex that did not take part
        number, why = convert(text, spec.type)
        if why is not None and on_problem is not None:
            on_problem(f"dropped value {name!r} of metric group {self.name!r}: {why}")
        return number


def _value_spec(raw: Any, default_type: str, captures: Mapping[str, int]) -> ValueSpec | None:
    """A value in FfDL's typed form (``{type, value}``) or the short form (``"$acc"``).

    ``$name`` is a capture; a bare word is a capture when the regex has one of that name
    (ffdl's short form) and a constant otherwise (FfDL's typed form)."""
    value_type = default_type
    if isinstance(raw, Mapping):
        value_type = str(raw.get("type") or default_type).strip().upper()
        raw = raw.get("value")
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        return None
    reference = str(raw).strip()
    if not reference or reference == "$":
        return None
    if reference.startswith("$") or reference in captures:
        return ValueSpec(type=value_type, capture=reference.removeprefix("$"))
    return ValueSpec(type=value_type, capture=None, constant=reference)


def _to_iteration(number: float | None) -> int | None:
    if number is None or not number.is_integer():
        return None
    return int(number)


def compile_groups(
    groups: dict[str, dict[str, Any]], *, multiline: bool = False
) -> tuple[list[RegexGroup], list[str]]:
    """Compile the manifest's metric groups; unusable groups become problem messages.

    ``multiline`` compiles for matching over a window of several lines (FfDL's
    ``line_lookahead``): ``.`` then crosses line ends and ``^``/``$`` match at each line.
    """
    compiled: list[RegexGroup] = []
    problems: list[str] = []
    flags = re.MULTILINE | re.DOTALL if multiline else 0
    for name, definition in groups.items():
        regex = definition.get("regex")
        if not isinstance(regex, str) or not regex:
            problems.append(f"metric group {name!r} has no regex; ignored")
            continue
        try:
            pattern = compile_metric_regex(regex, flags)
        except MetricRegexError as exc:
            problems.append(f"metric group {name!r}: the regex {exc}; ignored")
            continue
        raw_scalars = definition.get("scalars") or {}
        raw_etimes = definition.get("etimes") or {}
        if not isinstance(raw_scalars, dict) or not isinstance(raw_etimes, dict):
            problems.append(f"metric group {name!r}: scalars and etimes must be maps; ignored")
            continue
        scalars = {
            str(scalar): spec
            for scalar, raw in raw_scalars.items()
            if (spec := _value_spec(raw, "FLOAT", pattern.groupindex)) is not None
        }
        iteration_key = next((key for key in ITERATION_KEYS if key in raw_etimes), None)
        iteration = None
        if iteration_key is not None:
            iteration = _value_spec(raw_etimes[iteration_key], "INT", pattern.groupindex)
        compiled.append(
            RegexGroup(name=name, pattern=pattern, scalars=scalars, iteration=iteration)
        )
    return compiled, problems


def match_line(
    groups: list[RegexGroup], line: str, on_problem: Callable[[str], None] | None = None
) -> list[EMetric]:
    """The metrics ``line`` yields; one with numbers out of range is dropped and, when
    ``on_problem`` is given, reported to it as ``dropped metric ...: <why>``."""
    found: list[EMetric] = []
    for group in groups:
        try:
            metric = group.match(line, on_problem)
        except MetricOutOfRange as exc:
            if on_problem is not None:
                on_problem(f"dropped metric of group {group.name!r}: {exc}")
            continue
        if metric is not None:
            found.append(metric)
    return found


class LineMatcher:
    """Matches a job's output lines against its metric groups, line by line or, with a
    ``line_lookahead`` above 1, over a window of the last lines as FfDL did: the first group
    that matches the window yields a metric and the window starts afresh."""

    def __init__(
        self,
        groups: dict[str, dict[str, Any]],
        line_lookahead: int | None,
        on_problem: Callable[[str], None],
    ) -> None:
        self._lookahead = max(1, line_lookahead or 1)
        self.groups, problems = compile_groups(groups, multiline=self._lookahead > 1)
        self._on_problem = on_problem
        self._window: deque[str] = deque(maxlen=self._lookahead)
        self.matched = 0
        for problem in problems:
            on_problem(problem)

    def feed(self, line: str) -> list[EMetric]:
        if not self.groups:
            return []
        if self._lookahead == 1:
            found = match_line(self.groups, line, self._on_problem)
            self.matched += len(found)
            return found
        self._window.append(line[:MAX_LINE_BYTES])
        text = "\n".join(self._window)
        for group in self.groups:
            try:
                metric = group.match(text, self._on_problem)
            except MetricOutOfRange as exc:
                self._on_problem(f"dropped metric of group {group.name!r}: {exc}")
                self._window.clear()
                return []
            if metric is not None:
                self._window.clear()
                self.matched += 1
                return [metric]
        return []
