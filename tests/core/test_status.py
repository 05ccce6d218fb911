"""The status machine: every allowed transition passes, every other one is refused."""

from __future__ import annotations

import itertools

import pytest

from ffdl.core.errors import IllegalTransition
from ffdl.core.status import (
    JobStatus,
    LearnerStatus,
    check_job_transition,
    check_learner_transition,
    is_terminal,
    job_transition_allowed,
)

J = JobStatus
ALLOWED_JOB = {
    (J.QUEUED, J.PENDING),
    (J.QUEUED, J.HALTED),
    (J.QUEUED, J.FAILED),
    (J.QUEUED, J.CANCELLED),
    (J.PENDING, J.DOWNLOADING),
    (J.PENDING, J.PROCESSING),
    (J.PENDING, J.FAILED),
    (J.PENDING, J.HALTING),
    (J.PENDING, J.CANCELLED),
    (J.DOWNLOADING, J.PROCESSING),
    (J.DOWNLOADING, J.FAILED),
    (J.DOWNLOADING, J.HALTING),
    (J.DOWNLOADING, J.CANCELLED),
    (J.PROCESSING, J.STORING),
    (J.PROCESSING, J.FAILED),
    (J.PROCESSING, J.HALTING),
    (J.PROCESSING, J.RESCALING),
    (J.PROCESSING, J.CANCELLED),
    (J.STORING, J.COMPLETED),
    (J.STORING, J.FAILED),
    (J.STORING, J.CANCELLED),
    (J.HALTING, J.HALTED),
    (J.HALTING, J.COMPLETED),
    (J.HALTING, J.FAILED),
    (J.HALTING, J.CANCELLED),
    (J.HALTED, J.QUEUED),
    (J.HALTED, J.CANCELLED),
    (J.RESCALING, J.PENDING),
    (J.RESCALING, J.QUEUED),
    (J.RESCALING, J.COMPLETED),
    (J.RESCALING, J.FAILED),
    (J.RESCALING, J.HALTING),
    (J.RESCALING, J.CANCELLED),
}


@pytest.mark.parametrize("current,target", list(itertools.product(JobStatus, JobStatus)))
def test_job_transitions_match_the_design(current: JobStatus, target: JobStatus) -> None:
    if current == target:
        return
    if (current, target) in ALLOWED_JOB:
        check_job_transition(current, target)
    else:
        with pytest.raises(IllegalTransition) as info:
            check_job_transition(current, target)
        assert info.value.detail == {"from": current.value, "to": target.value}


def test_terminal_states_have_no_way_out() -> None:
    for status in (J.COMPLETED, J.FAILED, J.CANCELLED):
        assert is_terminal(status)
        assert not any(job_transition_allowed(status, t) for t in JobStatus)
    assert not is_terminal(J.HALTED)


@pytest.mark.parametrize(
    "done",
    [LearnerStatus.COMPLETED, LearnerStatus.FAILED, LearnerStatus.HALTED, LearnerStatus.CANCELLED],
)
def test_finished_learners_never_change(done: LearnerStatus) -> None:
    for target in LearnerStatus:
        if target != done:
            with pytest.raises(IllegalTransition):
                check_learner_transition(done, target)
