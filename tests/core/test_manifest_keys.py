"""Manifest keys that misspell a known field are refused, at every depth, naming the field
meant; keys far from every field are accepted and reported; FfDL's own keys pass."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from ffdl.core.errors import ManifestError
from ffdl.core.manifest import parse_manifest
from ffdl.core.manifest_keys import edit_distance, near_miss

BASE: dict[str, Any] = {
    "name": "typos",
    "learners": 1,
    "gpus": 0,
    "memory": "1GiB",
    "framework": {"name": "custom", "version": "1", "command": "true"},
}


def _with(**changes: Any) -> str:
    return yaml.safe_dump({**BASE, **changes})


@pytest.mark.parametrize(
    ("document", "field", "meant"),
    [
        (_with(lerners=4), "lerners", "learners"),
        (_with(Learners=4), "Learners", "learners"),
        (_with(**{"max-restarts": 2}), "max-restarts", "max_restarts"),
        (_with(priorty=90), "priorty", "priority"),
        (_with(gpu=1), "gpu", "gpus"),
        (_with(memroy="2GiB"), "memroy", "memory"),
        (
            _with(framework={"name": "custom", "commnd": "true"}),
            "framework.commnd",
            "framework.command",
        ),
        (
            _with(
                data_stores=[
                    {
                        "id": "s",
                        "type": "local",
                        "trainig_data": {"container": "d"},
                        "connection": {"path": "/x"},
                    }
                ]
            ),
            "data_stores[0].trainig_data",
            "data_stores[0].training_data",
        ),
        (
            _with(
                evaluation_metrics={
                    "type": "regex_extractor",
                    "groups": {"acc": {"regx": "a=(?P<a>\\S+)", "scalars": {"a": "$a"}}},
                }
            ),
            "evaluation_metrics.groups.acc.regx",
            "evaluation_metrics.groups.acc.regex",
        ),
        (
            _with(elastic={"gpus": {"min": 1, "maxx": 4}}),
            "elastic.gpus.maxx",
            "elastic.gpus.max",
        ),
    ],
)
def test_a_near_miss_is_refused_naming_the_field_meant(
    document: str, field: str, meant: str
) -> None:
    with pytest.raises(ManifestError) as refused:
        parse_manifest(document)
    assert refused.value.field == field
    assert refused.value.reason == f"is not a manifest field: did you mean {meant}?"


def test_keys_far_from_every_field_are_reported_at_every_depth() -> None:
    manifest = parse_manifest(
        _with(
            team="vision",
            framework={"name": "custom", "command": "true", "entrypoint": "x"},
            evaluation_metrics={"type": "emetrics", "event_types": ["a"], "colour": "red"},
        )
    )
    assert manifest.learners == 1
    # In the document's order (yaml.safe_dump sorts the keys).
    assert manifest.unknown_fields == [
        "evaluation_metrics.colour",
        "framework.entrypoint",
        "team",
    ]


def test_keys_of_the_users_own_are_never_checked() -> None:
    # connection, meta and metric names are the user's: near a field name or not, they pass.
    manifest = parse_manifest(
        _with(
            data_stores=[{"id": "s", "type": "local", "connection": {"path": "/x", "pth": "y"}}],
            evaluation_metrics={
                "type": "regex_extractor",
                "groups": {"regex": {"regex": "a=(?P<a>\\S+)", "scalars": {"rgex": "$a"}}},
            },
        )
    )
    assert manifest.unknown_fields == []


def test_near_means_case_dashes_or_a_few_edits() -> None:
    known = frozenset({"learners", "gpus", "max_restarts", "command"})
    assert near_miss("LEARNERS", known) == "learners"
    assert near_miss("max-restarts", known) == "max_restarts"
    assert near_miss("lraerners", known) == "learners"  # a swap of neighbours is one edit
    assert near_miss("gpux", known) == "gpus"
    assert near_miss("gp", known) is None  # two edits is too far for a short key
    assert near_miss("team", known) is None
    assert edit_distance("ab", "ba") == 1 and edit_distance("kitten", "sitting") == 3
