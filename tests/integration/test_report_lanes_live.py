"""On a real server on PostgreSQL: while records-only report batches wait their turn
(``report_records_at_once``), a batch with a status is stored ahead of them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.integration.live import FAST_CONFIG, LiveServer, serving, wait_for
from tests.integration.test_report_integrity import Forger, _let_go, _started, log_item
from tests.postgres import PostgresServer

FAR = 2**62  # a seq far ahead: refused with 409 once stored, so nothing is written


@pytest.fixture
def server(tmp_path: Path, postgres: PostgresServer) -> Iterator[LiveServer]:
    config = {
        **FAST_CONFIG,
        "database_url": postgres.create_database(),
        "report_records_at_once": 1,
        # No heartbeats while the test counts batches: only its own are in flight.
        "heartbeat_s": 60.0,
        "heartbeat_timeout_s": 300.0,
    }
    with serving(LiveServer(home=tmp_path / "home", config=config)) as live:
        yield live


@contextmanager
def job_row_locked(database_url: str, job_id: str) -> Iterator[None]:
    """Hold the job's row locked, as a long transaction on it would: its reports wait."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn, conn.begin():
            conn.execute(text("SELECT id FROM jobs WHERE id = :id FOR UPDATE"), {"id": job_id})
            yield
    finally:
        engine.dispose()


def post(forger: Forger, items: list[dict[str, Any]], timeout: float = 60) -> httpx.Response:
    return httpx.post(
        f"{forger.server.url}/v1/internal/jobs/{forger.job_id}/learners/1/reports",
        content=json.dumps({"attempt": forger.attempt, "items": items}),
        headers={"Authorization": f"Bearer {forger.token}", "Content-Type": "application/json"},
        timeout=timeout,
    )


def batches(server: LiveServer, lane: str, state: str) -> float:
    series = f'ffdl_report_batches{{lane="{lane}",state="{state}"}} '
    for line in server.client.get("/metrics").text.splitlines():
        if line.startswith(series):
            return float(line.split()[1])
    return 0.0  # not seen yet in this process


def waiting(server: LiveServer) -> float:
    return batches(server, "records", "waiting")


def test_a_status_is_stored_ahead_of_log_lines_that_wait_their_turn(server: LiveServer) -> None:
    held_id, held = _started(server)
    other_id, other = _started(server)
    last = other.last_seq()
    pool = ThreadPoolExecutor(8)
    try:
        with job_row_locked(server.config["database_url"], held_id):
            # Two records batches of the locked job: one takes the lane's only turn and
            # waits for the row, the other waits for the turn.
            blocked: list[Future[httpx.Response]] = [
                pool.submit(post, held, [log_item(FAR, "held back")]) for _ in range(2)
            ]
            wait_for(lambda: waiting(server) == 1, timeout=30, what="a batch waiting its turn")
            # The other job's log line, numbered to follow the status sent after it, waits
            # behind them ...
            lines = pool.submit(post, other, [log_item(last + 2, "sent before the status")])
            wait_for(lambda: waiting(server) == 2, timeout=30, what="the other job's line")
            # ... and its status, sent after, is not queued behind the line: it is stored
            # first, so both are taken in seq order. (Were the line stored first, its seq
            # would jump one ahead and be refused.)
            status = {"type": "status", "seq": last + 1, "time": 1.7e9, "status": "PROCESSING"}
            stored = pool.submit(post, other, [status])
            wait_for(
                lambda: batches(server, "status", "storing") == 1,
                timeout=30,
                what="the status batch taken to be stored",
            )
            assert not lines.done() and not any(f.done() for f in blocked)
            # A line whose sender gives up waiting (a learner's request timing out) ...
            given_up = pool.submit(post, other, [log_item(last + 3, "given up")], 1.0)
            with pytest.raises(httpx.TimeoutException):
                given_up.result(timeout=30)
        assert stored.result(timeout=60).status_code == 200, stored.result().text
        answer = lines.result(timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["last_seq"] == last + 2
        for future in blocked:
            assert future.result(timeout=60).status_code == 409, "refused for its seq, as sent"
        # ... is not stored when its turn comes: the learner sends it again.
        wait_for(lambda: waiting(server) == 0, timeout=30, what="the lane emptied")
        assert other.last_seq() == last + 2
        assert "given up" not in [line["line"] for line in server.loglines(other_id)]
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        _let_go(server, held_id)
        _let_go(server, other_id)
