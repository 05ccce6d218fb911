"""The ordered report stream from one learner attempt to the API.

This module owns the report protocol's sending side: every status, log line and metric
gets the next ``seq`` when it is queued, and one sender thread posts them in order, in
batches, retrying through API outages (the server drops seqs it already has, so resending
is safe) and passing the API's halt, cancel and "job gone" answers back to the controller.

The server accepts only a gapless stream: a batch's seqs are consecutive and the first new
one follows the last it stored. So whatever never reached the server is renumbered before
it is sent: items dropped while the API was away, a batch the API refused, and, when the
API says it expects another seq (409 with ``expected_seq``) or already holds later ones
(a controller restarted within one attempt), everything still queued.
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
        first_seq = self._pending[0]["seq"]
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
        # Held items were sent as they are; what follows them closes the gaps.
        self._renumber_locked(self._held, first_seq + self._held)

    def _renumber_locked(self, start: int, first_seq: int) -> None:
        """Give the pending items from position ``start`` on consecutive seqs from
        ``first_seq``; only items the server has not stored may be renumbered."""
        moved: dict[int, int] = {}
        seq = first_seq
        for item in itertools.islice(self._pending, start, None):
            if item["seq"] in self._dropped_counts:
                moved[seq] = self._dropped_counts.pop(item["seq"])
            item["seq"] = seq
            seq += 1
        self._dropped_counts.update(moved)
        self._seq = self._pending[-1]["seq"] if self._pending else first_seq - 1

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
            self._acknowledge(batch, payload)
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
        elif status == 409 and self._resync(batch, _expected_seq(payload)):
            self._diagnostics(f"API expects another seq; renumbered from {batch[0]['seq']}")
        else:
            # Resending a batch the API refuses would stall the stream forever. It stored
            # none of it, so the items after it take its seqs: the stream stays gapless.
            self._diagnostics(f"API refused {len(batch)} items with {status}: {payload[:300]!r}")
            with self._cond:
                self._rejected_items += len(batch)
                for _ in range(len(batch)):
                    self._pending.popleft()
                self._held = 0
                if batch:
                    self._renumber_locked(0, batch[0]["seq"])
                self._cond.notify_all()

    def _resync(self, batch: list[dict[str, Any]], expected: int | None) -> bool:
        """Renumber everything queued from ``expected`` (the API stored none of ``batch``);
        False when that would change nothing, so the batch is refused rather than resent."""
        if expected is None or not batch or expected == batch[0]["seq"]:
            return False
        with self._cond:
            self._held = 0
            self._renumber_locked(0, expected)
            self._cond.notify_all()
        return True

    def _acknowledge(self, batch: list[dict[str, Any]], payload: bytes) -> None:
        answer = _json_object(payload)
        last_seq = answer.get("last_seq")
        server_seq = last_seq if isinstance(last_seq, int) and last_seq >= 0 else None
        with self._cond:
            self._first_failure_at = None
            skipped_as_old = answer.get("accepted") == 0
            if (
                batch
                and server_seq is not None
                and server_seq > batch[-1]["seq"]
                and skipped_as_old
            ):
                # The API holds later seqs than ours (another controller of this attempt
                # reported before us), so it took our items for old ones: none was stored.
                self._held = 0
                self._renumber_locked(0, server_seq + 1)
                self._cond.notify_all()
                return
            for _ in range(len(batch)):
                item = self._pending.popleft()
                self._dropped_counts.pop(item["seq"], None)
            self._held = 0
            if server_seq is not None and self._pending and self._pending[0]["seq"] <= server_seq:
                self._renumber_locked(0, server_seq + 1)
            elif server_seq is not None and not self._pending and self._seq < server_seq:
                self._seq = server_seq
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


def _json_object(payload: bytes) -> dict[str, Any]:
    try:
        answer = json.loads(payload) if payload else {}
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}


def _expected_seq(payload: bytes) -> int | None:
    """The seq a 409 answer says the API expects next, if it says one."""
    detail = _json_object(payload).get("detail")
    expected = detail.get("expected_seq") if isinstance(detail, dict) else None
    if isinstance(expected, bool) or not isinstance(expected, int) or expected < 1:
        return None
    return expected
