"""Tests for the manifest model and parser (ffdl.core.manifest) against FfDL-shaped manifests."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml

from ffdl.core.errors import BadRequest, ManifestError
from ffdl.core.manifest import (
    MAX_MANIFEST_BYTES,
    DataStore,
    ElasticSpec,
    Manifest,
    MetricValue,
    PlacementSpec,
    parse_manifest,
)
from ffdl.core.resources import Resources

MANIFESTS = Path(__file__).parent / "manifests"
FIXTURES = sorted(path.name for path in MANIFESTS.iterdir())
REMOVE = object()

BASE: dict[str, Any] = {
    "name": "mnist",
    "version": "1.0",
    "gpus": 1,
    "cpus": 2,
    "learners": 2,
    "memory": "2Gb",
    "data_stores": [
        {
            "id": "store",
            "type": "s3_datastore",
            "training_data": {"container": "data"},
            "training_results": {"container": "results"},
            "connection": {"auth_url": "http://127.0.0.1:9000", "user_name": "u", "password": "p"},
        }
    ],
    "framework": {"name": "pytorch", "version": "2.13", "command": "python train.py"},
    "evaluation_metrics": {
        "type": "emetrics",
        "groups": {"accuracy": {"regex": r"acc=(?P<acc>[0-9.]+)", "scalars": {"acc": "acc"}}},
    },
}


def manifest_text(**changes: Any) -> str:
    """BASE as YAML, with top-level keys replaced (or removed with REMOVE)."""
    document = copy.deepcopy(BASE)
    for key, value in changes.items():
        if value is REMOVE:
            document.pop(key, None)
        else:
            document[key] = value
    return yaml.safe_dump(document, sort_keys=False)


def with_store(**changes: Any) -> list[dict[str, Any]]:
    store = copy.deepcopy(BASE["data_stores"][0])
    for key, value in changes.items():
        if value is REMOVE:
            store.pop(key, None)
        else:
            store[key] = value
    return [store]


def load_fixture(name: str) -> Manifest:
    return parse_manifest((MANIFESTS / name).read_text(encoding="utf-8"))


def parse_error(source: str | bytes | dict[str, Any]) -> ManifestError:
    with pytest.raises(ManifestError) as caught:
        parse_manifest(source)
    return caught.value


# --- FfDL fixtures ------------------------------------------------------------------------


class Expected(NamedTuple):
    name: str
    learners: int
    gpus: int
    cpus: float
    memory_mb: int
    framework: tuple[str, str]
    store_type: str | None
    containers: tuple[str, str] | None
    metrics_type: str | None


FIXTURE_EXPECTATIONS: dict[str, Expected] = {
    "tf-model.yml": Expected(
        "tf_convolutional_network_tutorial", 1, 0, 0.5, 954, ("tensorflow", "1.5.0-py3"),
        "mount_cos", ("tf_training_data", "tf_trained_model"), "tensorboard",
    ),
    "tf-hostmount.yml": Expected(
        "tf_convolutional_network_hostmount", 1, 0, 0.25, 954, ("tensorflow", "1.5.0-py3"),
        "mount_volume", ("local-training-data", "local-trained-results"), "tensorboard",
    ),
    "pytorch-model.yml": Expected(
        "mnist-pytorch-model", 1, 0, 1.0, 1000, ("pytorch", "latest"),
        "mount_cos", ("pytorch_training_data", "pytorch_trained_model"), None,
    ),
    "caffe-gpu.yml": Expected(
        "mnist-caffe-gpu-model", 1, 1, 2.0, 300, ("caffe", "gpu"),
        "mount_cos", ("caffe_training_data", "caffe_trained_model"), None,
    ),
    "keras.yml": Expected(
        "keras-mnist-model", 1, 0, 1.0, 954, ("tensorflow", "1.5.0-py3"),
        "mount_cos", ("keras-training-data", "keras-trained-results"), None,
    ),
    "horovod-pytorch.yml": Expected(
        "Distributed-horovod-pytorch", 2, 0, 1.0, 954,
        ("horovod", "0.13.4-tf1.8.0-torch0.4.0-py3.5"),
        "mount_cos", ("horovod_training_data", "horovod_trained_model"), None,
    ),
    "h2o.yml": Expected(
        "h2o3_automl", 2, 0, 0.5, 954, ("h2o3", "latest"),
        "s3_datastore", ("h2o3_training_data", "h2o3_trained_model"), None,
    ),
    "pytorch-distributed-gpu.yml": Expected(
        "pytorch ddl", 2, 1, 8.0, 15259, ("custom", "tomcli/pytorch:latest"),
        "s3_datastore", ("fashion-mnist", "mnist-trained-model"), "tensorboard",
    ),
    "emetrics.yml": Expected(
        "tf_mnist_emetrics", 1, 0, 1.0, 1908, ("tensorflow", "1.5.0-py3"),
        "s3_datastore", ("mnist_training_data", "mnist_trained_model"), "emetrics",
    ),
    "ffdl-extended.yml": Expected(
        "resnet50-elastic", 2, 2, 8.0, 32768, ("pytorch", "2.13"),
        "local", ("cifar10", "resnet-results"), "emetrics",
    ),
    "mnist.json": Expected(
        "mnist-json", 1, 0, 2.0, 512, ("pytorch", "2.13"), None, None, "emetrics"
    ),
}  # fmt: skip


def test_every_fixture_has_expectations() -> None:
    assert set(FIXTURES) == set(FIXTURE_EXPECTATIONS)


@pytest.mark.parametrize("fixture", FIXTURES)
def test_ffdl_fixture_parses_with_expected_values(fixture: str) -> None:
    manifest = load_fixture(fixture)
    expected = FIXTURE_EXPECTATIONS[fixture]
    resources = (manifest.learners, manifest.gpus, manifest.cpus, manifest.memory_mb)
    assert manifest.name == expected.name
    assert resources == (expected.learners, expected.gpus, expected.cpus, expected.memory_mb)
    assert (manifest.framework.name, manifest.framework.version) == expected.framework
    assert manifest.framework.command.strip() == manifest.framework.command != ""
    store = manifest.data_store()
    if expected.store_type is None:
        assert store is None
    else:
        assert store is not None
        assert store.type == expected.store_type
        assert store.training_data is not None and store.training_results is not None
        containers = (store.training_data.container, store.training_results.container)
        assert containers == expected.containers
    metrics_type = manifest.evaluation_metrics.type if manifest.evaluation_metrics else None
    assert metrics_type == expected.metrics_type
    assert manifest.unknown_fields == []


def test_text_fields_of_fixtures() -> None:
    assert load_fixture("tf-model.yml").version == "1.0"
    assert load_fixture("ffdl-extended.yml").version == "2"
    assert load_fixture("ffdl-extended.yml").gpu_type == "nvidia-A100"
    assert load_fixture("pytorch-distributed-gpu.yml").gpu_type == "nvidia-TeslaK80"
    assert load_fixture("caffe-gpu.yml").gpu_type is None


def test_folded_command_keeps_its_words_without_trailing_newline() -> None:
    command = load_fixture("tf-model.yml").framework.command
    assert command.startswith("python3 convolutional_network.py --trainImagesFile")
    assert "${DATA_DIR}/t10k-labels-idx1-ubyte.gz" in command
    assert command.endswith("--trainingIters 2000")


def test_tensorboard_directory_is_read_from_in() -> None:
    metrics = load_fixture("tf-model.yml").evaluation_metrics
    assert metrics is not None
    assert metrics.in_ == "$JOB_STATE_DIR/logs/tb"


def test_host_mount_connection_is_kept() -> None:
    store = load_fixture("tf-hostmount.yml").data_store("hostmount")
    assert store is not None
    assert store.connection == {"type": "host_mount", "name": "host-mount", "path": "/cosdata"}


def test_emetrics_groups_are_parsed() -> None:
    metrics = load_fixture("emetrics.yml").evaluation_metrics
    assert metrics is not None
    assert metrics.in_ == "$JOB_STATE_DIR/logs"
    assert metrics.line_lookahead == 4
    assert list(metrics.groups) == ["accuracy", "loss"]
    accuracy = metrics.groups["accuracy"]
    assert accuracy.regex == r"accuracy = (?P<acc>[0-9.]+), step = (?P<step>\d+)"
    assert accuracy.meta == {"time": "$timestamp"}
    assert accuracy.scalars == {"accuracy": MetricValue(type="FLOAT", value="acc")}
    assert accuracy.etimes == {"iteration": MetricValue(type="INT", value="step")}
    assert metrics.groups["loss"].etimes == {}


def test_ffdl_bucket_is_an_alias_of_container() -> None:
    store = load_fixture("emetrics.yml").data_store()
    assert store is not None and store.training_data is not None
    assert store.training_data.container == "mnist_training_data"


def test_ffdl_extensions_are_parsed() -> None:
    manifest = load_fixture("ffdl-extended.yml")
    assert manifest.priority == 80
    assert manifest.placement == PlacementSpec(policy="spread", same="rack")
    assert manifest.max_restarts == 2
    assert manifest.expected_duration_s == 7200.0
    assert manifest.storage_mb == 9537
    assert manifest.framework.image_tag == "cuda12"
    assert manifest.evaluation_metrics is not None
    assert manifest.evaluation_metrics.type == "emetrics"
    elastic = manifest.elastic
    assert isinstance(elastic, ElasticSpec)
    assert (elastic.gpus.min, elastic.gpus.max) == (2, 8)
    assert elastic.batch_size is not None
    assert (elastic.batch_size.min, elastic.batch_size.max) == (256, 4096)
    assert [(step.at_epoch, step.gpus) for step in elastic.schedule] == [(30, 4), (60, 8)]


def test_defaults_for_a_minimal_manifest() -> None:
    manifest = parse_manifest("name: tiny\nframework: {name: pytorch, command: python t.py}\n")
    assert manifest.description == ""
    assert manifest.version == "1.0"
    assert (manifest.learners, manifest.gpus, manifest.cpus, manifest.memory_mb) == (
        1,
        0,
        1.0,
        1024,
    )
    assert manifest.storage_mb is None and manifest.gpu_type is None
    assert manifest.data_stores == [] and manifest.evaluation_metrics is None
    assert manifest.priority == 50 and manifest.max_restarts == 0
    assert manifest.placement == PlacementSpec()
    assert manifest.expected_duration_s is None and manifest.elastic is None


def test_resources_are_per_learner_and_total_scales_by_learners() -> None:
    manifest = load_fixture("pytorch-distributed-gpu.yml")
    assert manifest.resources == Resources(gpus=1, cpus=8.0, memory_mb=15259)
    assert manifest.total_resources == Resources(gpus=2, cpus=16.0, memory_mb=30518)


def test_data_store_lookup() -> None:
    manifest = load_fixture("h2o.yml")
    first = manifest.data_store()
    assert first is not None and first.id == "il-internal-os"
    assert manifest.data_store("il-internal-os") is first
    assert manifest.data_store("missing") is None


# --- accepted variations ------------------------------------------------------------------


def test_numbers_are_taken_as_text_where_text_is_expected() -> None:
    framework = {"name": "tensorflow", "version": 1.5, "command": "python t.py"}
    manifest = parse_manifest(manifest_text(version=2.0, framework=framework))
    assert manifest.version == "2.0"
    assert manifest.framework.version == "1.5"
    assert parse_manifest("name: 42\nframework: {name: x, command: y}\n").name == "42"


def test_connection_values_are_coerced_to_text() -> None:
    connection = {"path": "/data", "port": 9000, "secure": True, "region": None}
    store = parse_manifest(
        manifest_text(data_stores=with_store(type="local", connection=connection))
    )
    assert store.data_stores[0].connection == {
        "path": "/data",
        "port": "9000",
        "secure": "true",
        "region": "",
    }


@pytest.mark.parametrize(
    ("placement", "expected"),
    [
        ("pack", PlacementSpec(policy="pack")),
        ("SPREAD", PlacementSpec(policy="spread")),
        ({"policy": "pack", "same": "rack"}, PlacementSpec(policy="pack", same="rack")),
        ({"same": "rack"}, PlacementSpec(same="rack")),
        (None, PlacementSpec()),
    ],
)
def test_placement_forms(placement: object, expected: PlacementSpec) -> None:
    assert parse_manifest(manifest_text(placement=placement)).placement == expected


@pytest.mark.parametrize(
    ("ffdl_type", "expected"),
    [("mount_cos", "mount_cos"), ("S3_Datastore", "s3_datastore"), ("s3", "s3")],
)
def test_object_store_types_keep_the_name_the_user_wrote(ffdl_type: str, expected: str) -> None:
    manifest = parse_manifest(manifest_text(data_stores=with_store(type=ffdl_type)))
    assert manifest.data_stores[0].type == expected
    assert manifest.data_stores[0].is_object_store


def test_metrics_type_is_matched_without_case_and_ffdl_synonyms_are_accepted() -> None:
    metrics = {"type": "OptiVist", "in": "/logs"}
    manifest = parse_manifest(manifest_text(evaluation_metrics=metrics))
    assert manifest.evaluation_metrics is not None
    assert manifest.evaluation_metrics.type == "emetrics"


def test_keys_with_empty_values_count_as_not_given() -> None:
    text = manifest_text() + "description:\nstorage:\nplacement:\nexpected_duration:\n"
    manifest = parse_manifest(text)
    assert manifest.description == "" and manifest.storage_mb is None
    assert manifest.expected_duration_s is None


def test_json_bytes_and_mappings_are_accepted() -> None:
    from_yaml = parse_manifest(manifest_text())
    assert parse_manifest(json.dumps(BASE)) == from_yaml
    assert parse_manifest(json.dumps(BASE).encode("utf-8")) == from_yaml
    assert parse_manifest(manifest_text().encode("utf-8")) == from_yaml
    assert parse_manifest(copy.deepcopy(BASE)) == from_yaml
    assert parse_manifest(b"\xef\xbb\xbf" + manifest_text().encode("utf-8")) == from_yaml


def test_unknown_top_level_fields_are_reported_in_order() -> None:
    text = manifest_text() + "trainer: fast\nautoscale: true\n7: seven\n"
    manifest = parse_manifest(text)
    assert manifest.unknown_fields == ["trainer", "autoscale", "7"]
    assert manifest.name == "mnist"


# --- invalid manifests --------------------------------------------------------------------


def stores(**changes: Any) -> dict[str, Any]:
    return {"data_stores": with_store(**changes)}


def metric_groups(**groups: Any) -> dict[str, Any]:
    return {"evaluation_metrics": {"groups": groups}}


def elastic(low: int = 1, high: int = 8, **parts: Any) -> dict[str, Any]:
    return {"elastic": {"gpus": {"min": low, "max": high}, **parts}}


def schedule(*steps: tuple[int, int]) -> list[dict[str, int]]:
    return [{"at_epoch": at_epoch, "gpus": gpus} for at_epoch, gpus in steps]


INVALID_CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("missing name", {"name": REMOVE}, "name", "C101"),
    ("blank name", {"name": "   "}, "name", "C101"),
    ("name too long", {"name": "n" * 201}, "name", "C101"),
    ("name not text", {"name": ["a"]}, "name", "C101"),
    ("missing framework", {"framework": REMOVE}, "framework", "C101"),
    ("framework not a mapping", {"framework": "tensorflow"}, "framework", "C101"),
    ("missing framework name", {"framework": {"command": "x"}}, "framework.name", "C101"),
    ("missing command", {"framework": {"name": "tensorflow"}}, "framework.command", "C101"),
    ("blank command", {"framework": {"name": "t", "command": " \n"}}, "framework.command", "C101"),
    ("learners zero", {"learners": 0}, "learners", "C104"),
    ("learners negative", {"learners": -2}, "learners", "C104"),
    ("learners not an int", {"learners": "two"}, "learners", "C104"),
    ("learners fractional", {"learners": 1.5}, "learners", "C104"),
    ("learners bool", {"learners": True}, "learners", "C104"),
    ("gpus negative", {"gpus": -1}, "gpus", "C104"),
    ("gpus bool", {"gpus": False}, "gpus", "C104"),
    ("gpus huge", {"gpus": 2**40}, "gpus", "C104"),
    ("cpus zero", {"cpus": 0}, "cpus", "C104"),
    ("cpus negative", {"cpus": -0.5}, "cpus", "C104"),
    ("cpus words", {"cpus": "lots"}, "cpus", "C104"),
    ("cpus nan", {"cpus": float("nan")}, "cpus", "C104"),
    ("memory bad unit", {"memory": "8Gx"}, "memory", "C104"),
    ("memory negative", {"memory": "-2Gb"}, "memory", "C104"),
    ("memory zero", {"memory": 0}, "memory", "C104"),
    ("memory twice", {"memory_mb": 2048}, "memory", "C104"),
    ("storage bad", {"storage": "lots"}, "storage", "C104"),
    ("gpu_type blank", {"gpu_type": ""}, "gpu_type", "C104"),
    ("data_stores not a list", {"data_stores": {"id": "x"}}, "data_stores", "C101"),
    ("bad store type", stores(type="ftp"), "data_stores[0].type", "C101"),
    ("missing store type", stores(type=REMOVE), "data_stores[0].type", "C101"),
    ("missing store id", stores(id=REMOVE), "data_stores[0].id", "C101"),
    ("missing container", stores(training_data={}),
     "data_stores[0].training_data.container", "C101"),
    ("local store without path", stores(type="local"), "data_stores[0].connection.path", "C101"),
    ("connection value not text", stores(connection={"password": ["a"]}),
     "data_stores[0].connection.password", "C101"),
    ("duplicate store ids", {"data_stores": with_store() * 2}, "data_stores[1].id", "C101"),
    ("bad regex", metric_groups(accuracy={"regex": "acc=(?P<acc>[0-9.]+"}),
     "evaluation_metrics.groups.accuracy.regex", "C101"),
    ("missing regex", metric_groups(loss={"scalars": {"loss": "loss"}}),
     "evaluation_metrics.groups.loss.regex", "C101"),
    ("line_lookahead zero", {"evaluation_metrics": {"line_lookahead": 0}},
     "evaluation_metrics.line_lookahead", "C101"),
    ("priority too high", {"priority": 101}, "priority", "C101"),
    ("priority negative", {"priority": -1}, "priority", "C101"),
    ("bad placement policy", {"placement": "scatter"}, "placement.policy", "C101"),
    ("bad placement mapping", {"placement": {"policy": "random"}}, "placement.policy", "C101"),
    ("placement list", {"placement": ["pack"]}, "placement", "C101"),
    ("max_restarts negative", {"max_restarts": -1}, "max_restarts", "C101"),
    ("bad expected_duration", {"expected_duration": "soon"}, "expected_duration", "C101"),
    ("elastic min above max", elastic(8, 4), "elastic.gpus.max", "C104"),
    ("elastic min zero", elastic(0, 4), "elastic.gpus.min", "C104"),
    ("elastic without gpus", {"elastic": {"schedule": []}}, "elastic.gpus", "C104"),
    ("elastic range excludes gpus * learners", elastic(4, 8), "elastic.gpus", "C104"),
    ("schedule out of range", elastic(schedule=schedule((10, 16))),
     "elastic.schedule[0].gpus", "C104"),
    ("schedule not increasing", elastic(schedule=schedule((10, 4), (10, 8))),
     "elastic.schedule[1].at_epoch", "C104"),
    ("schedule negative epoch", elastic(schedule=schedule((-1, 4))),
     "elastic.schedule[0].at_epoch", "C104"),
    ("batch_size min above max", elastic(batch_size={"min": 512, "max": 64}),
     "elastic.batch_size.max", "C104"),
    ("local batch without a global batch", elastic(local_batch_size={"min": 8, "max": 64}),
     "elastic.local_batch_size", "C104"),
    ("local batch min above max",
     elastic(batch_size={"min": 64, "max": 512}, local_batch_size={"min": 64, "max": 8}),
     "elastic.local_batch_size.max", "C104"),
    ("no gpu count fits the local limits",
     elastic(batch_size={"min": 64, "max": 128}, local_batch_size={"min": 256, "max": 512}),
     "elastic.local_batch_size", "C104"),
    ("the starting size does not fit the local limits",
     elastic(batch_size={"min": 512, "max": 1024}, local_batch_size={"min": 16, "max": 128}),
     "elastic.local_batch_size", "C104"),
    ("accumulate_gradients not a boolean", elastic(accumulate_gradients="yes"),
     "elastic.accumulate_gradients", "C104"),
    ("accumulation does not lift the per-GPU minimum",
     elastic(batch_size={"min": 16, "max": 32}, local_batch_size={"min": 64, "max": 128},
             accumulate_gradients=True),
     "elastic.local_batch_size", "C104"),
    ("rebatch_in_place not a boolean",
     elastic(batch_size={"min": 64, "max": 128}, rebatch_in_place=1),
     "elastic.rebatch_in_place", "C104"),
    ("rebatch_in_place without a batch range", elastic(rebatch_in_place=True),
     "elastic.rebatch_in_place", "C104"),
    ("a type's local batch min above max",
     elastic(batch_size={"min": 64, "max": 512},
             local_batch_size={"min": 8, "max": 64, "h100": {"min": 64, "max": 8}}),
     "elastic.local_batch_size.h100.max", "C104"),
    ("a type's local batch not a range",
     elastic(batch_size={"min": 64, "max": 512}, local_batch_size={"h100": {"min": 8}}),
     "elastic.local_batch_size.h100.max", "C104"),
    ("the starting size does not fit a type's local limits",
     elastic(batch_size={"min": 64, "max": 512},
             local_batch_size={"min": 8, "max": 64, "a100": {"min": 1, "max": 16}}),
     "elastic.local_batch_size.a100", "C104"),
    ("a near miss of max beside the types",
     elastic(batch_size={"min": 64, "max": 512},
             local_batch_size={"min": 8, "mxa": 64, "h100": {"min": 8, "max": 64}}),
     "elastic.local_batch_size.mxa", "C104"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "field", "code"),
    [case[1:] for case in INVALID_CASES],
    ids=[case[0] for case in INVALID_CASES],
)
def test_invalid_manifest_names_field_and_code(
    changes: dict[str, Any], field: str, code: str
) -> None:
    error = parse_error(manifest_text(**changes))
    assert (error.field, error.code) == (field, code)
    assert isinstance(error, BadRequest) and error.http_status == 400
    assert error.detail == {"field": field, "reason": error.reason}
    assert error.message == f"invalid manifest: {field}: {error.reason}"
    for pydantic_wording in ("Input should", "Field required", "Value error", "validation error"):
        assert pydantic_wording not in error.reason


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"learners": "two"}, "must be an integer >= 1, got 'two'"),
        ({"learners": True}, "must be an integer >= 1, got true"),
        ({"priority": 150}, "must be an integer between 0 and 100, got 150"),
        ({"cpus": 0}, "must be a number > 0, got 0"),
        ({"framework": {"name": "tensorflow"}}, "is required"),
        ({"memory": "8Gx"}, "unknown size unit 'Gx' (use mb, mib, gb, gib, tb, tib)"),
        ({"placement": "scatter"}, "must be pack or spread, got 'scatter'"),
        (elastic(8, 4), "must be >= min (8), got 4"),
    ],
)
def test_reasons_are_readable(changes: dict[str, Any], reason: str) -> None:
    assert parse_error(manifest_text(**changes)).reason == reason


def test_bad_regex_reason_says_what_is_wrong() -> None:
    metrics = {"groups": {"accuracy": {"regex": "(unclosed"}}}
    error = parse_error(manifest_text(evaluation_metrics=metrics))
    assert error.reason.startswith("is not a valid regular expression")
    assert "accuracy" in error.field


def test_elastic_range_reason_shows_the_starting_gpus() -> None:
    error = parse_error(manifest_text(**elastic(4, 8)))
    assert "gpus * learners = 2" in error.reason


@pytest.mark.parametrize(
    "source",
    [
        "name: [unclosed\nframework: {name: x\n",
        "name: x\n  framework: :\n\t- bad",
        "---\nname: a\n---\nname: b\n",
        '{"name": "x", "framework": ',
    ],
)
def test_text_that_is_not_yaml_is_rejected(source: str) -> None:
    error = parse_error(source)
    assert (error.field, error.code) == ("manifest", "C101")
    assert error.reason.startswith("is not valid YAML or JSON")


@pytest.mark.parametrize("source", ["- name: x\n- name: y\n", "just a string\n", "42\n", "[1, 2]"])
def test_documents_that_are_not_mappings_are_rejected(source: str) -> None:
    error = parse_error(source)
    assert (error.field, error.code) == ("manifest", "C101")
    assert error.reason.startswith("must be a mapping of fields")


@pytest.mark.parametrize("source", ["", "   \n\n", "# nothing here\n", b"", "---\n"])
def test_empty_documents_are_rejected(source: str | bytes) -> None:
    error = parse_error(source)
    assert (error.field, error.code, error.reason) == ("manifest", "C101", "is empty")


def test_oversized_manifest_is_rejected_before_parsing() -> None:
    padding = "#" + "x" * 1023 + "\n"
    text = manifest_text() + padding * (MAX_MANIFEST_BYTES // len(padding) + 1)
    assert len(text) > MAX_MANIFEST_BYTES
    for source in (text, text.encode("utf-8")):
        error = parse_error(source)
        assert (error.field, error.code) == ("manifest", "C101")
        assert "too large" in error.reason


def test_manifest_just_under_the_limit_parses() -> None:
    text = manifest_text()
    text += "#" * (MAX_MANIFEST_BYTES - len(text.encode("utf-8")) - 1) + "\n"
    assert len(text.encode("utf-8")) == MAX_MANIFEST_BYTES
    assert parse_manifest(text).name == "mnist"


def test_invalid_utf8_is_rejected() -> None:
    error = parse_error(manifest_text().encode("utf-8") + b"description: \xff\xfe\n")
    assert (error.field, error.code) == ("manifest", "C101")
    assert "UTF-8" in error.reason


def test_alias_expansion_bomb_is_rejected() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    text = manifest_text() + "\n".join(lines) + "\n"
    error = parse_error(text)
    assert (error.field, error.code) == ("manifest", "C101")
    assert "too many values" in error.reason


def test_deep_nesting_is_rejected() -> None:
    block_style = "a:\n" + "".join(" " * depth + "b:\n" for depth in range(1, 100))
    json_text = '{"name": ' + "[" * 60 + "]" * 60 + "}"
    sources = ("name: " + "[" * 1500 + "]" * 1500 + "\n", block_style, "[" * 5000, json_text)
    for source in sources:
        error = parse_error(source)
        assert (error.field, error.code) == ("manifest", "C101")
        assert error.reason == "is nested more than 50 levels deep"


def test_nesting_up_to_the_limit_is_read() -> None:
    manifest = parse_manifest(manifest_text() + "extra: " + "[" * 49 + "]" * 49 + "\n")
    assert manifest.unknown_fields == ["extra"]


def test_integers_too_long_to_read_are_rejected() -> None:
    error = parse_error(manifest_text() + "extra: " + "9" * 5000 + "\n")
    assert (error.field, error.code) == ("manifest", "C101")
    assert error.reason == "holds a number with too many digits"


def test_non_text_source_is_rejected() -> None:
    error = parse_error(12345)  # type: ignore[arg-type]
    assert error.field == "manifest"


# --- secrets and storage ------------------------------------------------------------------


def test_redacted_store_hides_secret_connection_values() -> None:
    connection = {
        "auth_url": "http://127.0.0.1:9000",
        "user_name": "admin",
        "password": "hunter2",
        "AWS_Secret_Access_Key": "s3cr3t",
        "access_key_id": "AKIA",
        "session_token": "tok",
        "Credentials": "cred",
    }
    store = DataStore.model_validate(
        {"id": "s", "type": "s3", "connection": connection, "training_data": {"bucket": "b"}}
    )
    redacted = store.redacted()
    assert redacted["connection"] == {
        "auth_url": "http://127.0.0.1:9000",
        "user_name": "admin",
        "password": "***",
        "AWS_Secret_Access_Key": "***",
        "access_key_id": "***",
        "session_token": "***",
        "Credentials": "***",
    }
    assert redacted["id"] == "s" and redacted["training_data"] == {"container": "b"}
    assert store.connection["password"] == "hunter2"
    assert "hunter2" not in json.dumps(redacted)


def test_redacted_dict_hides_secrets_but_to_dict_keeps_them() -> None:
    manifest = load_fixture("tf-model.yml")
    assert manifest.to_dict()["data_stores"][0]["connection"]["password"] == "test"
    shown = manifest.redacted_dict()
    assert shown["data_stores"][0]["connection"]["password"] == "***"
    assert shown["data_stores"][0]["connection"]["user_name"] == "test"
    assert {key: value for key, value in shown.items() if key != "data_stores"} == {
        key: value for key, value in manifest.to_dict().items() if key != "data_stores"
    }


@pytest.mark.parametrize("fixture", FIXTURES)
def test_to_dict_from_dict_round_trip(fixture: str) -> None:
    manifest = load_fixture(fixture)
    stored = json.loads(json.dumps(manifest.to_dict()))
    restored = Manifest.from_dict(stored)
    assert restored == manifest
    assert restored.to_dict() == stored
    assert parse_manifest(json.dumps(stored)) == manifest


def test_to_dict_uses_canonical_names() -> None:
    data = load_fixture("emetrics.yml").to_dict()
    assert data["memory_mb"] == 1908 and "memory" not in data
    assert data["evaluation_metrics"]["in"] == "$JOB_STATE_DIR/logs"
    assert data["data_stores"][0]["training_data"] == {"container": "mnist_training_data"}


def test_round_trip_keeps_unknown_fields() -> None:
    manifest = parse_manifest(manifest_text() + "trainer: fast\n")
    restored = Manifest.from_dict(manifest.to_dict())
    assert restored.unknown_fields == ["trainer"]
    assert parse_manifest(manifest.to_dict()).unknown_fields == ["trainer"]


def test_from_dict_rejects_invalid_data_with_manifest_errors() -> None:
    data = load_fixture("pytorch-model.yml").to_dict()
    data["memory_mb"] = 0
    with pytest.raises(ManifestError) as caught:
        Manifest.from_dict(data)
    assert (caught.value.field, caught.value.code) == ("memory_mb", "C104")
    with pytest.raises(ManifestError) as caught:
        Manifest.from_dict(["not", "a", "mapping"])  # type: ignore[arg-type]
    assert caught.value.field == "manifest"


def test_per_gpu_batch_limits_are_read_with_the_elastic_ranges() -> None:
    text = manifest_text(
        **elastic(
            2, 8, batch_size={"min": 128, "max": 1024}, local_batch_size={"min": 32, "max": 64}
        )
    )
    manifest = parse_manifest(text)
    assert manifest.elastic is not None and manifest.elastic.local_batch_size is not None
    limits = manifest.elastic.local_batch_size
    assert (limits.min, limits.max) == (32, 64)


def test_accumulating_jobs_may_start_with_more_per_gpu_than_a_gpu_holds() -> None:
    limits = {"batch_size": {"min": 512, "max": 1024}, "local_batch_size": {"min": 16, "max": 128}}
    with pytest.raises(ManifestError, match="accumulate_gradients: true"):
        parse_manifest(manifest_text(**elastic(**limits)))
    manifest = parse_manifest(manifest_text(**elastic(**limits, accumulate_gradients=True)))
    assert manifest.elastic is not None and manifest.elastic.accumulate_gradients
    # One GPU can run any batch of the range by accumulating; at most 1024 / 16 GPUs.
    assert manifest.elastic.gpus_for_local_batches() == (1, 64)


def test_local_batch_limits_may_be_given_per_gpu_type_beside_those_for_all() -> None:
    text = manifest_text(
        gpus=2,
        **elastic(
            2,
            8,
            batch_size={"min": 64, "max": 512},
            local_batch_size={"min": 4, "max": 32, "h100": {"min": 8, "max": 64}},
        ),
    )
    parsed = parse_manifest(text)
    assert parsed.elastic is not None
    spec = parsed.elastic
    h100, a100 = spec.local_batch_for("h100"), spec.local_batch_for("a100")
    assert h100 is not None and (h100.min, h100.max) == (8, 64)
    assert a100 is not None and (a100.min, a100.max) == (4, 32)
    assert spec.gpus_for_local_batches("h100") == (1, 64) and spec.gpus_for_local_batches() == (
        2,
        128,
    )
    # Stored and read back, the same limits (the stored form names the per-type ones apart).
    assert Manifest.from_dict(parsed.to_dict()).elastic == spec
    # Only per-type limits: a type not named has none.
    only = parse_manifest(
        manifest_text(
            **elastic(
                batch_size={"min": 64, "max": 512}, local_batch_size={"h100": {"min": 8, "max": 64}}
            )
        )
    )
    assert only.elastic is not None and only.elastic.local_batch_for("a100") is None
