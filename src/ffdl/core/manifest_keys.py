"""Keys a manifest's sections know, and what to do with the ones they don't.

Keys that no section knows stay accepted, each reported as a warning (keys of FfDL's format
that ffdl has no use for, a section's ``ignored_keys``, are known and pass silently). A key
that is a near miss of one the section knows (``lerners``, ``Learners``, ``max-restarts``,
``framework.commnd``) is almost always a typo that would silently change the job, so it is
refused, naming the key and the field meant. Near means: the same key but for case and
``-``/``_``, or within a small edit distance (one edit for keys up to 5 characters, two for
longer ones; a swap of neighbours is one edit).

The known keys are read off the manifest's models (field names and aliases), walking into
nested sections, lists of sections and maps of sections; maps with keys of the user's own
(``connection``, ``meta``, metric names) are not checked.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from pydantic import AliasChoices, BaseModel

from ffdl.core.errors import ManifestError
from ffdl.core.manifest_fields import code_for

# Keys the top level knows beyond its model's fields: FfDL's spellings with units.
TOP_LEVEL_SPELLINGS = ("memory", "storage", "expected_duration")


@dataclass(frozen=True)
class Section:
    """The keys one manifest section knows and, for each, the section found under it."""

    keys: frozenset[str]
    children: Mapping[str, tuple[str, type[BaseModel]]]  # key -> (model | list | map, model)


def _keys_of(model: type[BaseModel]) -> dict[str, str]:
    """Every key that names one of ``model``'s fields -> that field's name."""
    found: dict[str, str] = {}
    for name, info in model.model_fields.items():
        found[name] = name
        if info.alias:
            found[info.alias] = name
        alias = info.validation_alias
        if isinstance(alias, AliasChoices):
            found.update({choice: name for choice in alias.choices if isinstance(choice, str)})
        elif isinstance(alias, str):
            found[alias] = name
    return found


def _nested(annotation: Any) -> tuple[str, type[BaseModel]] | None:
    """The section a field holds: itself a model, a list of models or a map of them."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "model", annotation
    origin = typing.get_origin(annotation)
    arguments = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _nested(arguments[0])
    if origin in (typing.Union, types.UnionType):
        found = [n for n in (_nested(a) for a in arguments if a is not type(None)) if n]
        return found[0] if found else None
    if origin is list and arguments:
        inner = _nested(arguments[0])
        return ("list", inner[1]) if inner and inner[0] == "model" else None
    if origin is dict and len(arguments) == 2:
        inner = _nested(arguments[1])
        return ("map", inner[1]) if inner and inner[0] == "model" else None
    return None


@lru_cache(maxsize=64)
def section_of(model: type[BaseModel], extra: tuple[str, ...] = ()) -> Section:
    """The keys ``model`` knows (worked out once per model: every submit walks them)."""
    keys = _keys_of(model)
    children: dict[str, tuple[str, type[BaseModel]]] = {}
    for key, name in keys.items():
        nested = _nested(model.model_fields[name].annotation)
        if nested is not None:
            children[key] = nested
    ignored: tuple[str, ...] = getattr(model, "ignored_keys", ())
    return Section(frozenset(keys) | frozenset(extra) | frozenset(ignored), children)


def _normal(key: str) -> str:
    return key.lower().replace("-", "_")


def edit_distance(a: str, b: str) -> int:
    """Optimal-string-alignment distance: insertions, deletions, substitutions and swaps of
    neighbouring characters each count one."""
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        current = [i] + [0] * len(b)
        for j, cb in enumerate(b, start=1):
            cost = 0 if ca == cb else 1
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                current[j] = min(current[j], previous2[j - 2] + 1)
        previous2, previous = previous, current
    return previous[-1]


def near_miss(key: str, known: frozenset[str]) -> str | None:
    """The known key ``key`` most likely misspells, or None when it is far from all."""
    typed = _normal(key)
    allowed = 1 if len(typed) <= 5 else 2
    best: tuple[int, str] | None = None
    for candidate in sorted(known):
        distance = edit_distance(typed, _normal(candidate))
        if distance <= allowed and (best is None or distance < best[0]):
            best = (distance, candidate)
    return best[1] if best else None


def _path(parent: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else key


def _walk(
    document: Mapping[Any, Any], model: type[BaseModel], where: str, extra: tuple[str, ...] = ()
) -> Iterator[tuple[str, str, str | None]]:
    """(path of the key, the key, the known key it misses or None) for every unknown key."""
    section = section_of(model, extra)
    for key, value in document.items():
        if not isinstance(key, str):
            yield _path(where, str(key)), str(key), None
            continue
        if key not in section.keys:
            # A section whose other keys are names of the user's own, each a section itself
            # (``elastic.local_batch_size``: per-GPU limits by GPU type).
            named = getattr(model, "other_keys_are", None)
            if named is not None and isinstance(value, Mapping):
                yield from _walk(value, named, _path(where, key))
                continue
            yield _path(where, key), key, near_miss(key, section.keys)
            continue
        child = section.children.get(key)
        if child is None or value is None:
            continue
        kind, nested = child
        here = _path(where, key)
        if kind == "model" and isinstance(value, Mapping):
            yield from _walk(value, nested, here)
        elif kind == "list" and isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, Mapping):
                    yield from _walk(item, nested, _path(here, index))
        elif kind == "map" and isinstance(value, Mapping):
            for name, item in value.items():
                if isinstance(item, Mapping):
                    yield from _walk(item, nested, _path(here, str(name)))


def unknown_keys(document: Mapping[Any, Any], model: type[BaseModel]) -> list[str]:
    """The dotted paths of the keys no section knows, far from every key it does.

    Raises ``ManifestError`` for the first key that is a near miss of a known one."""
    unknown: list[str] = []
    for path, key, meant in _walk(document, model, "", TOP_LEVEL_SPELLINGS):
        if meant is not None:
            parent = path[: -len(key)]
            raise ManifestError(
                path,
                f"is not a manifest field: did you mean {parent}{meant}?",
                code=code_for(path.split(".")[0].split("[")[0]),
            )
        unknown.append(path)
    return unknown
