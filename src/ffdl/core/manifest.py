"""The training-job manifest: FfDL's ``manifest.yml``, the model ffdl keeps, and its parser.

``parse_manifest`` accepts FfDL's format unchanged (``memory: 8Gb``, ``type: mount_cos``,
``evaluation_metrics`` groups, ...) plus ffdl's scheduling extensions (priority, placement,
restarts, expected duration, elasticity). Every problem becomes a ``ManifestError`` naming the
offending field by its dotted path (``data_stores[0].type``). The model keeps canonical units:
memory and storage in MiB, durations in seconds; ``to_dict``/``from_dict`` store it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, Literal

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
    boolean_field,
    code_for,
    group_names,
    integer_field,
    invalid,
    list_or_empty,
    metric_regex,
    metric_value_type,
    name_list,
    one_of,
    placement_shape,
    positive_number,
    safe_container,
    string_map,
    text_field,
    typed_values,
)
from ffdl.core.manifest_keys import unknown_keys
from ffdl.core.manifest_text import (
    MANIFEST_CODE,
    MAX_MANIFEST_BYTES,
    MAX_MANIFEST_VALUES,
    MAX_NESTING,
    check_value_count,
    load_document,
)
from ffdl.core.metric_regex import compile_metric_regex
from ffdl.core.redact import REDACTED, is_secret_key, redact_secrets
from ffdl.core.resources import Resources
from ffdl.core.units import describe_value, parse_duration_s, parse_size_mb
from ffdl.storage.connection import ConnectionFieldError, S3Connection

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
# FfDL matched a regex over a window of this many lines at most; more is a memory risk.
MAX_LINE_LOOKAHEAD = 1000

# The type a user wrote is kept as written (lower-cased): errors and the REST view name it.
OBJECT_STORE_TYPES = ("s3_datastore", "mount_cos", "s3")
DATA_STORE_TYPES = ("local", "mount_volume", *OBJECT_STORE_TYPES)
# FfDL's Swift-based stores: refused with what to write instead.
LEGACY_STORE_TYPES = {
    "softlayer_objectstore": "FfDL's SoftLayer (Swift) object store",
    "bluemix_objectstore": "FfDL's Bluemix (Swift) object store",
}
_STORES_WITH_PATH = frozenset({"local", "mount_volume"})


class _Section(BaseModel):
    # Keys no section knows are ignored here and reported as warnings (``manifest_keys``,
    # which also refuses near misses of known keys). ``ignored_keys``: keys of FfDL's format
    # that ffdl accepts without a use for them, and without a warning.
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    ignored_keys: ClassVar[tuple[str, ...]] = ()


class Container(_Section):
    """A bucket (FfDL calls it a container) inside a data store."""

    container: Annotated[
        str,
        text_field(required=True, max_length=MAX_CONTAINER_LENGTH),
        AfterValidator(safe_container),
    ] = Field(validation_alias=AliasChoices("container", "bucket"))


def _store_type(value: object) -> object:
    """Refuses FfDL's legacy Swift stores by name, with what to use instead."""
    chosen = value.strip().lower() if isinstance(value, str) else ""
    if chosen in LEGACY_STORE_TYPES:
        raise invalid(
            f"{value!r} ({LEGACY_STORE_TYPES[chosen]}) is not supported; use s3_datastore "
            "or mount_cos with the store's S3 endpoint in connection.auth_url and its HMAC "
            "credentials in connection.user_name and connection.password"
        )
    return value


class DataStore(_Section):
    """Where training data comes from and results go: a local tree, a volume or an S3 store."""

    id: Annotated[str, text_field(required=True, max_length=MAX_LABEL_LENGTH)]
    type: Annotated[
        Literal["local", "mount_volume", "s3_datastore", "mount_cos", "s3"],
        one_of(
            DATA_STORE_TYPES,
            "one of local, mount_volume, s3_datastore, mount_cos (or s3)",
        ),
        BeforeValidator(_store_type),
    ]
    training_data: Container | None = None
    training_results: Container | None = None
    connection: Annotated[dict[str, str], BeforeValidator(string_map)] = Field(default_factory=dict)

    @property
    def is_object_store(self) -> bool:
        """Whether the store is an S3-compatible object store (reached through s3fs)."""
        return self.type in OBJECT_STORE_TYPES

    @model_validator(mode="after")
    def _what_the_type_needs(self) -> DataStore:
        if self.type in _STORES_WITH_PATH and not self.connection.get("path", "").strip():
            raise invalid(f"is required for a {self.type} data store", "connection", "path")
        if self.is_object_store:
            if self.training_data is None:
                raise invalid(
                    f"is required for a {self.type} data store (its bucket in container)",
                    "training_data",
                )
            try:
                S3Connection.from_fields(self.connection)
            except ConnectionFieldError as exc:
                reason = f"is required for a {self.type} data store (or {exc.alternative})"
                raise invalid(reason, "connection", exc.key) from None
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


