"""The report sender in-process against the recording stand-in: order, batching,
heartbeats, spilling to disk and back-pressure while the API is away, and the API's
halt/cancel/gone answers."""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from ffdl.learner.reporter import CANCEL, GAVE_UP, GONE, HALT, Reporter
from ffdl.learner.spool import ITEM_OVERHEAD, Spool

from .test_recording_api import TOKEN, RecordingApi, api, wait_until

__all__ = ["api"]


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def __call__(self, kind: str, detail: str) -> None:
        with self.lock:
            self.seen.append((kind, detail))

    def kinds(self) -> list[str]:
        with self.lock:
            return [kind for kind, _ in self.seen]


def make_reporter(api: RecordingApi, events: Events | None = None, **options: Any) -> Reporter:
    settings: dict[str, Any] = {"heartbeat_s": 5.0, "report_deadline_s": 30.0, **options}
    reporter = Reporter(
        api_url=api.url,
        job_token=settings.pop("job_token", TOKEN),
        training_id="job-1",
        learner=1,
        attempt=0,
        on_event=events or Events(),
        **settings,
    )
    reporter.start()
    return reporter


def test_items_arrive_in_order_in_batches_of_at_most_500(api: RecordingApi) -> None:
    reporter = make_reporter(api, batch_max=500)
    assert reporter.status("DOWNLOADING") == 1
    for index in range(1200):
        reporter.log("stdout", f"line {index}")
    assert reporter.emetric("train", 3, {"loss": 0.5}, at=12.0) == 1202

    assert reporter.drain(10.0)
    assert [item["seq"] for item in api.items()] == list(range(1, 1203))
    assert api.log_texts() == [f"line {index}" for index in range(1200)]
    (metric,) = api.items("emetric")
    assert (metric["iteration"], metric["values"], metric["time"]) == (3, {"loss": 0.5}, 12.0)
    assert max(len(batch["items"]) for batch in api.batches) == 500
    assert api.items("status")[0] == {
        "type": "status",
        "seq": 1,
        "time": api.items("status")[0]["time"],
        "status": "DOWNLOADING",
        "reason": None,
        "exit_code": None,
        "error_code": None,
    }


def test_heartbeats_go_out_when_nothing_else_does(api: RecordingApi) -> None:
    reporter = make_reporter(api, heartbeat_s=0.05)
    wait_until(lambda: api.heartbeats() >= 3, timeout_s=5, what="heartbeats")
    assert reporter.drain(5.0)
    assert api.items() == []


def segments(directory: Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.startswith("segment-"))


def test_a_long_outage_spills_to_disk_in_bounded_memory_and_loses_nothing(
    api: RecordingApi, tmp_path: Path
) -> None:
    api.stop()
    memory = 16 * 1024
    spool = Spool(str(tmp_path / "spool"), memory_bytes=memory, segment_bytes=64 * 1024)
    reporter = make_reporter(api, spool=spool)
    reporter.status("PROCESSING")
    peak = 0
    for index in range(20_000):
        reporter.log("stdout", f"line {index}")
        peak = max(peak, spool.memory_bytes)
    reporter.status("COMPLETED")
    # The head, plus the write buffer (which is written out once it reaches its chunk, or
    # waits while the disk is slow), plus the one item that tipped it over.
    assert peak <= 2 * memory + 1024
    assert reporter.pending_count == 20_002
    assert len(segments(tmp_path / "spool")) > 3
    api.start()

    assert reporter.drain(30.0)
    assert api.statuses() == ["PROCESSING", "COMPLETED"]
    assert api.log_texts() == [f"line {index}" for index in range(20_000)]
    seqs = [item["seq"] for item in api.items()]
    assert seqs == list(range(1, 20_003))
    assert reporter.spooled_items > 19_000
    assert segments(tmp_path / "spool") == []


