"""The batch variables a learner is started with: the global batch, and for an elastic job
with per-GPU limits the micro-batch and accumulation steps each GPU runs it as."""

from __future__ import annotations

from typing import Any

import yaml

from ffdl.core.manifest import Manifest, parse_manifest
from ffdl.server.services.learner_env import batch_variables, in_place_batch


def manifest(**elastic: Any) -> Manifest:
    document = {
        "name": "batches",
        "learners": 2,
        "gpus": 1,
        "memory": "1GiB",
        "framework": {"name": "custom", "version": "1", "command": "true"},
    }
    if elastic:
        document["elastic"] = elastic
    return parse_manifest(yaml.safe_dump(document))


LIMITED = {
    "gpus": {"min": 1, "max": 4},
    "batch_size": {"min": 64, "max": 256},
    "local_batch_size": {"min": 1, "max": 8},
    "accumulate_gradients": True,
}


def test_an_accumulating_job_learns_its_micro_batches_and_steps() -> None:
    assert batch_variables(manifest(**LIMITED), 2, 64) == {
        "FFDL_BATCH_SIZE": "64",
        "FFDL_MICRO_BATCH_SIZE": "8",
        "FFDL_ACCUMULATION_STEPS": "4",
    }
    assert batch_variables(manifest(**LIMITED), 4, 256)["FFDL_ACCUMULATION_STEPS"] == "8"


def test_an_elastic_job_starts_at_the_bottom_of_its_batch_range() -> None:
    assert batch_variables(manifest(**LIMITED), 2, None)["FFDL_BATCH_SIZE"] == "64"


def test_a_job_that_fits_runs_one_micro_batch_per_step() -> None:
    fitting = {**LIMITED, "local_batch_size": {"min": 1, "max": 64}}
    variables = batch_variables(manifest(**fitting), 2, 64)
    assert (variables["FFDL_MICRO_BATCH_SIZE"], variables["FFDL_ACCUMULATION_STEPS"]) == (
        "32",
        "1",
    )


def test_without_limits_or_a_batch_only_what_is_known_is_set() -> None:
    ranged = {"gpus": {"min": 1, "max": 4}, "batch_size": {"min": 64, "max": 256}}
    assert batch_variables(manifest(**ranged), 2, 128) == {"FFDL_BATCH_SIZE": "128"}
    assert batch_variables(manifest(), 2, None) == {}


def test_report_answers_tell_a_job_that_rebatches_in_place_what_it_would_start_with() -> None:
    stored = manifest(**LIMITED, rebatch_in_place=True).to_dict()
    assert in_place_batch(stored, 2, 128) == {
        "batch_size": 128,
        "micro_batch_size": 8,
        "accumulation_steps": 8,
    }
    assert batch_variables(Manifest.from_dict(stored), 2, 128)["FFDL_ACCUMULATION_STEPS"] == "8"
    # Before the autoscaler chose a batch: the range's minimum, as at the start.
    assert in_place_batch(stored, 2, None) == {
        "batch_size": 64,
        "micro_batch_size": 8,
        "accumulation_steps": 4,
    }
    # Any other job's answers carry no batch.
    assert in_place_batch(manifest(**LIMITED).to_dict(), 2, 128) is None
    assert in_place_batch(manifest().to_dict(), 2, 128) is None


def test_each_gpu_type_runs_the_batch_within_its_own_limits() -> None:
    by_type = {**LIMITED, "local_batch_size": {"min": 1, "max": 8, "h100": {"min": 1, "max": 32}}}
    job = manifest(**by_type)
    assert batch_variables(job, 2, 64, "h100")["FFDL_ACCUMULATION_STEPS"] == "1"
    assert batch_variables(job, 2, 64, "a100")["FFDL_ACCUMULATION_STEPS"] == "4"
    assert batch_variables(job, 2, 64)["FFDL_MICRO_BATCH_SIZE"] == "8"
    # A running job's report answers take the type from its placement.
    stored = manifest(**by_type, rebatch_in_place=True).to_dict()
    on_h100 = [{"learner": 1, "node": "h-1", "gpu_ids": [0], "gpu_type": "h100"}]
    assert in_place_batch(stored, 2, 64, on_h100) == {
        "batch_size": 64,
        "micro_batch_size": 32,
        "accumulation_steps": 1,
    }
    assert (in_place_batch(stored, 2, 64) or {}).get("accumulation_steps") == 4