class MetricValue(_Section):
    """One FfDL typed value: ``value`` is ``$group`` (a capture of the regex) or a constant,
    and ``type`` says how the captured text is read (FLOAT, INT, STRING, JSONSTRING)."""

    type: Annotated[str, BeforeValidator(metric_value_type)] = "FLOAT"
    value: Annotated[str, text_field(required=True)]


class MetricGroup(_Section):
    """One regex group: a regex over log lines and how its named groups become metrics.

    ``scalars`` and ``etimes`` take FfDL's typed form (``{type: FLOAT, value: "$acc"}``) or
    the short form (``"$acc"``); a ``$name`` must be a group the regex captures.
    """

    regex: Annotated[str, text_field(required=True, strip=False), AfterValidator(metric_regex)]
    meta: Annotated[dict[str, str], BeforeValidator(string_map)] = Field(default_factory=dict)
    scalars: Annotated[dict[str, MetricValue], typed_values("FLOAT")] = Field(default_factory=dict)
    etimes: Annotated[dict[str, MetricValue], typed_values("INT")] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _references_are_captured(self) -> MetricGroup:
        captured = compile_metric_regex(self.regex).groupindex
        for section in ("scalars", "etimes"):
            values: dict[str, MetricValue] = getattr(self, section)
            for name, item in values.items():
                reference = item.value.strip()
                if reference.startswith("$") and reference[1:] not in captured:
                    groups = ", ".join(captured) or "none"
                    reason = f"refers to {reference}, which the regex does not capture"
                    raise invalid(f"{reason} (its groups: {groups})", section, name, "value")
        return self


# What ``evaluation_metrics.type`` may say: ffdl's names, then FfDL's other spellings.
METRIC_TYPES = ("emetrics", "regex_extractor", "tensorboard", "log_collector")
_FFDL_METRIC_TYPES = {
    "emetrics_file": "emetrics",
    "emetrics_file_extractor": "emetrics",
    "file": "emetrics",
    "optivist": "emetrics",
    "tensorboard_extractor": "tensorboard",
    "tensorboard_extract": "tensorboard",
    "simple_log_collector": "log_collector",
    "logger": "log_collector",
    "none": "log_collector",
    "null": "log_collector",
    "nil": "log_collector",
}
# Where a metrics directory may lie: the job's own directories, named by their variables.
_METRICS_DIR_VARIABLES = ("JOB_STATE_DIR", "LOG_DIR", "RESULT_DIR", "CHECKPOINT_DIR")


class EvaluationMetrics(_Section):
    """Where a job's evaluation metrics come from (FfDL's ``evaluation_metrics``)."""

    ignored_keys = ("event_types", "eventTypes")

    type: Annotated[
        str,
        one_of(
            METRIC_TYPES,
            "one of emetrics, regex_extractor, tensorboard, log_collector (or FfDL's "
            + ", ".join(_FFDL_METRIC_TYPES)
            + ")",
            aliases=_FFDL_METRIC_TYPES,
        ),
    ] = "emetrics"
    in_: Annotated[str | None, text_field(nullable=True)] = Field(default=None, alias="in")
    line_lookahead: Annotated[
        int | None, integer_field(minimum=1, maximum=MAX_LINE_LOOKAHEAD, nullable=True)
    ] = None
    groups: Annotated[dict[str, MetricGroup], BeforeValidator(group_names)] = Field(
        default_factory=dict
    )

    @model_validator(mode="after")
    def _usable_for_its_type(self) -> EvaluationMetrics:
        if self.type == "regex_extractor" and not self.groups:
            raise invalid("is required for type regex_extractor (at least one group)", "groups")
        if self.type == "tensorboard" and self.in_:
            directory = self.in_
            variable = re.match(r"\$\{?(\w+)\}?", directory)
            inside_job = variable is not None and variable.group(1) in _METRICS_DIR_VARIABLES
            if directory.startswith(("/", "$")) and not inside_job:
                names = ", ".join(f"${name}" for name in _METRICS_DIR_VARIABLES)
                reason = f"must lie in the job's directories: start with one of {names}"
                raise invalid(f"{reason} (or be relative to $LOG_DIR), got {directory!r}", "in")
            if ".." in directory.replace("\\", "/").split("/"):
                raise invalid(f"must not contain '..' parts, got {directory!r}", "in")
        return self


