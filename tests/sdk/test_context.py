"""Tests for reading the job context from the environment and its local defaults."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ffdl.sdk.api import JobContext, context
from ffdl.sdk.batch_file import BATCH_FILE_NAME, write_batch

CONTEXT_VARIABLES = (
    "DATA_DIR",
    "RESULT_DIR",
    "MODEL_DIR",
    "LOG_DIR",
    "CHECKPOINT_DIR",
    "JOB_STATE_DIR",
    "LEARNER_ID",
    "NUM_LEARNERS",
    "TRAINING_ID",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "FFDL_GPUS",
    "FFDL_BATCH_SIZE",
    "FFDL_MICRO_BATCH_SIZE",
    "FFDL_ACCUMULATION_STEPS",
    "FFDL_ATTEMPT",
)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for name in CONTEXT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return monkeypatch


def test_context_reads_every_platform_variable(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    directories = {
        name: tmp_path / name.lower()
        for name in ("DATA_DIR", "RESULT_DIR", "MODEL_DIR", "LOG_DIR", "CHECKPOINT_DIR")
    }
    directories["JOB_STATE_DIR"] = tmp_path / "state"
    for name, path in directories.items():
        clean_env.setenv(name, str(path))
    for name, value in {
        "TRAINING_ID": "training-abc123",
        "LEARNER_ID": "2",
        "NUM_LEARNERS": "4",
        "FFDL_GPUS": "2",
        "FFDL_BATCH_SIZE": "128",
        "FFDL_MICRO_BATCH_SIZE": "8",
        "FFDL_ACCUMULATION_STEPS": "4",
        "RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "10.0.0.5",
        "MASTER_PORT": "29500",
    }.items():
        clean_env.setenv(name, value)

    job = context()

    assert job == JobContext(
        training_id="training-abc123",
        learner_id=2,
        num_learners=4,
        gpus=2,
        batch_size=128,
        data_dir=tmp_path / "data_dir",
        result_dir=tmp_path / "result_dir",
        model_dir=tmp_path / "model_dir",
        log_dir=tmp_path / "log_dir",
        checkpoint_dir=tmp_path / "checkpoint_dir",
        job_state_dir=tmp_path / "state",
        rank=1,
        world_size=4,
        local_rank=0,
        master_addr="10.0.0.5",
        master_port=29500,
        micro_batch_size=8,
        accumulation_steps=4,
    )
    assert not job.is_chief


def test_local_defaults_outside_the_platform(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    job = context()

    root = tmp_path / "ffdl-local"
    assert job.training_id == "local"
    assert (job.learner_id, job.num_learners) == (1, 1)
    assert (job.rank, job.world_size, job.local_rank) == (0, 1, 0)
    assert job.gpus is None
    assert job.batch_size is None
    assert (job.micro_batch_size, job.accumulation_steps) == (None, 1)
    assert job.micro_batches(32) == [32]
    assert job.master_addr is None
    assert job.master_port is None
    assert job.is_chief
    assert job.data_dir == root / "data"
    assert job.result_dir == root / "results"
    assert job.model_dir == root / "model"
    assert job.log_dir == root / "logs"
    assert job.checkpoint_dir == root / "checkpoints"
    assert job.job_state_dir == root / "state"
    assert not root.exists(), "directories are created by whoever writes into them"


def test_rank_and_world_size_follow_learner_numbering_without_torch_variables(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv("LEARNER_ID", "3")
    clean_env.setenv("NUM_LEARNERS", "4")

    job = context()

    assert (job.rank, job.world_size) == (2, 4)
    assert not job.is_chief


def test_relative_directories_are_pinned_when_read(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean_env.setenv("RESULT_DIR", "out")
    job = context()
    clean_env.chdir(tmp_path.parent)

    assert job.result_dir == tmp_path / "out"
    assert job.result_dir.is_absolute()


def test_empty_values_count_as_unset(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("TRAINING_ID", "")
    clean_env.setenv("FFDL_BATCH_SIZE", " ")
    clean_env.setenv("LOG_DIR", "")

    job = context()

    assert job.training_id == "local"
    assert job.batch_size is None
    assert job.log_dir == tmp_path / "ffdl-local" / "logs"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("LEARNER_ID", "first"),
        ("LEARNER_ID", "0"),
        ("NUM_LEARNERS", "1.5"),
        ("FFDL_BATCH_SIZE", "0"),
        ("FFDL_GPUS", "-1"),
        ("MASTER_PORT", "http"),
        ("RANK", "-2"),
    ],
)
def test_malformed_numbers_are_rejected_naming_the_variable(
    clean_env: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    clean_env.setenv(variable, value)

    with pytest.raises(ValueError, match=variable):
        context()


def test_learner_id_beyond_num_learners_is_rejected(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("LEARNER_ID", "3")
    clean_env.setenv("NUM_LEARNERS", "2")

    with pytest.raises(ValueError, match="LEARNER_ID 3 exceeds NUM_LEARNERS 2"):
        context()


def test_context_is_immutable(clean_env: pytest.MonkeyPatch) -> None:
    job = context()

    with pytest.raises(dataclasses.FrozenInstanceError):
        job.learner_id = 2  # type: ignore[misc]


def test_a_share_splits_into_the_accumulation_steps(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("FFDL_ACCUMULATION_STEPS", "4")
    job = context()
    assert job.micro_batches(32) == [8, 8, 8, 8]
    assert job.micro_batches(33) == [9, 8, 8, 8]
    # A tail shorter than the steps still gives every micro-batch a sample.
    assert job.micro_batches(3) == [1, 1, 1]
    with pytest.raises(ValueError, match="share must be >= 0"):
        job.micro_batches(-1)


def test_malformed_accumulation_steps_name_the_variable(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("FFDL_ACCUMULATION_STEPS", "0")
    with pytest.raises(ValueError, match="FFDL_ACCUMULATION_STEPS must be >= 1"):
        context()


def test_a_batch_told_while_running_overrides_the_starting_one_for_its_attempt_only(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    clean_env.setenv("JOB_STATE_DIR", str(state))
    clean_env.setenv("FFDL_ATTEMPT", "2")
    clean_env.setenv("FFDL_BATCH_SIZE", "64")
    clean_env.setenv("FFDL_MICRO_BATCH_SIZE", "32")
    clean_env.setenv("FFDL_ACCUMULATION_STEPS", "1")
    assert (context().batch_size, context().micro_batch_size) == (64, 32)

    told = {"batch_size": 512, "micro_batch_size": 128, "accumulation_steps": 2}
    write_batch(state, 2, told)
    now = context()
    assert (now.batch_size, now.micro_batch_size, now.accumulation_steps) == (512, 128, 2)
    assert now.micro_batches(256) == [128, 128]

    # A file an earlier attempt left behind is not this attempt's batch.
    write_batch(state, 1, told)
    assert (context().batch_size, context().micro_batch_size) == (64, 32)
    # Nor is a file that is no batch, nor one read without knowing the attempt.
    (state / BATCH_FILE_NAME).write_text('{"attempt": 2, "batch_size": 0}')
    assert context().batch_size == 64
    write_batch(state, 2, told)
    clean_env.delenv("FFDL_ATTEMPT")
    assert context().batch_size == 64


@pytest.mark.parametrize(
    "told",
    [
        {"batch_size": 0, "micro_batch_size": None, "accumulation_steps": 1},
        {"batch_size": 64, "micro_batch_size": 0, "accumulation_steps": 1},
        {"batch_size": 64, "micro_batch_size": 32, "accumulation_steps": True},
        {"batch_size": "64", "micro_batch_size": None, "accumulation_steps": 1},
    ],
)
def test_a_batch_that_is_no_batch_is_not_written(tmp_path: Path, told: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="not a batch"):
        write_batch(tmp_path, 1, told)
    assert not (tmp_path / BATCH_FILE_NAME).exists()
