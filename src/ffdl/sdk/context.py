"""The job context user training code sees: who this learner is and where it reads and writes.

The platform describes a learner to its training process through environment variables
(FfDL's names: ``DATA_DIR``, ``RESULT_DIR``, ``LEARNER_ID``, ...). This module owns turning
them into one typed, immutable :class:`JobContext`, and the local defaults used when the same
code runs outside the platform (training id ``local``, directories under ``./ffdl-local/``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ffdl.sdk.batch_file import read_batch

LOCAL_TRAINING_ID = "local"
LOCAL_ROOT_NAME = "ffdl-local"

# Environment variable -> sub-directory of the local root used when the variable is unset.
DIRECTORY_VARIABLES: dict[str, str] = {
    "DATA_DIR": "data",
    "RESULT_DIR": "results",
    "MODEL_DIR": "model",
    "LOG_DIR": "logs",
    "CHECKPOINT_DIR": "checkpoints",
    "JOB_STATE_DIR": "state",
}


@dataclass(frozen=True)
class JobContext:
    """Everything a training process needs to know about its job and its place in it.

    ``learner_id`` is 1-based (FfDL's convention); ``rank`` is the 0-based torch rank.
    ``gpus`` and ``batch_size`` are set only when the platform (or an elastic rescale)
    decided them; ``None`` means "use your own default". For an elastic job with per-GPU
    batch limits, ``micro_batch_size`` is the most samples one forward/backward pass takes
    on a GPU and ``accumulation_steps`` how many such passes each GPU runs, summing their
    gradients, before one optimizer step (1: no accumulation); ``micro_batches`` splits a
    share accordingly.
    """

    training_id: str
    learner_id: int
    num_learners: int
    gpus: int | None
    batch_size: int | None
    data_dir: Path
    result_dir: Path
    model_dir: Path
    log_dir: Path
    checkpoint_dir: Path
    job_state_dir: Path
    rank: int
    world_size: int
    local_rank: int
    master_addr: str | None
    master_port: int | None
    micro_batch_size: int | None = None
    accumulation_steps: int = 1

    @property
    def is_chief(self) -> bool:
        """Learner 1 is the one that writes results other learners would only duplicate."""
        return self.learner_id == 1

    def micro_batches(self, share: int) -> list[int]:
        """Sizes of the ``accumulation_steps`` micro-batches a GPU's ``share`` of one global
        batch runs as, largest first, differing by at most one sample (fewer when the share
        is smaller than the steps)."""
        if share < 0:
            raise ValueError(f"share must be >= 0, got {share}")
        steps = max(1, min(self.accumulation_steps, share))
        whole, extra = divmod(share, steps)
        return [whole + 1] * extra + [whole] * (steps - extra)


def _env_value(name: str) -> str | None:
    # An empty value is what shells and templating leave behind for "unset".
    value = os.environ.get(name, "").strip()
    return value or None


def _env_int(name: str, *, minimum: int) -> int | None:
    raw = _env_value(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ValueError(f"environment variable {name} must be >= {minimum}, got {value}")
    return value


def job_directory(variable: str) -> Path:
    """The absolute directory named by ``variable`` (one of :data:`DIRECTORY_VARIABLES`).

    Falls back to ``./ffdl-local/<name>`` resolved against the current directory at call
    time, so a later ``chdir`` in user code does not move it. Nothing is created here:
    writers create the directories they write into.
    """
    local_name = DIRECTORY_VARIABLES[variable]
    raw = _env_value(variable)
    path = Path(raw) if raw is not None else Path(LOCAL_ROOT_NAME) / local_name
    return path.expanduser().absolute()


def context() -> JobContext:
    """Read the job context from the environment, with local defaults for anything unset.

    The batch fields are the ones the platform last told this attempt, when its job takes a
    new batch while it runs (``elastic.rebatch_in_place``; see ``ffdl.sdk.batch_file``):
    call this again at each epoch to pick a change up.

    Raises ``ValueError`` naming the variable when a numeric variable is malformed.
    """
    learner_id = _env_int("LEARNER_ID", minimum=1) or 1
    num_learners = _env_int("NUM_LEARNERS", minimum=1) or 1
    if learner_id > num_learners:
        raise ValueError(f"LEARNER_ID {learner_id} exceeds NUM_LEARNERS {num_learners}")
    rank = _env_int("RANK", minimum=0)
    world_size = _env_int("WORLD_SIZE", minimum=1)
    local_rank = _env_int("LOCAL_RANK", minimum=0)
    job_state_dir = job_directory("JOB_STATE_DIR")
    batch_size = _env_int("FFDL_BATCH_SIZE", minimum=1)
    micro_batch_size = _env_int("FFDL_MICRO_BATCH_SIZE", minimum=1)
    accumulation_steps = _env_int("FFDL_ACCUMULATION_STEPS", minimum=1) or 1
    told = read_batch(job_state_dir, _env_int("FFDL_ATTEMPT", minimum=1))
    if told is not None:
        batch_size = told["batch_size"]
        micro_batch_size = told["micro_batch_size"]
        accumulation_steps = told["accumulation_steps"]
    return JobContext(
        training_id=_env_value("TRAINING_ID") or LOCAL_TRAINING_ID,
        learner_id=learner_id,
        num_learners=num_learners,
        gpus=_env_int("FFDL_GPUS", minimum=0),
        batch_size=batch_size,
        data_dir=job_directory("DATA_DIR"),
        result_dir=job_directory("RESULT_DIR"),
        model_dir=job_directory("MODEL_DIR"),
        log_dir=job_directory("LOG_DIR"),
        checkpoint_dir=job_directory("CHECKPOINT_DIR"),
        job_state_dir=job_state_dir,
        # Without torch's own variables the learner numbering is the natural rank layout.
        rank=learner_id - 1 if rank is None else rank,
        world_size=num_learners if world_size is None else world_size,
        local_rank=0 if local_rank is None else local_rank,
        master_addr=_env_value("MASTER_ADDR"),
        master_port=_env_int("MASTER_PORT", minimum=1),
        micro_batch_size=micro_batch_size,
        accumulation_steps=accumulation_steps,
    )
