"""FfDL's metric regex dialect, turned into Python regular expressions.

FfDL's ``regex_extractor`` took Go-flavoured regexes with named patterns from a small library:
``%{FLOAT:acc}`` captures a float into the group ``acc``, ``%{INT}`` matches an integer
without capturing, and Go's ``(?<name>...)`` names a group like Python's ``(?P<name>...)``.
This module owns that library and the translation; both the manifest check and the learner
controller use it, so a regex accepted at submit is the regex matched at run time. It uses
the standard library only (the controller imports it).
"""

from __future__ import annotations

import re

# The named patterns FfDL's extractor shipped, by name.
PATTERNS: dict[str, str] = {
    "FLOAT": r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?",
    "INT": r"[-+]?\d+",
    "INT_ANY": r"[-+]?(?:0[xX][\dA-Fa-f]+|0[0-7]*|\d+)",
    "HEX": r"[-+]?(?:0[xX])?[\dA-Fa-f]+",
    "GLOG_STAMP": r"[EFIW]\d\d\d\d\s+\d\d:\d\d:\d*\.\d+",
    "TIMESTAMP": r"(?:\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}[.]\d+?Z|[-+]\d{2}:\d{2}?)",
}

_SYMBOL = re.compile(r"%\{(?P<name>\w+)(?::(?P<field>\w+))?\}")
_GO_NAMED_GROUP = re.compile(r"\(\?<(?=[A-Za-z_])")


class MetricRegexError(ValueError):
    """The regex names an unknown pattern or does not compile; the message says which."""


def translate(regex: str) -> str:
    """``regex`` in Python's syntax: library symbols expanded, Go group names rewritten."""

    def expand(found: re.Match[str]) -> str:
        name, field = found.group("name"), found.group("field")
        pattern = PATTERNS.get(name)
        if pattern is None:
            known = ", ".join(sorted(PATTERNS))
            raise MetricRegexError(f"unknown pattern %{{{name}}} (known: {known})")
        return f"(?P<{field}>{pattern})" if field else f"(?:{pattern})"

    return _SYMBOL.sub(expand, _GO_NAMED_GROUP.sub("(?P<", regex))


def compile_metric_regex(regex: str, flags: int = 0) -> re.Pattern[str]:
    """Compile an FfDL metric regex; ``MetricRegexError`` says why one cannot be used."""
    try:
        return re.compile(translate(regex), flags)
    except (re.error, RecursionError, OverflowError) as error:
        raise MetricRegexError(f"is not a valid regular expression: {error}") from None
