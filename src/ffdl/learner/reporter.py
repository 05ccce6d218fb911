"""The ordered report stream from one learner attempt to the API.

This module owns the report protocol's sending side: every status, log line and metric
gets the next ``seq`` when it is queued, and one sender thread posts them in order, in
batches, retrying through API outages (the server drops seqs it already has, so resending
is safe) and passing the API's halt, cancel and "job gone" answers back to the controller.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import http.client

# Answers meaning the job no longer exists for us or our token was revoked.
GONE_HTTP_STATUSES = frozenset({401, 403, 404, 410})
# Answers a later retry may cure (overload, restarts behind a proxy).
RETRY_HTTP_STATUSES = frozenset({408, 429})

HALT = "halt"
CANCEL = "cancel"
GONE = "gone"
GAVE_UP = "gave_up"

BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 2.0
# After an overflow, logs are dropped down to this share of the limit, so that a long outage
# does not rescan the whole queue for every new line.
DROP_TO_FRACTION = 0.9

EventHandler = Callable[[str, str], None]


class _TransientFailure(Exception):
    """The API could not be reached or answered in a way worth retrying."""


def _ignore_event(event: str, detail: str) -> None:
    del event, detail


def _ignore_message(message: str) -> None:
    del message


class Reporter:
    """Queues report items and delivers them in ``seq`` order from a single thread.

    ``on_event(kind, detail)`` is called from the sender thread, at most once per kind:
    ``HALT`` and ``CANCEL`` when the API asks for them, ``GONE`` on 401/403/404/410 (the
    queue is then discarded), ``GAVE_UP`` when the API stayed unreachable for
    ``report_deadline_s`` since the first failure.
    """

    def __init__(
        self,
        *,
        api_url: str,
        job_token: str,
        training_id: str,
        learner: int,
        attempt: int,
        heartbeat_s: float = 2.0,
        report_deadline_s: float = 600.0,
        max_pending: int = 200_000,
        batch_max: int = 500,
        batch_wait_s: float = 0.2,
        on_event: EventHandler = _ignore_event,
        diagnostics: Callable[[str], None] = _ignore_message,
    ) -> None:
        url = urlsplit(api_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"unusable api_url {api_url!r}")
        self._scheme = url.scheme
        self._host = url.hostname
        self._port = url.port
        self._path = (
            f"{url.path.rstrip('/')}/v1/internal/jobs/{training_id}/learners/{learner}/reports"
        )
        self._headers = {
            "Authorization": f"Bearer {job_token}",
            "Content-Type": "application/json",
        }
        self._attempt = attempt
        self._heartbeat_s = heartbeat_s
        self._deadline_s = report_deadline_s
        self._request_timeout_s = min(10.0, max(1.0, report_deadline_s))
        self._max_pending = max_pending
        self._batch_max = batch_max
        self._batch_wait_s = batch_wait_s
        self._on_event = on_event
        self._diagnostics = diagnostics

        self._cond = threading.Condition()
        self._pending: deque[dict[str, Any]] = deque()
        self._seq = 0
        # The first ``_held`` pending items were sent and not yet acknowledged; overflow
        # dropping leaves them alone so that a retry resends exactly the same batch.
        self._held = 0
        self._first_pending_at = 0.0
        self._last_attempt_at = time.monotonic()
        self._first_failure_at: float | None = None
        self._dropped_counts: dict[int, int] = {}
        self._announced: set[str] = set()
        self._closing = False
        self._gone = False
        self._gave_up = False
        self._rejected_items = 0
        self._connection: http.client.HTTPConnection | None = None
        self._thread = threading.Thread(target=self._run, name="report-sender", daemon=True)

    # -- queueing -------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def status(
        self,
        status: str,
        *,
        reason: str | None = None,
        exit_code: int | None = None,
        error_code: str | None = None,
    ) -> int:
        return self._add(
            "status",
            {"status": status, "reason": reason, "exit_code": exit_code, "error_code": error_code},
        )

    def log(self, stream: str, text: str) -> int:
        return self._add("log", {"stream": stream, "text": text})

    def emetric(
        self,
        group: str,
        iteration: int | None,
        values: dict[str, float],
        *,
        at: float | None = None,
    ) -> int:
        return self._add(
            "emetric", {"group": group, "iteration": iteration, "values": values}, at=at
        )

    def _add(self, kind: str, fields: dict[str, Any], at: float | None = None) -> int:
        with self._cond:
            if self._gone or self._gave_up:
                return 0
            self._seq += 1
            item = {"type": kind, "seq": self._seq, "time": time.time() if at is None else at}
            item.update(fields)
            if not self._pending:
                self._first_pending_at = time.monotonic()
            self._pending.append(item)
            if len(self._pending) > self._max_pending:
                self._drop_oldest_logs()
            self._cond.notify_all()
            return self._seq

    def _drop_oldest_logs(self) -> None:
        excess = len(self._pending) - int(self._max_pending * DROP_TO_FRACTION)
        kept: deque[dict[str, Any]] = deque()
        dropped = 0
        last_dropped: dict[str, Any] | None = None
        notice_position = 0
        for position, item in enumerate(self._pending):
            if excess > 0 and position >= self._held and item["type"] == "log":
                excess -= 1
                dropped += self._dropped_counts.pop(item["seq"], 1)
                last_dropped, notice_position = item, len(kept)
                continue
            kept.append(item)
        if last_dropped is not None:
            # The notice takes the newest dropped line's seq and place, so the stream keeps
            # strictly increasing seqs and the notice sits where the gap is.
            notice = {
                "type": "log",
                "seq": last_dropped["seq"],
                "time": last_dropped["time"],
                "stream": "ffdl",
                "text": f"[ffdl] {dropped} log lines dropped while the API was unreachable",
            }
            self._dropped_counts[notice["seq"]] = dropped
            kept.insert(notice_position, notice)
        self._pending = kept

    # -- draining -------------------------------------------------------------------------

    def drain(self, timeout_s: float) -> bool:
        """Send what is queued and wait for it to be acknowledged; True if everything ever
        queued was. The sender stops once the queue is empty: nothing queued later goes out.
        """
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            while self._pending and not (self._gone or self._gave_up):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            return self._delivered_locked()

    def _delivered_locked(self) -> bool:
        return not (self._pending or self._gone or self._gave_up or self._rejected_items)

    @property
    def pending_count(self) -> int:
        with self._cond:
            return len(self._pending)

    # -- sending --------------------------------------------------------------------------

    def _run(self) -> None:
        backoff = BACKOFF_FIRST_S
        while (batch := self._next_batch()) is not None:
            try:
                self._deliver(batch)
            except _TransientFailure as exc:
                if self._note_failure(str(exc)):
                    return
                time.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
            else:
                backoff = BACKOFF_FIRST_S
        self._close_connection()

    def _next_batch(self) -> list[dict[str, Any]] | None:
        """Block until a batch (possibly an empty heartbeat) is due; None when finished."""
        with self._cond:
            while True:
                if self._gone or self._gave_up:
                    return None
                now = time.monotonic()
                if self._held:
                    return list(itertools.islice(self._pending, self._held))
                if self._pending:
                    wait = self._first_pending_at + self._batch_wait_s - now
                    if len(self._pending) >= self._batch_max or self._closing or wait <= 0:
                        self._held = min(len(self._pending), self._batch_max)
                        return list(itertools.islice(self._pending, self._held))
                elif self._closing:
                    return None
                else:
                    wait = self._last_attempt_at + self._heartbeat_s - now
                    if wait <= 0:
                        return []
                self._cond.wait(wait)

    def _deliver(self, batch: list[dict[str, Any]]) -> None:
        body = json.dumps({"attempt": self._attempt, "items": batch}).encode()
        with self._cond:
            self._last_attempt_at = time.monotonic()
        status, payload = self._post(body)
        if 200 <= status < 300:
            self._acknowledge(len(batch), payload)
        elif status in GONE_HTTP_STATUSES:
            self._diagnostics(f"API answered {status}: the job is gone; discarding reports")
            with self._cond:
                self._gone = True
                self._pending.clear()
                self._held = 0
                self._cond.notify_all()
            self._announce(GONE, f"HTTP {status}")
        elif status >= 500 or status in RETRY_HTTP_STATUSES:
            raise _TransientFailure(f"API answered {status}")
        elif status == 413 and len(batch) > 1:
            with self._cond:
                self._held = len(batch) // 2
            self._diagnostics(f"API refused a batch of {len(batch)} as too large; halving it")
        else:
            # Resending a batch the API refuses would stall the stream forever.
            self._diagnostics(f"API refused {len(batch)} items with {status}: {payload[:300]!r}")
            with self._cond:
                self._rejected_items += len(batch)
                for _ in range(len(batch)):
                    self._pending.popleft()
                self._held = 0
                self._cond.notify_all()

    def _acknowledge(self, count: int, payload: bytes) -> None:
        try:
            answer = json.loads(payload) if payload else {}
        except ValueError:
            answer = {}
        if not isinstance(answer, dict):
            answer = {}
        with self._cond:
            for _ in range(count):
                item = self._pending.popleft()
                self._dropped_counts.pop(item["seq"], None)
            self._held = 0
            self._first_failure_at = None
            self._cond.notify_all()
        if answer.get("cancel") is True:
            self._announce(CANCEL, "cancelled through the API")
        if answer.get("halt") is True:
            self._announce(HALT, "halted through the API")

    def _note_failure(self, reason: str) -> bool:
        """Record a failed attempt; True when the deadline has passed and sending stops."""
        now = time.monotonic()
        with self._cond:
            if self._first_failure_at is None:
                self._first_failure_at = now
                self._diagnostics(f"report delivery failing: {reason}; retrying")
            if now - self._first_failure_at < self._deadline_s:
                return False
            self._gave_up = True
            self._cond.notify_all()
        detail = f"API unreachable for {self._deadline_s:g} s ({reason})"
        self._diagnostics(f"giving up on reports: {detail}")
        self._announce(GAVE_UP, detail)
        return True

    def _announce(self, kind: str, detail: str) -> None:
        if kind in self._announced:
            return
        self._announced.add(kind)
        self._on_event(kind, detail)

    def _post(self, body: bytes) -> tuple[int, bytes]:
        # Imported here, on the sender thread: http.client pulls in the email package, which
        # would otherwise delay the controller's start by tens of milliseconds.
        import http.client

        for _ in range(2):
            reused = self._connection is not None
            connection = self._connection or self._connect()
            self._connection = connection
            try:
                connection.request("POST", self._path, body=body, headers=self._headers)
                response = connection.getresponse()
                payload = response.read()
            except (OSError, http.client.HTTPException) as exc:
                self._close_connection()
                if reused:
                    # A kept-alive connection the server has since closed; try a fresh one.
                    continue
                raise _TransientFailure(f"{type(exc).__name__}: {exc}") from exc
            if response.will_close:
                self._close_connection()
            return response.status, payload
        raise _TransientFailure("connection lost")

    def _connect(self) -> http.client.HTTPConnection:
        import http.client

        if self._scheme == "https":
            return http.client.HTTPSConnection(
                self._host, self._port, timeout=self._request_timeout_s
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=self._request_timeout_s)

    def _close_connection(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
