"""The training-job manifest: FfDL's ``manifest.yml``, the model ffdl keeps, and its parser.

``parse_manifest`` accepts FfDL's format unchanged (``memory: 8Gb``, ``type: mount_cos``,
``evaluation_metrics`` groups, ...) plus ffdl's scheduling extensions (priority, placement,
restarts, expected duration, elasticity). Every problem becomes a ``ManifestError`` naming the
offending field by its dotted path (``data_stores[0].type``). The model keeps canonical units:
memory and storage in MiB, durations in seconds; ``to_dict``/``from_dict`` store it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

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

from ffdl.core.errors import ManifestError
from ffdl.core.limits import MAX_COUNT
from ffdl.core.manifest_fields import (
    RESOURCE_SPEC_CODE,
    as_manifest_error,
    code_for,
    compiles,
    group_names,
    integer_field,
    invalid,
    list_or_empty,
    one_of,
    placement_shape,
    positive_number,
    safe_container,
    string_map,
    text_field,
)
from ffdl.core.manifest_text import (
    MANIFEST_CODE,
    MAX_MANIFEST_BYTES,
    MAX_MANIFEST_VALUES,
    MAX_NESTING,
    check_value_count,
    load_document,
)
from ffdl.core.redact import REDACTED, is_secret_key, redact_secrets
from ffdl.core.resources import Resources
from ffdl.core.units import describe_value, parse_duration_s, parse_size_mb

__all__ = [
    "MANIFEST_CODE",
    "MAX_COUNT",
    "MAX_MANIFEST_BYTES",
    "MAX_MANIFEST_VALUES",
    "MAX_NESTING",
    "REDACTED",
    "RESOURCE_SPEC_CODE",
    "Container",
    "DataStore",
    "ElasticSpec",
    "Manifest",
    "PlacementSpec",
    "is_secret_key",
    "parse_manifest",
    "redact_secrets",
]

MAX_NAME_LENGTH = 200
# Free text is for people to read; a description the size of a novel is an attack on the
# list pages and the database, not documentation.
MAX_DESCRIPTION_LENGTH = 4000
MAX_LABEL_LENGTH = 200
MAX_COMMAND_LENGTH = 64 * 1024
MAX_CONTAINER_LENGTH = 1024

DATA_STORE_TYPES = ("local", "mount_volume", "s3")
_FFDL_STORE_TYPES = {"s3_datastore": "s3", "mount_cos": "s3"}
_STORES_WITH_PATH = frozenset({"local", "mount_volume"})


class _Section(BaseModel):
    # FfDL manifests carry keys ffdl has no use for (e.g. ``event_types``); they are ignored
    # inside sections and reported only at the top level.
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class Container(_Section):
    """A bucket (FfDL calls it a container) inside a data store."""

    container: Annotated[
        str,
        text_field(required=True, max_length=MAX_CONTAINER_LENGTH),
        AfterValidator(safe_container),
    ] = Field(validation_alias=AliasChoices("container", "bucket"))


class DataStore(_Section):
    """Where training data comes from and results go: a local tree, a volume or S3."""

    id: Annotated[str, text_field(required=True, max_length=MAX_LABEL_LENGTH)]
    type: Annotated[
        Literal["local", "mount_volume", "s3"],
        one_of(
            DATA_STORE_TYPES,
            "one of local, mount_volume, s3 (or FfDL's s3_datastore, mount_cos)",
            aliases=_FFDL_STORE_TYPES,
        ),
    ]
    training_data: Container | None = None
    training_results: Container | None = None
    connection: Annotated[dict[str, str], BeforeValidator(string_map)] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _path_given_for_file_stores(self) -> DataStore:
        if self.type in _STORES_WITH_PATH and not self.connection.get("path", "").strip():
            raise invalid(f"is required for a {self.type} data store", "connection", "path")
        return self

    def redacted(self) -> dict[str, Any]:
        """This store as JSON-able data, with secret connection values replaced by ``***``."""
        data = self.model_dump(mode="json", by_alias=True)
        data["connection"] = redact_secrets(self.connection)
        return data


class Framework(_Section):
    name: Annotated[str, text_field(required=True, max_length=MAX_LABEL_LENGTH)]
    version: Annotated[str, text_field(max_length=MAX_LABEL_LENGTH)] = ""
    image_tag: Annotated[str, text_field(max_length=MAX_LABEL_LENGTH)] = ""
    command: Annotated[str, text_field(required=True, max_length=MAX_COMMAND_LENGTH)]


class MetricGroup(_Section):
    """One emetrics group: a regex over log lines and how its named groups become metrics."""

    regex: Annotated[str, text_field(required=True, strip=False), AfterValidator(compiles)]
    meta: Annotated[dict[str, str], BeforeValidator(string_map)] = Field(default_factory=dict)
    scalars: Annotated[dict[str, str], BeforeValidator(string_map)] = Field(default_factory=dict)
    etimes: Annotated[dict[str, str], BeforeValidator(string_map)] = Field(default_factory=dict)


class EvaluationMetrics(_Section):
    type: Annotated[str, text_field(required=True, lower=True)] = "emetrics"
    in_: Annotated[str | None, text_field(nullable=True)] = Field(default=None, alias="in")
    line_lookahead: Annotated[int | None, integer_field(minimum=1, nullable=True)] = None
    groups: Annotated[dict[str, MetricGroup], BeforeValidator(group_names)] = Field(
        default_factory=dict
    )


class PlacementSpec(_Section):
    """How a gang's learners spread over nodes, and a node label they must share."""

    policy: Annotated[
        Literal["pack", "spread"] | None,
        one_of(("pack", "spread"), "pack or spread", nullable=True),
    ] = None
    same: Annotated[str | None, text_field(required=True, nullable=True)] = None


