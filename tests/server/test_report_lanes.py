"""Report lanes: records-only batches take turns, a batch with a status goes ahead of them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ffdl.core.errors import Unavailable
from ffdl.server.report_lanes import ReportLanes, records_only
from ffdl.server.telemetry.instruments import REGISTRY

LINES = [{"type": "log", "seq": 1}, {"type": "emetric", "seq": 2}]
STATUS = [{"type": "log", "seq": 1}, {"type": "status", "seq": 2, "status": "RUNNING"}]


def test_only_batches_of_log_lines_and_metrics_wait_in_the_records_lane() -> None:
    assert records_only(LINES)
    assert not records_only(STATUS)
    assert not records_only([{"type": "gpu", "seq": 1}])
    assert not records_only([]), "a heartbeat goes at once"
    assert not records_only([{"seq": 1}]), "an item of no known kind is not held back"


def test_a_status_batch_goes_ahead_of_records_batches_waiting_their_turn() -> None:
    lanes = ReportLanes(records_at_once=1)
    done: list[str] = []

    async def scenario() -> None:
        entered, release = asyncio.Event(), asyncio.Event()

        async def held_store() -> str:
            entered.set()
            await release.wait()
            done.append("first records")
            return "first"

        async def store(name: str) -> str:
            done.append(name)
            return name

        first = asyncio.create_task(lanes.run(LINES, held_store))
        await asyncio.wait_for(entered.wait(), 5)
        assert (waiting(), batches("records", "storing")) == (0, 1)
        second = asyncio.create_task(lanes.run(LINES, lambda: store("second records")))
        await wait_until(lambda: waiting() == 1)
        # The records lane is full and one batch waits in it; a status batch does not wait.
        assert await asyncio.wait_for(lanes.run(STATUS, lambda: store("status")), 5) == "status"
        assert await asyncio.wait_for(lanes.run([], lambda: store("heartbeat")), 5) == "heartbeat"
        assert done == ["status", "heartbeat"] and not second.done()
        release.set()
        assert await asyncio.wait_for(first, 5) == "first"
        assert await asyncio.wait_for(second, 5) == "second records"
        assert (waiting(), batches("records", "storing"), batches("status", "storing")) == (0, 0, 0)

    asyncio.run(scenario())
    assert done == ["status", "heartbeat", "first records", "second records"]


def test_a_failed_records_batch_gives_its_turn_back() -> None:
    lanes = ReportLanes(records_at_once=1)

    async def failing() -> Any:
        raise RuntimeError("the store refused it")

    async def scenario() -> str:
        with pytest.raises(RuntimeError, match="refused"):
            await lanes.run(LINES, failing)

        async def ok() -> str:
            return "stored"

        return await asyncio.wait_for(lanes.run(LINES, ok), 5)

    assert asyncio.run(scenario()) == "stored"


def test_a_records_batch_whose_sender_left_is_not_stored_at_its_turn() -> None:
    lanes = ReportLanes(records_at_once=1)
    stored: list[str] = []

    async def store() -> str:
        stored.append("stored")
        return "stored"

    async def gone() -> bool:
        return True

    async def scenario() -> str:
        with pytest.raises(Unavailable, match="left before this batch's turn"):
            await lanes.run(LINES, store, gone)
        # A status batch is stored whatever: its sender's state matters to the job.
        assert await lanes.run(STATUS, store, gone) == "stored"
        return await asyncio.wait_for(lanes.run(LINES, store), 5)

    assert asyncio.run(scenario()) == "stored"
    assert stored == ["stored", "stored"]


def test_a_lane_must_let_at_least_one_batch_through() -> None:
    with pytest.raises(ValueError, match="records_at_once must be at least 1, not 0"):
        ReportLanes(records_at_once=0)


def waiting() -> float | None:
    return batches("records", "waiting")


def batches(lane: str, state: str) -> float | None:
    return REGISTRY.get_sample_value("ffdl_report_batches", {"lane": lane, "state": state})


async def wait_until(condition: Any, timeout: float = 5.0) -> None:
    """Yield to the event loop until ``condition()`` holds, or fail after ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0)
