"""The training-job manifest: FfDL's ``manifest.yml``, the model ffdl keeps, and its parser.

``parse_manifest`` accepts FfDL's format unchanged (``memory: 8Gb``, ``type: mount_cos``,
``evaluation_metrics`` groups, ...) plus ffdl's scheduling extensions (priority, placement,
restarts, expected duration, elasticity). Every problem becomes a ``ManifestError`` naming the
offending field by its dotted path (``data_stores[0].type``). The model keeps canonical units:
memory and storage in MiB, durations in seconds; ``to_dict``/``from_dict`` store it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from ffdl.core.errors import ManifestError
from ffdl.core.resources import Resources
from ffdl.core.units import describe_value, parse_duration_s, parse_size_mb

MAX_MANIFEST_BYTES = 1024 * 1024
# YAML aliases let a small document expand into a huge or cyclic structure; a real manifest
# holds a few hundred values.
MAX_MANIFEST_VALUES = 100_000
# Real manifests nest about six levels; deeper input is refused before it costs anything.
MAX_NESTING = 50
MAX_NAME_LENGTH = 200
# Keeps counts storable as 32-bit integers; far beyond any real cluster.
MAX_COUNT = 2**31 - 1

MANIFEST_CODE = "C101"
RESOURCE_SPEC_CODE = "C104"
_RESOURCE_FIELDS = frozenset(
    {"learners", "gpus", "cpus", "memory", "memory_mb", "storage", "storage_mb", "gpu_type"}
    | {"elastic"}
)

REDACTED = "***"
_SECRET_MARKERS = ("password", "secret", "key", "token", "credential")

DATA_STORE_TYPES = ("local", "mount_volume", "s3")
_FFDL_STORE_TYPES = {"s3_datastore": "s3", "mount_cos": "s3"}
_STORES_WITH_PATH = frozenset({"local", "mount_volume"})

_FIELD_ERROR = "ffdl_manifest_field"
_INTEGER_TEXT = re.compile(r"[+-]?\d{1,18}")


def is_secret_key(name: str) -> bool:
    """Whether a connection key names a secret (password, secret, key, token, credential)."""
    lowered = name.lower()
    return any(marker in lowered for marker in _SECRET_MARKERS)


def redact_secrets(connection: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``connection`` with every secret value replaced by ``***``."""
    return {key: REDACTED if is_secret_key(key) else value for key, value in connection.items()}


# Field checks. Each raises a custom pydantic error carrying our own reason, so that users never
# see pydantic's wording; ``at`` extends the location for checks that span several fields.


def _invalid(reason: str, *at: str | int) -> PydanticCustomError:
    return PydanticCustomError(_FIELD_ERROR, "{reason}", {"reason": reason, "at": at})


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