class IntRange(_Section):
    min: Annotated[int, integer_field(minimum=1)]
    max: Annotated[int, integer_field(minimum=1)]

    @model_validator(mode="after")
    def _ordered(self) -> IntRange:
        if self.min > self.max:
            raise invalid(f"must be >= min ({self.min}), got {self.max}", "max")
        return self

    def contains(self, value: int) -> bool:
        return self.min <= value <= self.max


class ScheduleStep(_Section):
    at_epoch: Annotated[int, integer_field(minimum=0)]
    gpus: Annotated[int, integer_field(minimum=1)]


class ElasticSpec(_Section):
    """The range of total GPUs a job can be rescaled within, and an optional fixed schedule."""

    gpus: IntRange
    batch_size: IntRange | None = None
    schedule: Annotated[list[ScheduleStep], BeforeValidator(list_or_empty)] = Field(
        default_factory=list
    )

    @model_validator(mode="after")
    def _schedule_within_range(self) -> ElasticSpec:
        previous_epoch: int | None = None
        for index, step in enumerate(self.schedule):
            if not self.gpus.contains(step.gpus):
                reason = f"must lie within elastic.gpus ({self.gpus.min}..{self.gpus.max})"
                raise invalid(f"{reason}, got {step.gpus}", "schedule", index, "gpus")
            if previous_epoch is not None and step.at_epoch <= previous_epoch:
                reason = f"must be greater than the previous step's at_epoch ({previous_epoch})"
                raise invalid(f"{reason}, got {step.at_epoch}", "schedule", index, "at_epoch")
            previous_epoch = step.at_epoch
        return self


class Manifest(_Section):
    """A validated training job. Resources are per learner; memory and storage in MiB."""

    name: Annotated[str, text_field(required=True, max_length=MAX_NAME_LENGTH)]
    description: Annotated[str, text_field(max_length=MAX_DESCRIPTION_LENGTH)] = ""
    version: Annotated[str, text_field(max_length=MAX_LABEL_LENGTH)] = "1.0"
    learners: Annotated[int, integer_field(minimum=1)] = 1
    gpus: Annotated[int, integer_field(minimum=0)] = 0
    cpus: Annotated[float, positive_number()] = 1.0
    memory_mb: Annotated[int, integer_field(minimum=1)] = 1024
    storage_mb: Annotated[int | None, integer_field(minimum=1, nullable=True)] = None
    gpu_type: Annotated[str | None, text_field(required=True, nullable=True)] = None
    data_stores: Annotated[list[DataStore], BeforeValidator(list_or_empty)] = Field(
        default_factory=list
    )
    framework: Framework
    evaluation_metrics: EvaluationMetrics | None = None
    priority: Annotated[int, integer_field(minimum=0, maximum=100)] = 50
    placement: Annotated[PlacementSpec, BeforeValidator(placement_shape)] = Field(
        default_factory=PlacementSpec
    )
    max_restarts: Annotated[int, integer_field(minimum=0)] = 0
    expected_duration_s: Annotated[float | None, positive_number(nullable=True)] = None
    elastic: ElasticSpec | None = None
    unknown_fields: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        first_index_of_id: dict[str, int] = {}
        for index, store in enumerate(self.data_stores):
            if store.id in first_index_of_id:
                reason = f"duplicates data_stores[{first_index_of_id[store.id]}].id"
                raise invalid(f"{reason} {store.id!r}", "data_stores", index, "id")
            first_index_of_id[store.id] = index
        if self.elastic is not None:
            total_gpus = self.gpus * self.learners
            allowed = self.elastic.gpus
            if not allowed.contains(total_gpus):
                reason = f"must contain the job's starting GPUs (gpus * learners = {total_gpus})"
                raise invalid(f"{reason}, got {allowed.min}..{allowed.max}", "elastic", "gpus")
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
        check_value_count(data)
        return _validated(dict(data))


def parse_manifest(source: str | bytes | Mapping[str, Any]) -> Manifest:
    """Parses a manifest given as YAML or JSON text, UTF-8 bytes, or an already-loaded mapping."""
    document = load_document(source)
    check_value_count(document)
    return _validated(_canonical_fields(document))


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
                raise ManifestError(key, f"give {key} or {canonical}, not both", code=code_for(key))
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
        raise as_manifest_error(error.errors(include_url=False)[0]) from None
