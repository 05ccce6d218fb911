"""The manifest's field checks, and how a failed check becomes a ``ManifestError``.

Each check raises a custom pydantic error carrying ffdl's own reason, so that users never
see pydantic's wording; ``at`` extends the location for checks that span several fields.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from pydantic import BeforeValidator
from pydantic_core import ErrorDetails, PydanticCustomError

from ffdl.core.errors import ManifestError
from ffdl.core.limits import MAX_COUNT, MAX_GROUP_NAME
from ffdl.core.manifest_text import MANIFEST_CODE
from ffdl.core.metric_regex import MetricRegexError, compile_metric_regex
from ffdl.core.units import describe_value

# A container is a path inside its store: a bucket name, or a few safe components.
MAX_CONTAINER_COMPONENT = 255

RESOURCE_SPEC_CODE = "C104"
_RESOURCE_FIELDS = frozenset(
    {"learners", "gpus", "cpus", "memory", "memory_mb", "storage", "storage_mb", "gpu_type"}
    | {"gpu_types", "mix_gpu_types", "elastic"}
)


FIELD_ERROR = "ffdl_manifest_field"
_INTEGER_TEXT = re.compile(r"[+-]?\d{1,18}")


def invalid(reason: str, *at: str | int) -> PydanticCustomError:
    return PydanticCustomError(FIELD_ERROR, "{reason}", {"reason": reason, "at": at})


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and _INTEGER_TEXT.fullmatch(value.strip()):
        return int(value.strip())
    return None


def integer_field(
    minimum: int | None = None, maximum: int | None = None, *, nullable: bool = False
) -> BeforeValidator:
    expected = "an integer" if minimum is None else f"an integer >= {minimum}"
    if minimum is not None and maximum is not None:
        expected = f"an integer between {minimum} and {maximum}"

    def check(value: object) -> int | None:
        if value is None and nullable:
            return None
        number = _as_int(value)
        if (
            number is None
            or (minimum is not None and number < minimum)
            or (maximum is not None and number > maximum)
        ):
            raise invalid(f"must be {expected}, got {describe_value(value)}")
        if number > MAX_COUNT:
            raise invalid(f"is too large (at most {MAX_COUNT}), got {describe_value(value)}")
        return number

    return BeforeValidator(check)


def boolean_field() -> BeforeValidator:
    """``true`` or ``false`` as YAML writes them; anything else (``1``, ``"yes"``) is refused
    rather than guessed."""

    def check(value: object) -> bool:
        if not isinstance(value, bool):
            raise invalid(f"must be true or false, got {describe_value(value)}")
        return value

    return BeforeValidator(check)


def positive_number(*, nullable: bool = False) -> BeforeValidator:
    def check(value: object) -> float | None:
        if value is None and nullable:
            return None
        number: float | None = None
        if isinstance(value, int | float | str) and not isinstance(value, bool):
            try:
                number = float(value)
            except (ValueError, OverflowError):
                number = None
        if number is None or not math.isfinite(number) or number <= 0:
            raise invalid(f"must be a number > 0, got {describe_value(value)}")
        if number > MAX_COUNT:
            raise invalid(f"is too large (at most {MAX_COUNT}), got {describe_value(value)}")
        return number

    return BeforeValidator(check)


def text_field(
    *,
    required: bool = False,
    nullable: bool = False,
    strip: bool = True,
    lower: bool = False,
    max_length: int | None = None,
) -> BeforeValidator:
    """A string field; numbers are taken as text (``version: 1.0``). ``required``: non-blank."""

    def check(value: object) -> str | None:
        if value is None:
            if nullable:
                return None
            if required:
                raise invalid("is required")
            return ""
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise invalid(f"must be a string, got {describe_value(value)}")
        text = value if isinstance(value, str) else str(value)
        if strip:
            text = text.strip()
        if required and not text.strip():
            raise invalid("must not be blank")
        if max_length is not None and len(text) > max_length:
            raise invalid(f"must be at most {max_length} characters, got {len(text)}")
        return text.lower() if lower else text

    return BeforeValidator(check)


def name_list(value: object) -> list[str]:
    """A list of distinct non-blank names (``gpu_types: [h100, a100]``); one name alone is
    taken as a list of one."""
    if value is None:
        return []
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise invalid(f"must be a list of names, got {describe_value(value)}")
    names: list[str] = []
    for index, item in enumerate(items):
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise invalid(f"must be a name, got {describe_value(item)}", index)
        name = str(item).strip()
        if not name:
            raise invalid("must not be blank", index)
        if name in names:
            raise invalid(f"duplicates {name!r}", index)
        names.append(name)
    return names


def string_map(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise invalid(f"must be a mapping, got {describe_value(value)}")
    result: dict[str, str] = {}
    for key, item in value.items():
        if isinstance(item, bool) or item is None:
            result[str(key)] = "" if item is None else str(item).lower()
        elif isinstance(item, str | int | float):
            result[str(key)] = str(item)
        else:
            raise invalid(f"must be a string, got {describe_value(item)}", str(key))
    return result


def group_names(value: object) -> object:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise invalid(f"must be a mapping, got {describe_value(value)}")
    groups = {str(key): item for key, item in value.items()}
    for name in groups:
        if len(name) > MAX_GROUP_NAME:
            raise invalid(f"group names must be at most {MAX_GROUP_NAME} characters", name)
    return groups


def list_or_empty(value: object) -> object:
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise invalid(f"must be a list, got {describe_value(value)}")
    return list(value)


def one_of(
    choices: tuple[str, ...],
    hint: str,
    *,
    aliases: Mapping[str, str] | None = None,
    nullable: bool = False,
) -> BeforeValidator:
    """A choice among lower-case words; input is matched case-insensitively."""

    def check(value: object) -> str | None:
        if value is None and nullable:
            return None
        chosen = value.strip().lower() if isinstance(value, str) else ""
        chosen = (aliases or {}).get(chosen, chosen)
        if chosen not in choices:
            raise invalid(f"must be {hint}, got {describe_value(value)}")
        return chosen

    return BeforeValidator(check)


def compiles(pattern: str) -> str:
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as error:
        raise invalid(f"is not a valid regular expression: {error}") from None
    return pattern


def metric_regex(pattern: str) -> str:
    """An FfDL metric regex (``%{FLOAT:acc}``, Go's ``(?<name>...)``) that compiles."""
    try:
        compile_metric_regex(pattern)
    except MetricRegexError as error:
        raise invalid(str(error)) from None
    return pattern


# FfDL's value types (its ``Any.type``); the platform stores numbers, so a STRING value is
# kept when its text is a number.
METRIC_VALUE_TYPES = ("FLOAT", "INT", "STRING", "JSONSTRING")


def metric_value_type(value: object) -> str:
    chosen = value.strip().upper() if isinstance(value, str) else ""
    if chosen not in METRIC_VALUE_TYPES:
        expected = ", ".join(METRIC_VALUE_TYPES)
        raise invalid(f"must be one of {expected}, got {describe_value(value)}")
    return chosen


def typed_values(default_type: str) -> BeforeValidator:
    """A map of metric values in FfDL's typed form (``{type: FLOAT, value: "$acc"}``) or
    the short form (``"$acc"``, typed ``default_type``)."""

    def check(value: object) -> dict[str, object]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise invalid(f"must be a mapping, got {describe_value(value)}")
        result: dict[str, object] = {}
        for key, item in value.items():
            if isinstance(item, Mapping):
                result[str(key)] = {"type": default_type, **item}
            elif isinstance(item, str | int | float) and not isinstance(item, bool):
                result[str(key)] = {"type": default_type, "value": str(item)}
            else:
                expected = "a string or a mapping with type and value"
                raise invalid(f"must be {expected}, got {describe_value(item)}", str(key))
        return result

    return BeforeValidator(check)


def placement_shape(value: object) -> object:
    if value is None:
        return {}
    if isinstance(value, str):
        return {"policy": value}
    return value


def safe_container(name: str) -> str:
    """A container is joined to its store's path: it must stay a relative path inside it.

    FfDL's buckets are single names; a relative path of several components (``sets/mnist``)
    is accepted too, as long as no component is empty, ``.`` or ``..``.
    """
    if "\x00" in name or "\\" in name:
        raise invalid(f"must be a plain name, got {describe_value(name)}")
    if name.startswith("/"):
        raise invalid(f"must be a name inside the store, not an absolute path, got {name!r}")
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise invalid(
            f"must be a name or a relative path without empty, '.' or '..' parts, got {name!r}"
        )
    if any(len(part.encode()) > MAX_CONTAINER_COMPONENT for part in parts):
        raise invalid(f"has a part longer than {MAX_CONTAINER_COMPONENT} bytes")
    return str(PurePosixPath(name))


# Fields that the manifest writes inside another: errors name them where they were written.
_WRITTEN_IN = {"local_batch_size_by_type": "local_batch_size"}


def as_manifest_error(detail: ErrorDetails) -> ManifestError:
    location: list[str | int] = [
        _WRITTEN_IN.get(part, part) if isinstance(part, str) else part for part in detail["loc"]
    ]
    context = detail.get("ctx") or {}
    if detail["type"] == FIELD_ERROR:
        reason = str(context["reason"])
        location.extend(context.get("at", ()))
    else:
        reason = _reason_for(detail["type"], detail["input"], context)
    root = location[0] if location else "manifest"
    return ManifestError(_dotted(location) or "manifest", reason, code=code_for(str(root)))


# pydantic's error types (by prefix) for the checks pydantic itself makes -> our wording.
_EXPECTATIONS = (
    ("model", "a mapping"),
    ("dict", "a mapping"),
    ("mapping", "a mapping"),
    ("list", "a list"),
    ("tuple", "a list"),
    ("string", "a string"),
    ("int", "an integer"),
    ("float", "a number"),
    ("finite", "a number"),
)


def _reason_for(error_type: str, value: object, context: Mapping[str, Any]) -> str:
    if error_type == "missing":
        return "is required"
    if error_type == "literal_error":
        return f"must be one of {context.get('expected', '?')}, got {describe_value(value)}"
    for prefix, expected in _EXPECTATIONS:
        if error_type.startswith(prefix):
            return f"must be {expected}, got {describe_value(value)}"
    return f"is not valid, got {describe_value(value)}"


def _dotted(location: list[str | int]) -> str:
    parts = (f"[{part}]" if isinstance(part, int) else f".{part}" for part in location)
    return "".join(parts).removeprefix(".")


def code_for(root_field: str) -> str:
    return RESOURCE_SPEC_CODE if root_field in _RESOURCE_FIELDS else MANIFEST_CODE