def produce(reporter: Reporter, lines: int) -> threading.Thread:
    """A reader thread's loop: wait for room, then queue the next line."""

    def run() -> None:
        for index in range(lines):
            reporter.wait_for_room()
            reporter.log("stdout", f"line {index}")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_full_spool_holds_the_producer_back_until_the_api_returns(
    api: RecordingApi, tmp_path: Path
) -> None:
    api.stop()
    memory, disk = 8 * 1024, 32 * 1024
    spool = Spool(
        str(tmp_path / "spool"), memory_bytes=memory, disk_bytes=disk, segment_bytes=8 * 1024
    )
    reporter = make_reporter(api, spool=spool)
    producer = produce(reporter, 5000)
    wait_until(lambda: reporter.waiting_producers == 1, timeout_s=10, what="back-pressure")
    # Held back, not dropping: memory and disk stay within their limits.
    assert producer.is_alive()
    assert spool.memory_bytes <= 2 * memory + ITEM_OVERHEAD + 20
    assert spool.disk_bytes <= disk + 8 * 1024
    assert reporter.pending_count < 5000
    api.start()

    producer.join(30)
    assert not producer.is_alive()
    assert reporter.drain(30.0)
    assert api.log_texts() == [f"line {index}" for index in range(5000)]
    assert [item["seq"] for item in api.items()] == list(range(1, 5001))


def test_a_producer_held_back_is_released_when_the_reporter_gives_up(
    api: RecordingApi, tmp_path: Path
) -> None:
    api.stop()
    events = Events()
    spool = Spool(str(tmp_path / "spool"), memory_bytes=4096, disk_bytes=4096)
    reporter = make_reporter(api, events, spool=spool, report_deadline_s=0.5)
    producer = produce(reporter, 2000)
    producer.join(15)
    assert not producer.is_alive()
    assert events.kinds() == [GAVE_UP]
    assert not reporter.drain(1.0)
    assert segments(tmp_path / "spool") == []


def test_halt_and_cancel_answers_are_announced_once(api: RecordingApi) -> None:
    events = Events()
    reporter = make_reporter(api, events, heartbeat_s=0.05)
    api.halt = True
    wait_until(lambda: HALT in events.kinds(), timeout_s=5, what="halt")
    api.cancel = True
    wait_until(lambda: CANCEL in events.kinds(), timeout_s=5, what="cancel")
    wait_until(lambda: api.heartbeats() >= 6, timeout_s=5, what="more heartbeats")
    assert reporter.drain(5.0)
    assert events.kinds() == [HALT, CANCEL]


def test_each_new_batch_the_api_answers_with_is_passed_on_once(api: RecordingApi) -> None:
    told: list[dict[str, Any]] = []
    reporter = make_reporter(api, heartbeat_s=0.05, on_batch=told.append)
    wait_until(lambda: api.heartbeats() >= 2, timeout_s=5, what="heartbeats")
    assert told == [], "no batch in the answers: nothing to pass on"
    first = {"batch_size": 128, "micro_batch_size": 64, "accumulation_steps": 1}
    api.batch = first
    wait_until(lambda: told, timeout_s=5, what="the first batch")
    seen = api.heartbeats()
    wait_until(lambda: api.heartbeats() >= seen + 3, timeout_s=5, what="more heartbeats")
    assert told == [first], "the same batch again is no change"
    second = {"batch_size": 512, "micro_batch_size": 128, "accumulation_steps": 2}
    api.batch = second
    wait_until(lambda: len(told) == 2, timeout_s=5, what="the second batch")
    assert told == [first, second]
    assert reporter.drain(5.0)


def test_posts_keep_the_pace_the_api_asks_but_statuses_and_the_last_reports_do_not(
    api: RecordingApi,
) -> None:
    api.pace_s = 0.8
    reporter = make_reporter(api, heartbeat_s=0.05)
    wait_until(lambda: api.heartbeats() >= 1, timeout_s=5, what="the first answer")
    for index in range(40):  # a line every 50 ms for two seconds
        reporter.log("stdout", f"line {index}")
        time.sleep(0.05)
    wait_until(lambda: len(api.log_texts()) == 40, timeout_s=5, what="the lines")
    assert api.log_texts() == [f"line {index}" for index in range(40)]
    with api.lock:
        times = list(api.arrivals)
        sizes = [len(batch["items"]) for batch in api.batches]
    # Heartbeats and lines alike went out no closer than the pace.
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert min(gaps) >= 0.5, gaps  # 0.8 asked; a post may spend longer in transit
    assert max(sizes) >= 8, f"lines gathered into fewer, larger posts: {sizes}"

    api.pace_s = 30.0
    reporter.log("stdout", "told a long pace")
    wait_until(lambda: len(api.log_texts()) == 41, timeout_s=5, what="the long pace told")
    reporter.status("HALTED")
    wait_until(lambda: api.statuses() == ["HALTED"], timeout_s=10, what="the status, at once")
    reporter.log("stdout", "the last line")
    assert reporter.drain(5.0), "the last reports are not held back by the pace"
    assert api.log_texts()[-1] == "the last line"