def _integer(
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
            raise _invalid(f"must be {expected}, got {describe_value(value)}")
        if number > MAX_COUNT:
            raise _invalid(f"is too large (at most {MAX_COUNT}), got {describe_value(value)}")
        return number

    return BeforeValidator(check)


def _positive_number(*, nullable: bool = False) -> BeforeValidator:
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
            raise _invalid(f"must be a number > 0, got {describe_value(value)}")
        if number > MAX_COUNT:
            raise _invalid(f"is too large (at most {MAX_COUNT}), got {describe_value(value)}")
        return number

    return BeforeValidator(check)


def _text(
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
                raise _invalid("is required")
            return ""
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise _invalid(f"must be a string, got {describe_value(value)}")
        text = value if isinstance(value, str) else str(value)
        if strip:
            text = text.strip()
        if required and not text.strip():
            raise _invalid("must not be blank")
        if max_length is not None and len(text) > max_length:
            raise _invalid(f"must be at most {max_length} characters, got {len(text)}")
        return text.lower() if lower else text

    return BeforeValidator(check)


def _string_map(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _invalid(f"must be a mapping, got {describe_value(value)}")
    result: dict[str, str] = {}
    for key, item in value.items():
        if isinstance(item, bool) or item is None:
            result[str(key)] = "" if item is None else str(item).lower()
        elif isinstance(item, str | int | float):
            result[str(key)] = str(item)
        else:
            raise _invalid(f"must be a string, got {describe_value(item)}", str(key))
    return result


def _keyed_by_text(value: object) -> object:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _invalid(f"must be a mapping, got {describe_value(value)}")
    return {str(key): item for key, item in value.items()}


def _list_or_empty(value: object) -> object:
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise _invalid(f"must be a list, got {describe_value(value)}")
    return list(value)


def _one_of(
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
            raise _invalid(f"must be {hint}, got {describe_value(value)}")
        return chosen

    return BeforeValidator(check)


def _compiles(pattern: str) -> str:
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as error:
        raise _invalid(f"is not a valid regular expression: {error}") from None
    return pattern


def _placement_shape(value: object) -> object:
    if value is None:
        return {}
    if isinstance(value, str):
        return {"policy": value}
    return value


class _Section(BaseModel):
    # FfDL manifests carry keys ffdl has no use for (e.g. ``event_types``); they are ignored
    # inside sections and reported only at the top level.
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class Container(_Section):
    """A bucket (FfDL calls it a container) inside a data store."""

    container: Annotated[str, _text(required=True)] = Field(
        validation_alias=AliasChoices("container", "bucket")
    )


class DataStore(_Section):
    """Where training data comes from and results go: a local tree, a volume or S3."""

    id: Annotated[str, _text(required=True)]
    type: Annotated[
        Literal["local", "mount_volume", "s3"],
        _one_of(
            DATA_STORE_TYPES,
            "one of local, mount_volume, s3 (or FfDL's s3_datastore, mount_cos)",
            aliases=_FFDL_STORE_TYPES,
        ),
    ]
    training_data: Container | None = None
    training_results: Container | None = None
    connection: Annotated[dict[str, str], BeforeValidator(_string_map)] = Field(
        default_factory=dict
    )

    @model_validator(mode="after")
    def _path_given_for_file_stores(self) -> DataStore:
        if self.type in _STORES_WITH_PATH and not self.connection.get("path", "").strip():
            raise _invalid(f"is required for a {self.type} data store", "connection", "path")
        return self

    def redacted(self) -> dict[str, Any]:
        """This store as JSON-able data, with secret connection values replaced by ``***``."""
        data = self.model_dump(mode="json", by_alias=True)
        data["connection"] = redact_secrets(self.connection)
        return data


class Framework(_Section):
    name: Annotated[str, _text(required=True)]
    version: Annotated[str, _text()] = ""
    image_tag: Annotated[str, _text()] = ""
    command: Annotated[str, _text(required=True)]


class MetricGroup(_Section):
    """One emetrics group: a regex over log lines and how its named groups become metrics."""

    regex: Annotated[str, _text(required=True, strip=False), AfterValidator(_compiles)]
    meta: Annotated[dict[str, str], BeforeValidator(_string_map)] = Field(default_factory=dict)
    scalars: Annotated[dict[str, str], BeforeValidator(_string_map)] = Field(default_factory=dict)
    etimes: Annotated[dict[str, str], BeforeValidator(_string_map)] = Field(default_factory=dict)


class EvaluationMetrics(_Section):
    type: Annotated[str, _text(required=True, lower=True)] = "emetrics"
    in_: Annotated[str | None, _text(nullable=True)] = Field(default=None, alias="in")
    line_lookahead: Annotated[int | None, _integer(minimum=1, nullable=True)] = None
    groups: Annotated[dict[str, MetricGroup], BeforeValidator(_keyed_by_text)] = Field(
        default_factory=dict
    )


class PlacementSpec(_Section):
    """How a gang's learners spread over nodes, and a node label they must share."""

    policy: Annotated[
        Literal["pack", "spread"] | None,
        _one_of(("pack", "spread"), "pack or spread", nullable=True),
    ] = None
    same: Annotated[str | None, _text(required=True, nullable=True)] = None


class IntRange(_Section):
    min: Annotated[int, _integer(minimum=1)]
    max: Annotated[int, _integer(minimum=1)]

    @model_validator(mode="after")
    def _ordered(self) -> IntRange:
        if self.min > self.max:
            raise _invalid(f"must be >= min ({self.min}), got {self.max}", "max")
        return self

    def contains(self, value: int) -> bool:
        return self.min <= value <= self.max


class ScheduleStep(_Section):
    at_epoch: Annotated[int, _integer(minimum=0)]
    gpus: Annotated[int, _integer(minimum=1)]


class ElasticSpec(_Section):
    """The range of total GPUs a job can be rescaled within, and an optional fixed schedule."""

    gpus: IntRange
    batch_size: IntRange | None = None
    schedule: Annotated[list[ScheduleStep], BeforeValidator(_list_or_empty)] = Field(
        default_factory=list
    )

    @model_validator(mode="after")
    def _schedule_within_range(self) -> ElasticSpec:
        previous_epoch: int | None = None
        for index, step in enumerate(self.schedule):
            if not self.gpus.contains(step.gpus):
                reason = f"must lie within elastic.gpus ({self.gpus.min}..{self.gpus.max})"
                raise _invalid(f"{reason}, got {step.gpus}", "schedule", index, "gpus")
            if previous_epoch is not None and step.at_epoch <= previous_epoch:
                reason = f"must be greater than the previous step's at_epoch ({previous_epoch})"
                raise _invalid(f"{reason}, got {step.at_epoch}", "schedule", index, "at_epoch")
            previous_epoch = step.at_epoch
        return self


class Manifest(_Section):
    """A validated training job. Resources are per learner; memory and storage in MiB."""

    name: Annotated[str, _text(required=True, max_length=MAX_NAME_LENGTH)]
    description: Annotated[str, _text()] = ""
    version: Annotated[str, _text()] = "1.0"
    learners: Annotated[int, _integer(minimum=1)] = 1
    gpus: Annotated[int, _integer(minimum=0)] = 0
    cpus: Annotated[float, _positive_number()] = 1.0
    memory_mb: Annotated[int, _integer(minimum=1)] = 1024
    storage_mb: Annotated[int | None, _integer(minimum=1, nullable=True)] = None
    gpu_type: Annotated[str | None, _text(required=True, nullable=True)] = None
    data_stores: Annotated[list[DataStore], BeforeValidator(_list_or_empty)] = Field(
        default_factory=list
    )
    framework: Framework
    evaluation_metrics: EvaluationMetrics | None = None
    priority: Annotated[int, _integer(minimum=0, maximum=100)] = 50
    placement: Annotated[PlacementSpec, BeforeValidator(_placement_shape)] = Field(
        default_factory=PlacementSpec
    )
    max_restarts: Annotated[int, _integer(minimum=0)] = 0
    expected_duration_s: Annotated[float | None, _positive_number(nullable=True)] = None
    elastic: ElasticSpec | None = None
    unknown_fields: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        first_index_of_id: dict[str, int] = {}
        for index, store in enumerate(self.data_stores):
            if store.id in first_index_of_id:
                reason = f"duplicates data_stores[{first_index_of_id[store.id]}].id"
                raise _invalid(f"{reason} {store.id!r}", "data_stores", index, "id")
            first_index_of_id[store.id] = index
        if self.elastic is not None:
            total_gpus = self.gpus * self.learners
            allowed = self.elastic.gpus
            if not allowed.contains(total_gpus):
                reason = f"must contain the job's starting GPUs (gpus * learners = {total_gpus})"
                raise _invalid(f"{reason}, got {allowed.min}..{allowed.max}", "elastic", "gpus")
        return self

    @property
    def resources(self) -> Resources:
        """What one learner needs."""
        return Resources(gpus=self.gpus, cpus=self.cpus, memory_mb=self.memory_mb)

    @property
    def total_resources(self) -> Resources:
        """What the whole gang needs."""
        return self.resources.scaled(self.learners)

    def data_store(self, store_id: str | None = None) -> DataStore | None:
        """The store with ``store_id``, or the first store when no id is given."""
        if store_id is None:
            return self.data_stores[0] if self.data_stores else None
        return next((store for store in self.data_stores if store.id == store_id), None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able data for storage; secrets are kept (see ``redacted_dict`` for display)."""
        return self.model_dump(mode="json", by_alias=True)

    def redacted_dict(self) -> dict[str, Any]:
        """``to_dict`` with every data store's secret connection values replaced by ``***``."""
        data = self.to_dict()
        data["data_stores"] = [store.redacted() for store in self.data_stores]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Manifest:
        """Rebuilds a manifest from ``to_dict`` output (canonical field names and units)."""
        if not isinstance(data, Mapping):
            raise ManifestError("manifest", f"must be a mapping, got {describe_value(data)}")
        _check_value_count(data)
        return _validated(dict(data))


def parse_manifest(source: str | bytes | Mapping[str, Any]) -> Manifest:
    """Parses a manifest given as YAML or JSON text, UTF-8 bytes, or an already-loaded mapping."""
    document = _load_document(source)
    _check_value_count(document)
    return _validated(_canonical_fields(document))


def _load_document(source: str | bytes | Mapping[str, Any]) -> Mapping[Any, Any]:
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
                return json.loads(text)
            except json.JSONDecodeError:
                pass  # YAML's flow style also starts with a brace; let YAML have a go
        return yaml.load(text, Loader=_ShallowSafeLoader)
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


class _ShallowSafeLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, refusing documents nested deeper than ``MAX_NESTING``."""

    nesting = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self.nesting += 1
        try:
            if self.nesting > MAX_NESTING:
                raise ManifestError("manifest", f"is nested more than {MAX_NESTING} levels deep")
            return super().compose_node(parent, index)
        finally:
            self.nesting -= 1


def _yaml_problem(error: yaml.YAMLError) -> str:
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        mark = error.problem_mark
        problem = error.problem or error.context or "syntax error"
        if error.context and problem.startswith("but "):
            problem = f"{error.context} {problem}"
        return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
    return str(error).splitlines()[0] if str(error) else "syntax error"


def _check_value_count(document: Mapping[Any, Any]) -> None:
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


# FfDL's spelling of a field -> ffdl's canonical field and the parser for its units.
_FFDL_UNIT_FIELDS: dict[str, tuple[str, Callable[[Any, str], int | float]]] = {
    "memory": ("memory_mb", parse_size_mb),
    "storage": ("storage_mb", parse_size_mb),
    "expected_duration": ("expected_duration_s", parse_duration_s),
}


def _canonical_fields(document: Mapping[Any, Any]) -> dict[str, Any]:
    """Maps a manifest's top-level keys to model fields, converting units, noting unknowns."""
    fields: dict[str, Any] = {}
    unknown: list[str] = []
    for key, value in document.items():
        if not isinstance(key, str):
            unknown.append(str(key))
        elif key in _FFDL_UNIT_FIELDS:
            canonical, parse = _FFDL_UNIT_FIELDS[key]
            if document.get(canonical) is not None:
                raise ManifestError(
                    key, f"give {key} or {canonical}, not both", code=_code_for(key)
                )
            if value is not None:
                fields[canonical] = parse(value, key)
        elif key in Manifest.model_fields:
            # ``key:`` with nothing after it means "not given", as in FfDL.
            if value is not None:
                fields[key] = value
        else:
            unknown.append(key)
    if unknown:
        given = fields.get("unknown_fields")
        fields["unknown_fields"] = [*given, *unknown] if isinstance(given, list) else unknown
    return fields


def _validated(fields: dict[str, Any]) -> Manifest:
    try:
        return Manifest.model_validate(fields)
    except ValidationError as error:
        raise _as_manifest_error(error.errors(include_url=False)[0]) from None


def _as_manifest_error(detail: ErrorDetails) -> ManifestError:
    location: list[str | int] = list(detail["loc"])
    context = detail.get("ctx") or {}
    if detail["type"] == _FIELD_ERROR:
        reason = str(context["reason"])
        location.extend(context.get("at", ()))
    else:
        reason = _reason_for(detail["type"], detail["input"], context)
    root = location[0] if location else "manifest"
    return ManifestError(_dotted(location) or "manifest", reason, code=_code_for(str(root)))


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


def _code_for(root_field: str) -> str:
    return RESOURCE_SPEC_CODE if root_field in _RESOURCE_FIELDS else MANIFEST_CODE
