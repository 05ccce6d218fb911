"""Reading a manifest's text (YAML or JSON) into plain data, within bounds.

Everything here guards the parser itself: size, nesting, values that YAML aliases expand
to, numbers too long to convert, and duplicate keys. YAML and JSON both let a later key
silently replace an earlier one, so ``gpus: 1`` followed further down by ``gpus: 64`` would
run a job the author never read; a repeated key is refused, naming it and where it is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import yaml

from ffdl.core.errors import ManifestError
from ffdl.core.units import describe_value

MAX_MANIFEST_BYTES = 1024 * 1024
# YAML aliases let a small document expand into a huge or cyclic structure; a real manifest
# holds a few hundred values.
MAX_MANIFEST_VALUES = 100_000
# Real manifests nest about six levels; deeper input is refused before it costs anything.
MAX_NESTING = 50

MANIFEST_CODE = "C101"
_MERGE_TAG = "tag:yaml.org,2002:merge"


def load_document(source: str | bytes | Mapping[str, Any]) -> Mapping[Any, Any]:
    """The manifest as a mapping, from YAML or JSON text, UTF-8 bytes, or a mapping."""
    if isinstance(source, Mapping):
        return source
    if isinstance(source, bytes | bytearray):
        _check_size(len(source))
        try:
            text = bytes(source).decode("utf-8-sig")
        except UnicodeDecodeError as error:
            raise ManifestError(
                "manifest", f"is not valid UTF-8 text (bad byte at offset {error.start})"
            ) from None
    elif isinstance(source, str):
        _check_size(len(source.encode("utf-8", "surrogatepass")))
        text = source
    else:
        raise ManifestError("manifest", f"must be YAML or JSON text, got {describe_value(source)}")
    document = _parse_text(text)
    if document is None:
        raise ManifestError("manifest", "is empty")
    if not isinstance(document, Mapping):
        raise ManifestError(
            "manifest", f"must be a mapping of fields, got {describe_value(document)}"
        )
    return document


def check_value_count(document: Mapping[Any, Any]) -> None:
    """Bounds what validation will walk, whatever the source (YAML aliases, JSON, a mapping)."""
    pending: list[tuple[object, int]] = [(document, 1)]
    seen = 0
    while pending:
        value, depth = pending.pop()
        seen += 1
        if seen > MAX_MANIFEST_VALUES:
            raise ManifestError(
                "manifest",
                f"holds too many values (more than {MAX_MANIFEST_VALUES}, counting what "
                "YAML aliases expand to)",
            )
        if depth > MAX_NESTING:
            raise ManifestError("manifest", f"is nested more than {MAX_NESTING} levels deep")
        if isinstance(value, Mapping):
            pending.extend((item, depth + 1) for item in value.values())
        elif isinstance(value, list | tuple):
            pending.extend((item, depth + 1) for item in value)


def _check_size(size_bytes: int) -> None:
    if size_bytes > MAX_MANIFEST_BYTES:
        raise ManifestError(
            "manifest", f"is too large ({size_bytes} bytes; the limit is {MAX_MANIFEST_BYTES})"
        )


def _parse_text(text: str) -> object:
    if not text.strip():
        return None
    try:
        if text.lstrip().startswith(("{", "[")):
            try:
                return json.loads(text, object_pairs_hook=_unique_json_object)
            except json.JSONDecodeError:
                pass  # YAML's flow style also starts with a brace; let YAML have a go
        return yaml.load(text, Loader=_ManifestLoader)
    except yaml.YAMLError as error:
        raise ManifestError(
            "manifest", f"is not valid YAML or JSON: {_yaml_problem(error)}"
        ) from None
    except RecursionError:  # JSON is parsed without a nesting limit of its own
        raise ManifestError("manifest", f"is nested more than {MAX_NESTING} levels deep") from None
    except ValueError as error:
        # Python refuses to convert integers of thousands of digits; YAML also raises
        # ValueError for impossible timestamps such as 2020-13-45.
        if "integer string conversion" in str(error):
            raise ManifestError("manifest", "holds a number with too many digits") from None
        raise ManifestError("manifest", f"holds a value that cannot be read: {error}") from None


def _unique_json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            # JSON objects are built innermost first, so the enclosing path is not known here.
            raise ManifestError(key, f"duplicate key {key!r}", code=MANIFEST_CODE)
        result[key] = value
    return result


class _ManifestLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, refusing documents nested deeper than ``MAX_NESTING`` and
    mappings that repeat a key (nested ones included)."""

    nesting = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self.nesting += 1
        try:
            if self.nesting > MAX_NESTING:
                raise ManifestError("manifest", f"is nested more than {MAX_NESTING} levels deep")
            return super().compose_node(parent, index)
        finally:
            self.nesting -= 1

    def construct_scalar(self, node: yaml.Node) -> Any:
        value = super().construct_scalar(node)  # type: ignore[arg-type]
        # A folded scalar (``>``) keeps the line breaks around more-indented lines: FfDL's
        # examples write ``command: >`` with ``--flag`` lines indented under the first. FfDL
        # ran a command with its line breaks replaced by spaces, so a folded value is joined
        # the same way; a literal (``|``) value keeps its lines (a multi-line script).
        if getattr(node, "style", None) == ">" and isinstance(value, str):
            return value.replace("\r\n", " ").replace("\n", " ")
        return value

    def get_single_data(self) -> Any:
        node = self.get_single_node()
        if node is None:
            return None
        self._check_unique_keys(node)
        return self.construct_document(node)

    def _check_unique_keys(self, root: yaml.Node) -> None:
        """Walk the composed document (each node once: aliases may share or loop) and refuse
        the first mapping that holds a key twice, naming the key by its dotted path."""
        pending: list[tuple[yaml.Node, str]] = [(root, "")]
        visited: set[int] = set()
        while pending:
            node, path = pending.pop()
            if id(node) in visited:
                continue
            visited.add(id(node))
            if isinstance(node, yaml.SequenceNode):
                pending.extend((item, f"{path}[{i}]") for i, item in enumerate(node.value))
            elif isinstance(node, yaml.MappingNode):
                seen: dict[object, yaml.Node] = {}
                for key_node, value_node in node.value:
                    if key_node.tag == _MERGE_TAG:
                        pending.append((value_node, path))
                        continue
                    key = self._key_of(key_node)
                    child = f"{path}.{key}" if path else str(key)
                    if key is not None:
                        if key in seen:
                            first = seen[key].start_mark.line + 1
                            again = key_node.start_mark.line + 1
                            raise ManifestError(
                                child,
                                f"duplicate key {str(key)!r} (lines {first} and {again})",
                                code=MANIFEST_CODE,
                            )
                        seen[key] = key_node
                    pending.append((value_node, child))

    def _key_of(self, node: yaml.Node) -> object:
        """The key a scalar node constructs to (``1`` and ``0x1`` are the same key); None for
        keys that are not scalars, which the manifest's validation reports itself."""
        if not isinstance(node, yaml.ScalarNode):
            return None
        try:
            key = self.construct_object(node)
            hash(key)
        except (yaml.YAMLError, TypeError, ValueError):
            return None
        return key


def _yaml_problem(error: yaml.YAMLError) -> str:
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        mark = error.problem_mark
        problem = error.problem or error.context or "syntax error"
        if error.context and problem.startswith("but "):
            problem = f"{error.context} {problem}"
        return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
    return str(error).splitlines()[0] if str(error) else "syntax error"
