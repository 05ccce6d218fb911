"""The fake backend keeps the Backend protocol's rules on a virtual clock."""

from __future__ import annotations

import pytest

from ffdl.backends.base import Backend, LaunchRequest, LearnerState
from ffdl.backends.fake import FakeBackend, LearnerScript, fake_request
from ffdl.core.resources import Node

NODES = [Node("node-a", 4, 16.0, 65536), Node("node-b", 4, 16.0, 65536)]


def request(
    training_id: str, learner: int = 1, attempt: int = 1, node: str = "node-a"
) -> LaunchRequest:
    return fake_request(node, (learner - 1,), training_id, learner, 2, attempt)


def test_is_a_backend_and_reports_its_nodes() -> None:
    backend: Backend = FakeBackend(NODES)
    assert backend.name == "fake"
    assert backend.nodes() == NODES


def test_scripted_learner_runs_then_completes_at_its_time() -> None:
    backend = FakeBackend(NODES)
    backend.script("job-1", LearnerScript(run_s=10.0))
    handle = backend.launch(request("job-1"))
    assert backend.next_exit_at() == 10.0
    assert backend.advance(9.5) == []
    assert backend.poll(handle).state == LearnerState.RUNNING
    exits = backend.advance(1.0)
    assert [(e.at, e.result["status"], e.result["exit_code"]) for e in exits] == [
        (10.0, "COMPLETED", 0)
    ]
    polled = backend.poll(handle)
    assert polled.state == LearnerState.EXITED
    assert polled.result is not None and polled.result["status"] == "COMPLETED"
    assert backend.now == 10.5
    assert backend.next_exit_at() is None


def test_nonzero_exit_code_fails_with_c201() -> None:
    backend = FakeBackend(NODES)
    backend.script("job-1", LearnerScript(run_s=3.0, exit_code=7), learner=2)
    ok = backend.launch(request("job-1", learner=1))
    bad = backend.launch(request("job-1", learner=2))
    assert backend.poll(ok).state == LearnerState.RUNNING  # the default script never ends
    (exit_,) = backend.advance(5.0)
    assert exit_.handle == bad
    assert exit_.result["status"] == "FAILED"
    assert exit_.result["exit_code"] == 7
    assert exit_.result["error_code"] == "C201"


def test_launch_is_idempotent_per_attempt_and_a_new_attempt_is_a_new_learner() -> None:
    backend = FakeBackend(NODES)
    first = backend.launch(request("job-1"))
    assert backend.launch(request("job-1")) == first
    assert backend.launches == 1
    second = backend.launch(request("job-1", attempt=2))
    assert second != first
    assert backend.launches == 2
    assert backend.running() == [first, second]


def test_halt_exits_halted_after_the_scripts_halt_time() -> None:
    backend = FakeBackend(NODES)
    backend.script("job-1", LearnerScript(run_s=100.0, halt_s=2.0))
    handle = backend.launch(request("job-1"))
    backend.advance(10.0)
    backend.signal_halt(handle)
    backend.signal_halt(handle)  # a second request changes nothing
    assert backend.next_exit_at() == 12.0
    (exit_,) = backend.advance(5.0)
    assert (exit_.at, exit_.result["status"]) == (12.0, "HALTED")
    assert backend.advance(200.0) == []  # the scripted end no longer happens


def test_halt_after_the_work_would_end_lets_the_learner_complete() -> None:
    backend = FakeBackend(NODES)
    backend.script("job-1", LearnerScript(run_s=5.0, halt_s=10.0))
    handle = backend.launch(request("job-1"))
    backend.signal_halt(handle)
    (exit_,) = backend.advance(20.0)
    assert (exit_.at, exit_.result["status"]) == (5.0, "COMPLETED")


def test_a_learner_that_ignores_halt_runs_to_its_end() -> None:
    backend = FakeBackend(NODES, default_script=LearnerScript(run_s=30.0, ignore_halt=True))
    handle = backend.launch(request("job-1"))
    backend.signal_halt(handle)
    (exit_,) = backend.advance(60.0)
    assert (exit_.at, exit_.result["status"]) == (30.0, "COMPLETED")


def test_kill_is_silent_idempotent_and_allows_a_relaunch() -> None:
    backend = FakeBackend(NODES, default_script=LearnerScript(run_s=5.0))
    handle = backend.launch(request("job-1"))
    backend.kill(handle)
    backend.kill(handle)
    backend.kill({"training_id": "nobody", "learner": 1, "attempt": 1})
    assert backend.poll(handle).state == LearnerState.MISSING
    assert backend.advance(10.0) == []  # a killed learner leaves no exit
    again = backend.launch(request("job-1"))
    assert backend.poll(again).state == LearnerState.RUNNING
    assert [e.at for e in backend.advance(10.0)] == [15.0]


def test_exits_come_in_time_order_and_poll_sees_a_due_exit_before_advance() -> None:
    backend = FakeBackend(NODES)
    for index, run_s in enumerate((7.0, 3.0, 5.0), start=1):
        backend.script(f"job-{index}", LearnerScript(run_s=run_s))
        backend.launch(request(f"job-{index}"))
    backend.script("job-4", LearnerScript(run_s=0.0))
    zero = backend.launch(request("job-4"))
    assert backend.poll(zero).state == LearnerState.EXITED
    exits = backend.advance(10.0)
    assert [e.handle["training_id"] for e in exits] == ["job-4", "job-2", "job-3", "job-1"]


def test_the_clock_never_goes_back() -> None:
    backend = FakeBackend(NODES, start_at=100.0)
    with pytest.raises(ValueError, match="back"):
        backend.advance_to(50.0)
    with pytest.raises(ValueError):
        backend.advance(-1.0)
    with pytest.raises(ValueError):
        LearnerScript(run_s=-1.0)
