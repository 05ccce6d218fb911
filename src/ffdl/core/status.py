"""Job and learner statuses, the transitions between them, and FfDL's error codes.

The transition tables here are the single definition of the status machine
(DESIGN §6); ``server/store/transitions.py`` is the only writer and checks every change
against them. Two changes are allowed only for a named cause (``Via``): a running job
goes back to QUEUED when the platform restarts it after a failure, and a FAILED job goes
back to QUEUED when its user resumes it; no other writer can take either path.
"""

from __future__ import annotations

from enum import StrEnum

from ffdl.core.errors import IllegalTransition


class JobStatus(StrEnum):
    QUEUED = "QUEUED"
    PENDING = "PENDING"
    DOWNLOADING = "DOWNLOADING"
    PROCESSING = "PROCESSING"
    STORING = "STORING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    HALTING = "HALTING"
    HALTED = "HALTED"
    RESCALING = "RESCALING"
    CANCELLED = "CANCELLED"


class LearnerStatus(StrEnum):
    PENDING = "PENDING"
    DOWNLOADING = "DOWNLOADING"
    PROCESSING = "PROCESSING"
    STORING = "STORING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    HALTED = "HALTED"
    CANCELLED = "CANCELLED"


class ErrorCode(StrEnum):
    INSUFFICIENT_RESOURCES = "S100"
    DEPLOY_FAILED = "S101"
    LOAD_MODEL_FAILED = "S301"
    LOAD_DATA_FAILED = "S302"
    STORE_RESULTS_FAILED = "S303"
    BAD_MANIFEST = "C101"
    BAD_ARCHIVE = "C102"
    BAD_CREDENTIALS = "C103"
    BAD_RESOURCE_SPEC = "C104"
    LEARNER_CRASHED = "C201"
    CONTROLLER_LOST = "S201"


class Via(StrEnum):
    """Why a job takes one of the transitions that are not open to every writer."""

    RESTART = "restart"  # the platform restarts a failed attempt from its last checkpoint
    RESUME = "resume"  # a user resumes a FAILED job from its last checkpoint


J = JobStatus
# Running states: a job in one of these holds resources on the backend.
RUNNING_JOB_STATES = frozenset({J.PENDING, J.DOWNLOADING, J.PROCESSING, J.STORING})
TERMINAL_JOB_STATES = frozenset({J.COMPLETED, J.FAILED, J.CANCELLED})
# States in which a job holds cluster resources (placed and not yet released).
HOLDING_JOB_STATES = RUNNING_JOB_STATES | {J.HALTING, J.RESCALING}
# What a user may ask of a job in each status (``services/control.py`` enforces it; the API
# lists a job's ``actions`` from it so that no client offers what would be refused). A
# halt of a HALTING or HALTED job is accepted and changes nothing, so it is not offered.
HALTABLE_JOB_STATES = frozenset({J.QUEUED, J.PENDING, J.DOWNLOADING, J.PROCESSING})
RESUMABLE_JOB_STATES = frozenset({J.HALTED, J.FAILED})

_JOB_TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    J.QUEUED: frozenset({J.PENDING, J.HALTED, J.FAILED, J.CANCELLED}),
    J.PENDING: frozenset({J.DOWNLOADING, J.PROCESSING, J.FAILED, J.HALTING, J.CANCELLED}),
    J.DOWNLOADING: frozenset({J.PROCESSING, J.FAILED, J.HALTING, J.CANCELLED}),
    J.PROCESSING: frozenset({J.STORING, J.FAILED, J.HALTING, J.RESCALING, J.CANCELLED}),
    J.STORING: frozenset({J.COMPLETED, J.FAILED, J.CANCELLED}),
    J.HALTING: frozenset({J.HALTED, J.COMPLETED, J.FAILED, J.CANCELLED}),
    J.HALTED: frozenset({J.QUEUED, J.CANCELLED}),
    # A rescale normally goes back to PENDING with the new size; QUEUED when the freed
    # resources were taken meanwhile, COMPLETED when the learners finished first.
    J.RESCALING: frozenset({J.PENDING, J.QUEUED, J.COMPLETED, J.FAILED, J.HALTING, J.CANCELLED}),
    J.COMPLETED: frozenset(),
    J.FAILED: frozenset(),
    J.CANCELLED: frozenset(),
}
_VIA_TRANSITIONS: dict[Via, dict[JobStatus, frozenset[JobStatus]]] = {
    Via.RESTART: {s: frozenset({J.QUEUED}) for s in (*RUNNING_JOB_STATES, J.RESCALING)},
    Via.RESUME: {J.FAILED: frozenset({J.QUEUED})},
}

L = LearnerStatus
_LEARNER_TRANSITIONS: dict[LearnerStatus, frozenset[LearnerStatus]] = {
    L.PENDING: frozenset(
        {L.DOWNLOADING, L.PROCESSING, L.FAILED, L.HALTED, L.CANCELLED, L.COMPLETED}
    ),
    L.DOWNLOADING: frozenset({L.PROCESSING, L.FAILED, L.HALTED, L.CANCELLED}),
    L.PROCESSING: frozenset({L.STORING, L.COMPLETED, L.FAILED, L.HALTED, L.CANCELLED}),
    L.STORING: frozenset({L.COMPLETED, L.FAILED, L.HALTED, L.CANCELLED}),
    L.COMPLETED: frozenset(),
    L.FAILED: frozenset(),
    L.HALTED: frozenset(),
    L.CANCELLED: frozenset(),
}
TERMINAL_LEARNER_STATES = frozenset({L.COMPLETED, L.FAILED, L.HALTED, L.CANCELLED})

# Order of the forward pipeline, used to aggregate learners into a job status.
PIPELINE = (L.PENDING, L.DOWNLOADING, L.PROCESSING, L.STORING, L.COMPLETED)


def user_actions(status: JobStatus) -> list[str]:
    """The actions a job in ``status`` takes: ``halt``, ``resume`` and always ``delete``."""
    actions = []
    if status in HALTABLE_JOB_STATES:
        actions.append("halt")
    if status in RESUMABLE_JOB_STATES:
        actions.append("resume")
    return [*actions, "delete"]


def is_terminal(status: JobStatus) -> bool:
    return status in TERMINAL_JOB_STATES


def job_transition_allowed(current: JobStatus, target: JobStatus, via: Via | None = None) -> bool:
    if target in _JOB_TRANSITIONS[current]:
        return True
    return via is not None and target in _VIA_TRANSITIONS[via].get(current, frozenset())


def learner_transition_allowed(current: LearnerStatus, target: LearnerStatus) -> bool:
    return target in _LEARNER_TRANSITIONS[current]


def check_job_transition(current: JobStatus, target: JobStatus, via: Via | None = None) -> None:
    if not job_transition_allowed(current, target, via):
        raise IllegalTransition("job", current.value, target.value)


def check_learner_transition(current: LearnerStatus, target: LearnerStatus) -> None:
    if not learner_transition_allowed(current, target):
        raise IllegalTransition("learner", current.value, target.value)
