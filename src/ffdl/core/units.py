"""FfDL's size and duration strings: ``"8Gb"``, ``"1000MiB"``, ``"90s"``, ``"1h30m"``.

Sizes come back as whole MiB (the unit ``ffdl.core.resources`` uses everywhere), durations as
seconds. Every rejected value raises ``ManifestError`` naming the manifest field it came from.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from fractions import Fraction

from ffdl.core.errors import ManifestError

BYTES_PER_MIB = 1024 * 1024
# A sanity bound, not a capacity: 1 EiB in MiB. Anything above is a typo or an attack.
MAX_SIZE_MB = 1024**4

# A suffix with an ``i`` is binary (1024^n), one without is decimal (1000^n), as in FfDL and
# Kubernetes. A bare number means MiB.
_SIZE_UNIT_BYTES: dict[str, int] = {
    "k": 1000,
    "kb": 1000,
    "ki": 1024,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mi": 1024**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gi": 1024**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "ti": 1024**4,
    "tib": 1024**4,
}
_SIZE_UNITS_HINT = "use mb, mib, gb, gib, tb, tib"
# Digits are bounded so that a hostile value cannot make Fraction/int parsing expensive.
_SIZE_PATTERN = re.compile(r"(?P<number>\d{1,30}(?:\.\d{0,30})?|\.\d{1,30})\s*(?P<unit>[a-z]*)")

_DURATION_UNIT_SECONDS: dict[str, int] = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_DURATION_NUMBER = r"\d{1,15}(?:\.\d{1,15})?"
_DURATION_PATTERN = re.compile(
    "".join(rf"(?:(?P<{unit}>{_DURATION_NUMBER})\s*{unit}\s*)?" for unit in "dhms")
)
_PLAIN_NUMBER = re.compile(_DURATION_NUMBER)
# Ten years: longer hints are certainly mistakes.
MAX_DURATION_S = 10 * 365 * 86400.0

_SIZE_CODE = "C104"
_DURATION_CODE = "C101"


def parse_size_mb(value: str | int | float, field: str) -> int:
    """Converts an FfDL size (``"16GB"``, ``"2gib"``, ``512``) to MiB, rounded up.

    A bare number (or a numeric string without a unit) is taken as MiB.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ManifestError(
            field, f"must be a size such as 8Gb, got {describe_value(value)}", code=_SIZE_CODE
        )
    if isinstance(value, str):
        size_bytes = _size_string_bytes(value, field)
    elif isinstance(value, float) and not math.isfinite(value):
        raise ManifestError(field, f"must be a finite size, got {value!r}", code=_SIZE_CODE)
    else:
        size_bytes = Fraction(value) * BYTES_PER_MIB
    if size_bytes <= 0:
        raise ManifestError(
            field, f"must be greater than 0, got {describe_value(value)}", code=_SIZE_CODE
        )
    size_mb = math.ceil(size_bytes / BYTES_PER_MIB)
    if size_mb > MAX_SIZE_MB:
        raise ManifestError(
            field,
            f"is too large ({describe_value(value)}; at most {MAX_SIZE_MB} MiB)",
            code=_SIZE_CODE,
        )
    return size_mb


def _size_string_bytes(text: str, field: str) -> Fraction:
    cleaned = text.strip().lower()
    if cleaned.startswith("-"):
        raise ManifestError(
            field, f"must be greater than 0, got {describe_value(text)}", code=_SIZE_CODE
        )
    match = _SIZE_PATTERN.fullmatch(cleaned)
    if match is None:
        raise ManifestError(
            field,
            f"must be a size such as 8Gb or 512MiB, got {describe_value(text)}",
            code=_SIZE_CODE,
        )
    unit = match["unit"]
    if unit == "":
        multiplier = BYTES_PER_MIB
    elif unit in _SIZE_UNIT_BYTES:
        multiplier = _SIZE_UNIT_BYTES[unit]
    else:
        original_unit = text.strip()[-len(unit) :]
        raise ManifestError(
            field,
            f"unknown size unit {original_unit!r} ({_SIZE_UNITS_HINT})",
            code=_SIZE_CODE,
        )
    return Fraction(match["number"]) * multiplier


def parse_duration_s(value: str | int | float, field: str) -> float:
    """Converts a duration (seconds as a number, or ``"90s"``, ``"30m"``, ``"1h30m"``, ``"1d"``)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ManifestError(
            field,
            f"must be a duration such as 90s or 2h, got {describe_value(value)}",
            code=_DURATION_CODE,
        )
    seconds = _duration_string_seconds(value, field) if isinstance(value, str) else float(value)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ManifestError(
            field,
            f"must be a duration greater than 0, got {describe_value(value)}",
            code=_DURATION_CODE,
        )
    if seconds > MAX_DURATION_S:
        raise ManifestError(
            field, f"is too long ({describe_value(value)}; at most 10 years)", code=_DURATION_CODE
        )
    return seconds


def _duration_string_seconds(text: str, field: str) -> float:
    cleaned = text.strip().lower()
    if _PLAIN_NUMBER.fullmatch(cleaned):
        return float(cleaned)
    match = _DURATION_PATTERN.fullmatch(cleaned)
    if not cleaned or match is None:
        raise ManifestError(
            field,
            f"must be a duration such as 90s, 30m, 2h, 1d or 1h30m, got {describe_value(text)}",
            code=_DURATION_CODE,
        )
    return sum(
        float(amount) * _DURATION_UNIT_SECONDS[unit]
        for unit, amount in match.groupdict().items()
        if amount is not None
    )


def describe_value(value: object) -> str:
    """Renders a rejected value briefly for an error message, in YAML's spelling."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float | str):
        text = repr(value)
        return text if len(text) <= 40 else text[:37] + "..."
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return f"a {type(value).__name__}"