class PlacementSpec(_Section):
    """How a gang's learners spread over nodes, and a node label they must share."""

    policy: Annotated[
        Literal["pack", "spread"] | None,
        one_of(("pack", "spread"), "pack or spread", nullable=True),
    ] = None
    same: Annotated[str | None, text_field(required=True, nullable=True)] = None


ACCUMULATION_HINT = (
    "; if the training loop accumulates gradients over micro-batches, say "
    "elastic.accumulate_gradients: true"
)


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


class LocalBatchRange(IntRange):
    """Per-GPU batch limits: ``min`` and ``max`` for every GPU type, and beside them, under
    a GPU type's name, a ``{min, max}`` of that type's own (``ElasticSpec``)."""

    other_keys_are: ClassVar[type[BaseModel]] = IntRange


class ScheduleStep(_Section):
    at_epoch: Annotated[int, integer_field(minimum=0)]
    gpus: Annotated[int, integer_field(minimum=1)]


class ElasticSpec(_Section):
    """The range of total GPUs a job can be rescaled within, its global batch range, the
    per-GPU batch limits of its model (the most samples one GPU's memory holds, the fewest
    that keep it busy), whether its training loop accumulates gradients (then a GPU's share
    may exceed the maximum, run as several micro-batches per step), whether it takes a new
    batch size while it runs (``rebatch_in_place``: it reads ``ffdl.sdk.context()`` again at
    each epoch, so a batch-only change needs no restart), and an optional fixed schedule."""

    gpus: IntRange
    batch_size: IntRange | None = None
    local_batch_size: LocalBatchRange | None = None
    # Per-GPU limits on particular GPU types, written inside ``local_batch_size`` beside (or
    # instead of) its min and max: ``{min: 4, max: 16, h100: {min: 8, max: 48}}``.
    local_batch_size_by_type: dict[str, IntRange] = Field(default_factory=dict)
    accumulate_gradients: Annotated[bool, boolean_field()] = False
    rebatch_in_place: Annotated[bool, boolean_field()] = False
    schedule: Annotated[list[ScheduleStep], BeforeValidator(list_or_empty)] = Field(
        default_factory=list
    )

    def local_batch_for(self, gpu_type: str | None) -> IntRange | None:
        """The per-GPU batch limits on GPUs of ``gpu_type``: its own, else those for all."""
        if gpu_type and gpu_type in self.local_batch_size_by_type:
            return self.local_batch_size_by_type[gpu_type]
        return self.local_batch_size

    def gpus_for_local_batches(self, gpu_type: str | None = None) -> tuple[int, int] | None:
        """The GPU counts (fewest, most) on which some batch of ``batch_size`` gives each
        GPU (of ``gpu_type``) a share inside its per-GPU limits (above their maximum too,
        for a job that accumulates gradients); None without both."""
        local, batches = self.local_batch_for(gpu_type), self.batch_size
        if local is None or batches is None:
            return None
        fewest = 1 if self.accumulate_gradients else -(-batches.min // local.max)
        return fewest, batches.max // local.min

    @model_validator(mode="before")
    @classmethod
    def _split_local_batches_by_type(cls, data: Any) -> Any:
        """``local_batch_size``'s keys other than min and max name GPU types."""
        if not isinstance(data, dict):
            return data
        local = data.get("local_batch_size")
        if isinstance(local, IntRange) and not isinstance(local, LocalBatchRange):
            return {**data, "local_batch_size": local.model_dump()}
        if not isinstance(local, dict) or set(local) <= {"min", "max"}:
            return data
        by_type = {k: v for k, v in local.items() if k not in ("min", "max")}
        common = {k: v for k, v in local.items() if k in ("min", "max")}
        return {
            **data,
            "local_batch_size": common or None,
            "local_batch_size_by_type": {**data.get("local_batch_size_by_type", {}), **by_type},
        }

    @model_validator(mode="after")
    def _local_batches_reachable(self) -> ElasticSpec:
        kinds: list[str | None] = [None] if self.local_batch_size else []
        for kind in [*kinds, *self.local_batch_size_by_type]:
            at = ("local_batch_size",) if kind is None else ("local_batch_size", kind)
            local = self.local_batch_for(kind)
            assert local is not None
            if self.batch_size is None:
                raise invalid("needs elastic.batch_size: per-GPU limits bound a global batch", *at)
            batches = self.batch_size
            fewest, most = self.gpus_for_local_batches(kind) or (1, 0)
            if max(self.gpus.min, fewest) > min(self.gpus.max, most):
                on = "" if kind is None else f" on {kind} GPUs"
                reason = (
                    f"no GPU count in elastic.gpus ({self.gpus.min}..{self.gpus.max}) can run a "
                    f"batch of elastic.batch_size ({batches.min}..{batches.max}) at "
                    f"{local.min}..{local.max} per GPU{on}"
                )
                if not self.accumulate_gradients and most >= self.gpus.min:
                    reason += ACCUMULATION_HINT
                raise invalid(reason, *at)
        return self

    @model_validator(mode="after")
    def _rebatch_needs_a_batch_range(self) -> ElasticSpec:
        if self.rebatch_in_place and self.batch_size is None:
            raise invalid(
                "is true but there is no batch to change: give elastic.batch_size {min, max}",
                "rebatch_in_place",
            )
        return self

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
    # The GPU types the job accepts, in order of preference (empty: any); ``gpu_type`` is the
    # one-type shorthand. A gang never spans GPU types unless ``mix_gpu_types`` allows it.
    gpu_types: Annotated[list[str], BeforeValidator(name_list)] = Field(default_factory=list)
    mix_gpu_types: Annotated[bool, boolean_field()] = False
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
        if self.gpu_type is not None and self.gpu_types:
            if self.gpu_types != [self.gpu_type]:
                listed = ", ".join(self.gpu_types)
                reason = f"lists {listed} but gpu_type says {self.gpu_type}: give one of the two"
                raise invalid(reason, "gpu_types")
        elif self.gpu_type is not None:
            self.gpu_types = [self.gpu_type]
        elif len(self.gpu_types) == 1:
            self.gpu_type = self.gpu_types[0]
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
            elastic = self.elastic
            kinds: list[str | None] = [None, *elastic.local_batch_size_by_type]
            for kind in kinds:
                local, batches = elastic.local_batch_for(kind), elastic.batch_size
                if local is None or batches is None or not total_gpus:
                    continue
                per_gpu = batches.min / total_gpus
                accumulates = elastic.accumulate_gradients
                if not local.min <= per_gpu <= (math.inf if accumulates else local.max):
                    on = "" if kind is None else f" {kind}"
                    reason = (
                        f"the job starts on {total_gpus}{on} GPU(s) at batch {batches.min} "
                        f"(elastic.batch_size.min), {per_gpu:g} per GPU, outside "
                        f"{local.min}..{local.max}"
                    )
                    if per_gpu > local.max:
                        reason += ACCUMULATION_HINT
                    at = ("elastic", "local_batch_size") + (() if kind is None else (kind,))
                    raise invalid(reason, *at)
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
    """Maps a manifest's top-level keys to model fields, converting units, noting the keys
    no section knows (at any depth) and refusing those that misspell one it does."""
    fields: dict[str, Any] = {}
    unknown = unknown_keys(document, Manifest)
    for key, value in document.items():
        if not isinstance(key, str):
            continue
        if key in _FFDL_UNIT_FIELDS:
            canonical, parse = _FFDL_UNIT_FIELDS[key]
            if document.get(canonical) is not None:
                raise ManifestError(key, f"give {key} or {canonical}, not both", code=code_for(key))
            if value is not None:
                fields[canonical] = parse(value, key)
        elif key in Manifest.model_fields and value is not None:
            # ``key:`` with nothing after it means "not given", as in FfDL.
            fields[key] = value
    if unknown:
        given = fields.get("unknown_fields")
        fields["unknown_fields"] = [*given, *unknown] if isinstance(given, list) else unknown
    return fields


def _validated(fields: dict[str, Any]) -> Manifest:
    try:
        return Manifest.model_validate(fields)
    except ValidationError as error:
        raise as_manifest_error(error.errors(include_url=False)[0]) from None
