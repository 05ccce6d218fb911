"""Hostile manifests: repeated keys, oversized text, containers that try to leave their
store, and the numeric bounds shared by the API and the learners."""

from __future__ import annotations

import json
import math

import pytest

from ffdl.core.errors import BadRequest, ManifestError
from ffdl.core.limits import (
    MAX_INT64,
    bounded_int,
    iteration_problem,
    metric_value_problem,
    time_problem,
)
from ffdl.core.manifest import parse_manifest
from ffdl.core.redact import redact_secrets, redact_url

BASE = """\
name: job
framework:
  name: custom
  command: "true"
"""


def parse_error(text: str) -> ManifestError:
    with pytest.raises(ManifestError) as caught:
        parse_manifest(text)
    return caught.value


# --- duplicate keys -------------------------------------------------------------------------


def test_a_repeated_top_level_key_is_refused_naming_it() -> None:
    error = parse_error(BASE + "gpus: 1\nlearners: 1\ngpus: 64\n")
    assert (error.field, error.code) == ("gpus", "C101")
    assert error.reason == "duplicate key 'gpus' (lines 5 and 7)"
    assert "gpus" in str(error.message)


def test_a_repeated_nested_key_is_refused_with_its_path() -> None:
    text = BASE + (
        "data_stores:\n"
        "  - id: s\n"
        "    type: local\n"
        "    connection:\n"
        "      path: /a\n"
        "      path: /etc\n"
    )
    error = parse_error(text)
    assert (error.field, error.code) == ("data_stores[0].connection.path", "C101")
    assert "duplicate key 'path'" in error.reason


def test_keys_that_construct_to_the_same_value_are_duplicates() -> None:
    error = parse_error(BASE + "extra:\n  1: a\n  0x1: b\n")
    assert error.field == "extra.1"


def test_flow_mappings_and_json_are_checked_too() -> None:
    assert parse_error(BASE + "placement: {policy: pack, policy: spread}\n").field == (
        "placement.policy"
    )
    document = '{"name": "j", "framework": {"name": "c", "command": "x", "command": "y"}}'
    error = parse_error(document)
    assert (error.field, error.code) == ("command", "C101")
    assert error.reason == "duplicate key 'command'"


def test_merge_keys_and_aliases_are_not_duplicates() -> None:
    text = (
        "base: &base {name: pytorch, command: echo one}\n"
        "name: job\n"
        "framework:\n"
        "  <<: *base\n"
        "  command: echo two\n"
        "again: *base\n"
    )
    manifest = parse_manifest(text)
    assert manifest.framework.command == "echo two"


def test_a_self_referencing_alias_does_not_loop_the_check() -> None:
    error = parse_error(BASE + "loop: &a [*a]\n")
    assert error.field == "manifest"  # refused for its depth, after the key check finished


# --- text limits ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ("description: " + "d" * 4001 + "\n", "description"),
        ("version: " + "v" * 201 + "\n", "version"),
    ],
)
def test_free_text_has_a_size_limit(extra: str, field: str) -> None:
    error = parse_error(BASE + extra)
    assert error.field == field
    assert "at most" in error.reason


def test_a_long_command_is_refused() -> None:
    text = 'name: job\nframework: {name: c, command: "' + "x" * (64 * 1024 + 1) + '"}\n'
    assert parse_error(text).field == "framework.command"


def test_metric_group_names_fit_the_metrics_table() -> None:
    text = BASE + "evaluation_metrics:\n  groups:\n    " + "g" * 101 + ": {regex: 'a'}\n"
    error = parse_error(text)
    assert error.field.startswith("evaluation_metrics.groups")


# --- containers -----------------------------------------------------------------------------


def store_with(container: str) -> str:
    return BASE + (
        "data_stores:\n"
        "  - id: s\n"
        "    type: local\n"
        f"    training_data: {{container: {json.dumps(container)}}}\n"
        "    connection: {path: /stores}\n"
    )


@pytest.mark.parametrize(
    "container", ["../../x", "..", "a/../b", "/etc", "./a", "a//b", "a/", "a\\\\b", "a\x00b"]
)
def test_containers_that_could_leave_the_store_are_refused(container: str) -> None:
    error = parse_error(store_with(container))
    assert (error.field, error.code) == ("data_stores[0].training_data.container", "C101")


@pytest.mark.parametrize("container", ["mnist", "digits-data", "sets/mnist_v2", "a.b"])
def test_names_and_safe_relative_paths_are_containers(container: str) -> None:
    store = parse_manifest(store_with(container)).data_stores[0]
    assert store.training_data is not None and store.training_data.container == container


# --- redaction ------------------------------------------------------------------------------


def test_url_passwords_are_redacted_wherever_they_are() -> None:
    assert redact_url("http://bob:pw@host:9000/x") == "http://bob:***@host:9000/x"
    assert redact_url("s3://k:p@ss@h/b and ftp://u:v@w") == "s3://k:***@h/b and ftp://u:***@w"
    assert redact_url("http://bob@host/x") == "http://bob@host/x"
    assert redact_url("/plain/path") == "/plain/path"
    assert redact_secrets({"endpoint": "http://a:b@h", "api_key": "k", "path": "/p"}) == {
        "endpoint": "http://a:***@h",
        "api_key": "***",
        "path": "/p",
    }


# --- numeric bounds -------------------------------------------------------------------------


def test_iterations_fit_a_64_bit_column_and_are_never_negative() -> None:
    assert iteration_problem(None) is None
    assert iteration_problem(MAX_INT64) is None
    assert iteration_problem(MAX_INT64 + 1) == "iteration out of range"
    assert iteration_problem(10**20) == "iteration out of range"
    assert iteration_problem(-1) == "iteration out of range"
    assert iteration_problem(1.0) == "iteration must be an integer"


def test_times_and_values_must_be_finite_and_sensible() -> None:
    assert time_problem(1_700_000_000.5) is None
    for bad in (1e308, -1.0, math.inf, math.nan):
        assert time_problem(bad) == "time out of range"
    assert metric_value_problem("loss", 0.25) is None
    assert metric_value_problem("loss", math.nan) == "value 'loss' is not finite"
    assert metric_value_problem("loss", -math.inf) == "value 'loss' is not finite"
    assert metric_value_problem("loss", 1e300) == "value 'loss' out of range"
    assert metric_value_problem("loss", 10**400) == "value 'loss' out of range"
    assert metric_value_problem("flag", True) == "value 'flag' is not a number"


@pytest.mark.parametrize("value", [2**63, 2**64, -1, 1e20, "3", True, None])
def test_bounded_int_names_the_field(value: object) -> None:
    with pytest.raises(BadRequest) as caught:
        bounded_int(value, "gpus", 0, 100, code="C104")
    assert caught.value.detail == {"field": "gpus"}
    assert caught.value.code == "C104"
    assert caught.value.message.startswith("gpus must be an integer from 0 to 100")
