"""The spec fields a learner on another machine needs, and moving a spec onto that machine:
``rebase_spec`` over a full spec, the new fields' defaults and validation."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from ffdl.learner.runtime import RuntimeSpec
from ffdl.learner.sandbox import SandboxSpec
from ffdl.learner.spec import (
    DataMount,
    LearnerSpec,
    ObjectLocation,
    SpecError,
    checkpoint_location,
    dump_spec,
    erase_spec_secrets,
    learner_checkpoint_dir,
    load_spec,
    rebase_spec,
    spec_to_dict,
)

HOME = "/srv/ffdl"
NODE = "/tmp/ffdl-ray"
JOB = f"{HOME}/jobs/training-abc"
# Operator paths outside the home, and one inside it (a mount_volume under HOME/stores).
DATA_SOURCE = "/datasets/mnist"
VOLUME_SOURCE = f"{HOME}/stores/volumes/shared"


def full_spec() -> LearnerSpec:
    """A spec with every path field set, laid out as the LCM lays out a sandboxed learner
    on a runtime of its own (``lcm.build_spec``)."""
    return LearnerSpec(
        training_id="training-abc",
        learner=1,
        num_learners=2,
        attempt=3,
        api_url="http://10.0.0.1:8080",
        job_token="token",
        command="python train.py",
        workdir=f"{JOB}/code",
        env={
            "PATH": f"{HOME}/runtimes/abc/env/bin:/usr/local/bin:/usr/bin:/bin",
            "PYTHONPATH": f"{JOB}/code:{HOME}/lib",
            "HOME": f"{JOB}/home",
            "DATA_DIR": f"{JOB}/data",
            "RESULT_DIR": f"{JOB}/results",
            "MODEL_DIR": f"{JOB}/code",
            "LOG_DIR": f"{JOB}/state/logs",
            "CHECKPOINT_DIR": f"{JOB}/checkpoints",
            "JOB_STATE_DIR": f"{JOB}/state",
            "RESULT_BUCKET_DIR": f"{JOB}/result-bucket",
            "MASTER_ADDR": "127.0.0.1",
            "TRAINING_ID": "training-abc",
            # Neither a path nor under the home: left as written.
            "FFDL_NOTE": f"{HOME}x/not-inside",
        },
        data=[
            DataMount(kind="local", source=DATA_SOURCE, target=f"{JOB}/data"),
            DataMount(kind="mount_volume", source=VOLUME_SOURCE, target=f"{JOB}/data/vol"),
            DataMount(
                kind="s3",
                source="s3://bucket/data",
                target=f"{JOB}/data",
                store=ObjectLocation("bucket/data", {"access_key": "a", "secret_key": "s"}),
            ),
        ],
        results_source=f"{JOB}/results",
        results_target=f"{HOME}/stores/results/training-abc",
        emetrics_file=f"{JOB}/logs/learner-1/emetrics.jsonl",
        metric_groups={"train": {"regex": "loss=(?P<l>.*)", "scalars": {"loss": "$l"}}},
        state_dir=f"{JOB}/learners/1/attempt-3",
        sandbox=SandboxSpec(
            uid=200001,
            gid=200001,
            read_only=[f"{HOME}/runtimes/abc", "/opt/python"],
            read_write=[f"{JOB}/code", f"{JOB}/results", f"{JOB}/checkpoints"],
            volumes=[[VOLUME_SOURCE, f"{JOB}/data/vol"]],
            network="netns:ffdl-abc",
            gpu_devices=["/dev/nvidia0"],
            cgroup="ffdl-training-abc-1",
            binds=[[f"{JOB}/logs/learner-1", f"{JOB}/state/logs"]],
            hosts=[["10.0.0.2", "learner-2"]],
            hidden=[f"{HOME}/site-packages"],
            programs=[[f"{HOME}/runtimes/abc/env/bin/python", "/opt/conda/bin/python"]],
        ),
        results_store=ObjectLocation("results/training-abc", {"secret_key": "s"}),
        checkpoint_dir=f"{JOB}/checkpoints",
        code_archive=f"{JOB}/model.zip",
        runtime=RuntimeSpec(
            name="pytorch-2",
            environment="python",
            path=f"{HOME}/runtimes/abc",
            python="/usr/bin/python3",
            digest="abc",
            requirements=["torch==2.3"],
            find_links=[f"{HOME}/wheels", "https://example.org/wheels"],
            paths={"/opt/conda/bin/python": "python"},
        ),
        log_dir=f"{JOB}/logs/learner-1",
        metrics_type="tensorboard",
        metrics_in=f"{JOB}/state/logs/tb",
        checkpoint_store=ObjectLocation(f"file://{HOME}/shared-ckpt/training-abc", {}),
    )


def strings(value: Any, where: str = "") -> list[tuple[str, str]]:
    """Every string in a decoded spec, with where it is."""
    if isinstance(value, str):
        return [(where, value)]
    if isinstance(value, dict):
        return [item for k, v in value.items() for item in strings(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [item for i, v in enumerate(value) for item in strings(v, f"{where}[{i}]")]
    return []


def test_rebase_moves_every_path_under_the_home_and_nothing_else() -> None:
    spec = full_spec()
    before = json.dumps(spec_to_dict(spec))

    rebased = rebase_spec(spec, HOME, NODE)

    # The original is untouched: the rebased spec is a copy, down to its lists.
    assert json.dumps(spec_to_dict(spec)) == before
    # Operator paths (a mount's source, a volume's source) and store roots stay as written;
    # every other string that named a path under the home now names one under the node's.
    kept = {
        ".data[1].source": VOLUME_SOURCE,
        ".sandbox.volumes[0][0]": VOLUME_SOURCE,
        ".checkpoint_store.root": f"file://{HOME}/shared-ckpt/training-abc",
        ".env.FFDL_NOTE": f"{HOME}x/not-inside",
    }
    found = dict(strings(spec_to_dict(rebased)))
    for where, value in kept.items():
        assert found[where] == value, where
    leftover = [
        (where, value)
        for where, value in strings(spec_to_dict(rebased))
        if HOME in value and where not in kept
    ]
    assert leftover == []

    assert rebased.workdir == f"{NODE}/jobs/training-abc/code"
    assert rebased.state_dir == f"{NODE}/jobs/training-abc/learners/1/attempt-3"
    assert rebased.env["PATH"] == f"{NODE}/runtimes/abc/env/bin:/usr/local/bin:/usr/bin:/bin"
    assert rebased.env["PYTHONPATH"] == f"{NODE}/jobs/training-abc/code:{NODE}/lib"
    assert rebased.env["MASTER_ADDR"] == "127.0.0.1"
    assert [m.source for m in rebased.data] == [DATA_SOURCE, VOLUME_SOURCE, "s3://bucket/data"]
    assert [m.target for m in rebased.data] == [
        f"{NODE}/jobs/training-abc/data",
        f"{NODE}/jobs/training-abc/data/vol",
        f"{NODE}/jobs/training-abc/data",
    ]
    assert rebased.sandbox is not None and rebased.runtime is not None
    assert rebased.sandbox.read_only == [f"{NODE}/runtimes/abc", "/opt/python"]
    assert rebased.sandbox.binds == [
        [f"{NODE}/jobs/training-abc/logs/learner-1", f"{NODE}/jobs/training-abc/state/logs"]
    ]
    assert rebased.sandbox.programs == [
        [f"{NODE}/runtimes/abc/env/bin/python", "/opt/conda/bin/python"]
    ]
    assert rebased.runtime.path == f"{NODE}/runtimes/abc"
    assert rebased.runtime.paths == {"/opt/conda/bin/python": "python"}
    assert rebased.runtime.python == "/usr/bin/python3"
    assert rebased.runtime.find_links == [f"{NODE}/wheels", "https://example.org/wheels"]
    assert rebased.results_store == spec.results_store
    assert rebased.metric_groups == spec.metric_groups


def test_rebase_matches_whole_path_components_and_a_trailing_slash() -> None:
    spec = dataclasses.replace(
        full_spec(),
        workdir=HOME,
        env={"A": f"{HOME}-other/x", "B": f"{HOME}/", "C": HOME},
        sandbox=None,
        runtime=None,
    )

    rebased = rebase_spec(spec, HOME + "/", NODE + "/")

    assert rebased.workdir == NODE
    assert rebased.env == {"A": f"{HOME}-other/x", "B": f"{NODE}/", "C": NODE}


def test_a_spec_file_from_before_the_remote_fields_still_loads(tmp_path: Path) -> None:
    document = spec_to_dict(full_spec())
    for name in ("results_via_api", "checkpoint_store", "checkpoint_sync_s"):
        del document[name]
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(document))

    spec = load_spec(path)

    assert (spec.results_via_api, spec.checkpoint_store, spec.checkpoint_sync_s) == (
        False,
        None,
        None,
    )


def test_the_remote_fields_round_trip(tmp_path: Path) -> None:
    spec = dataclasses.replace(full_spec(), results_via_api=True, checkpoint_sync_s=2.5)
    path = tmp_path / "spec.json"
    dump_spec(spec, path)
    assert load_spec(path) == spec


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"results_via_api": "yes"}, "'results_via_api'"),
        ({"checkpoint_sync_s": 0}, "'checkpoint_sync_s'"),
        ({"checkpoint_sync_s": True}, "'checkpoint_sync_s'"),
        ({"checkpoint_store": {"root": "file://relative/dir", "connection": {}}}, "file://"),
        ({"checkpoint_store": {"root": "file:///a/../etc", "connection": {}}}, "file://"),
        ({"checkpoint_store": {"root": "/", "connection": {}}}, "bucket"),
        ({"checkpoint_store": {"root": "b", "connection": {"k": 1}}}, "connection"),
    ],
)
def test_invalid_remote_fields_are_named(
    tmp_path: Path, change: dict[str, Any], field: str
) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({**spec_to_dict(full_spec()), **change}))
    with pytest.raises(SpecError, match=field):
        load_spec(path)


def test_the_checkpoint_store_serves_when_there_is_no_results_store() -> None:
    spec = full_spec()
    assert checkpoint_location(spec) == spec.results_store
    assert learner_checkpoint_dir(spec) == spec.checkpoint_dir

    alone = dataclasses.replace(spec, results_store=None, checkpoint_dir=None)
    assert checkpoint_location(alone) == spec.checkpoint_store
    # Without an explicit directory: the CHECKPOINT_DIR the command writes.
    assert learner_checkpoint_dir(alone) == spec.env["CHECKPOINT_DIR"]

    neither = dataclasses.replace(alone, checkpoint_store=None)
    assert checkpoint_location(neither) is None
    assert learner_checkpoint_dir(neither) is None


def test_the_checkpoint_stores_secrets_are_erased_from_the_file(tmp_path: Path) -> None:
    spec = dataclasses.replace(
        full_spec(),
        checkpoint_store=ObjectLocation("ckpt/training-abc", {"secret_key": "hush", "region": "x"}),
    )
    path = tmp_path / "spec.json"
    dump_spec(spec, path)

    assert erase_spec_secrets(path)

    stored = json.loads(path.read_text())["checkpoint_store"]["connection"]
    assert stored == {"secret_key": "erased", "region": "x"}