def test_a_revoked_token_means_the_job_is_gone(api: RecordingApi) -> None:
    events = Events()
    reporter = make_reporter(api, events, job_token="revoked")
    reporter.status("PROCESSING")
    wait_until(lambda: events.kinds() == [GONE], timeout_s=5, what="gone")
    assert events.seen == [(GONE, "HTTP 401")]
    assert reporter.log("stdout", "after") == 0
    assert not reporter.drain(1.0)
    assert api.items() == []


def test_delivery_gives_up_after_the_deadline(api: RecordingApi) -> None:
    api.fail_next(500, -1)
    events = Events()
    reporter = make_reporter(api, events, report_deadline_s=0.3)
    reporter.status("PROCESSING")
    assert not reporter.drain(10.0)
    assert events.kinds() == [GAVE_UP]
    assert "500" in events.seen[0][1]


def test_a_refused_batch_is_not_resent_forever(api: RecordingApi) -> None:
    api.fail_next(422, 1)
    reporter = make_reporter(api)
    reporter.log("stdout", "refused")
    wait_until(lambda: len(api.batches) == 1, timeout_s=5, what="the refused batch")
    reporter.log("stdout", "accepted")
    assert not reporter.drain(5.0)
    assert api.log_texts() == ["accepted"]
    assert len(api.batches) == 2
    # The refused item was never stored: the next one takes its seq.
    assert [item["seq"] for item in api.items()] == [1]


def test_a_reporter_ahead_of_the_api_renumbers_from_what_it_expects(api: RecordingApi) -> None:
    reporter = make_reporter(api)
    reporter.log("stdout", "one")
    reporter.log("stdout", "two")
    wait_until(lambda: len(api.items()) == 2, timeout_s=5, what="the first lines")
    # The API lost what it had (say, restored from a backup): it expects seq 1 again.
    with api.lock:
        api.last_seq.clear()
    reporter.log("stdout", "three")
    reporter.status("COMPLETED")
    assert reporter.drain(5.0)
    assert api.refusals == [3]
    assert api.log_texts() == ["one", "two", "three"]
    assert [item["seq"] for item in api.items()] == [1, 2, 1, 2]


def test_a_reporter_behind_the_api_is_not_swallowed_as_old(api: RecordingApi) -> None:
    # Another controller of this attempt already reported 40 items (a restart mid-attempt).
    with api.lock:
        api.last_seq[("job-1", 1, 0)] = 40
    reporter = make_reporter(api)
    reporter.status("PROCESSING")
    for index in range(5):
        reporter.log("stdout", f"line {index}")
    assert reporter.drain(5.0)
    assert api.statuses() == ["PROCESSING"]
    assert api.log_texts() == [f"line {index}" for index in range(5)]
    assert [item["seq"] for item in api.items()] == list(range(41, 47))


def test_a_heartbeat_tells_an_idle_reporter_where_the_stream_is(api: RecordingApi) -> None:
    with api.lock:
        api.last_seq[("job-1", 1, 0)] = 7
    reporter = make_reporter(api, heartbeat_s=0.05)
    wait_until(lambda: api.heartbeats() >= 2, timeout_s=5, what="heartbeats")
    reporter.log("stdout", "after the heartbeat")
    assert reporter.drain(5.0)
    assert [item["seq"] for item in api.items()] == [8]
    assert api.refusals == []


def test_reports_fail_over_to_the_next_replica_and_lose_nothing(
    api: RecordingApi, tmp_path: Path
) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    gone_url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    told: list[str] = []
    try:
        reporter = Reporter(
            api_url=gone_url,
            fallback_urls=[api.url],
            job_token=TOKEN,
            training_id="job-1",
            learner=1,
            attempt=0,
            report_deadline_s=30.0,
            diagnostics=told.append,
        )
        reporter.start()
        for index in range(50):
            reporter.log("stdout", f"line {index}")
        assert reporter.drain(10.0)
    finally:
        closed.close()
    assert api.log_texts() == [f"line {index}" for index in range(50)]
    assert any(f"fail over to {api.url}" in message for message in told), told
