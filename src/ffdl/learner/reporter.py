"""The ordered report stream from one learner attempt to the API.

This module owns the report protocol's sending side: every status, log line and metric is
queued in order, and one sender thread posts them in order, in batches, retrying through API
outages (the server drops seqs it already has, so resending is safe) and passing the API's
halt, cancel and "job gone" answers back to the controller, and the batch a job that
rebatches in place should now use (``on_batch``). Each answer also names the gap the API
asks between posts (``pace_s``, ``ffdl.server.report_pace``): the sender leaves at least that
long between two posts, sending more items per post, except for a status, which goes out
at once.

Nothing queued is dropped while the API is slow or away. The queue (``spool.Spool``) keeps
its head in memory and spills the rest to disk in the controller's state directory, and the
learner's output waits (``wait_for_room``, so the command blocks on its pipe) only when even
the disk cannot take more. Memory stays bounded: at most 4 MiB of queued items at the head
(``spool.MEMORY_BYTES``), at most as much again waiting to be written to disk, and one batch
of at most ``BATCH_MAX_BYTES`` (1 MiB) of items on its way. Items are lost only when the
stream ends for good: the job is gone (401/403/404/410) or the API stayed unreachable for
``report_deadline_s``.

The server accepts only a gapless stream: a batch's seqs are consecutive and the first new
one follows the last it stored. So items are numbered when they are sent: the oldest
unacknowledged item has ``_next_seq`` and the others follow it. Whatever never reached the
server is renumbered that way: the items after a batch the API refused take its seqs, and,
when the API says it expects another seq (409 with ``expected_seq``) or already holds later
ones (a controller restarted within one attempt), everything still queued starts there.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ffdl.learner.spool import MEMORY_BYTES, Spool

if TYPE_CHECKING:
    import http.client
    import ssl

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
# Fewer, larger batches keep up with a chatty job: each batch is one write on the server
# (committed together with other learners' batches that arrive with it).
BATCH_MAX_ITEMS = 2000
BATCH_MAX_BYTES = 1024 * 1024
# The longest gap between posts an API's ``pace_s`` can ask (a guard, not a setting).
MAX_PACE_S = 60.0
# How often a producer waiting for room retries the disk (which may have room again).
ROOM_RECHECK_S = 1.0

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
    ``report_deadline_s`` since the first failure. ``spool_dir`` is where the queue spills
    to disk (a private temporary directory when None).
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
        spool_dir: str | None = None,
        memory_bytes: int = MEMORY_BYTES,
        spool: Spool | None = None,
        batch_max: int = BATCH_MAX_ITEMS,
        batch_wait_s: float = 0.2,
        on_event: EventHandler = _ignore_event,
        diagnostics: Callable[[str], None] = _ignore_message,
        fallback_urls: Sequence[str] = (),
        on_batch: Callable[[dict[str, Any]], None] | None = None,
        ca_pem: str | None = None,
    ) -> None:
        reports = f"/v1/internal/jobs/{training_id}/learners/{learner}/reports"
        self._targets = [_target(url, reports) for url in dict.fromkeys([api_url, *fallback_urls])]
        self._current = 0
        self._ca_pem = ca_pem
        self._tls: ssl.SSLContext | None = None
        self._headers = {
            "Authorization": f"Bearer {job_token}",
            "Content-Type": "application/json",
        }
        self._attempt = attempt
        self._heartbeat_s = heartbeat_s
        self._deadline_s = report_deadline_s
        self._request_timeout_s = min(10.0, max(1.0, report_deadline_s))
        self._batch_max = batch_max
        self._batch_wait_s = batch_wait_s
        self._on_event = on_event
        self._diagnostics = diagnostics
        # Told each batch the API answers with that differs from the last (a job that
        # takes a new batch while it runs); called on the sender thread.
        self._on_batch = on_batch
        self._last_batch: dict[str, Any] | None = None

        self._lock = threading.Lock()
        # The sender waits on ``_wakeup``; producers short of room and ``drain`` on
        # ``_progress``. Producers wake the sender only when that changes what it does.
        self._wakeup = threading.Condition(self._lock)
        self._progress = threading.Condition(self._lock)
        self._spool = spool if spool is not None else Spool(spool_dir, memory_bytes=memory_bytes)
        self._spool_problem_told = False
        self._next_seq = 1
        # The oldest ``_held`` items were sent and not yet acknowledged: a retry resends
        # exactly them, with the same seqs.
        self._held = 0
        self._first_pending_at = 0.0
        # The gap the API asks between posts (its last answer's ``pace_s``), and whether a
        # status waits to go out regardless.
        self._pace_s = 0.0
        self._urgent = False
        self._last_attempt_at = time.monotonic()
        self._last_progress_at = time.monotonic()
        self._first_failure_at: float | None = None
        self._announced: set[str] = set()
        self._closing = False
        self._gone = False
        self._gave_up = False
        self._rejected_items = 0
        self._waiting_producers = 0
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
            urgent=True,
        )

    def log(self, stream: str, text: str) -> int:
        # Built by hand: the hottest path, one call per line the learner prints.
        return self._add_text(
            f'{{"type":"log","time":{time.time()!r},"stream":{json.dumps(stream)},'
            f'"text":{json.dumps(text)}}}'
        )

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

    def gpu(self, gpus: list[dict[str, float | int | None]]) -> int:
        """One sample of the learner's GPUs (``ffdl.learner.gpu_sampler``)."""
        return self._add("gpu", {"gpus": gpus})

    def _add(
        self, kind: str, fields: dict[str, Any], at: float | None = None, urgent: bool = False
    ) -> int:
        item = {"type": kind, "time": time.time() if at is None else at}
        item.update(fields)
        # ensure_ascii (the default) keeps an item on one line of the spool whatever it holds.
        return self._add_text(json.dumps(item, separators=(",", ":")), urgent)

    def _add_text(self, text: str, urgent: bool = False) -> int:
        """Queue one item (a JSON object without its seq); its seq as things stand now.
        An ``urgent`` item (a status) goes out without waiting for the API's pace."""
        with self._lock:
            if self._gone or self._gave_up:
                return 0
            queued = len(self._spool)
            if not queued:
                self._first_pending_at = time.monotonic()
            self._spool.put(text)
            if urgent and not self._urgent:
                self._urgent = True
                self._wakeup.notify()
            elif queued == 0 or queued + 1 == self._batch_max or self._closing:
                self._wakeup.notify()
            self._tell_spool_problem_locked()
            return self._next_seq + queued

    def wait_for_room(self) -> None:
        """Block while the queue can take no more without growing memory (the disk is at
        its limit or failing); returns at once when it can, or when the stream has ended."""
        with self._lock:
            if not self._spool.full:
                return
            self._waiting_producers += 1
            try:
                while self._spool.full and not (self._gone or self._gave_up):
                    self._progress.wait(ROOM_RECHECK_S)
                    self._spool.flush()
                    self._tell_spool_problem_locked()
            finally:
                self._waiting_producers -= 1

    @property
    def waiting_producers(self) -> int:
        """How many producers wait in ``wait_for_room`` now."""
        with self._lock:
            return self._waiting_producers

    def _tell_spool_problem_locked(self) -> None:
        if self._spool.problem is not None and not self._spool_problem_told:
            self._spool_problem_told = True
            self._diagnostics(f"{self._spool.problem}; holding items in memory meanwhile")

    # -- draining -------------------------------------------------------------------------

    def drain(self, timeout_s: float) -> bool:
        """Send what is queued and wait for it to be acknowledged; True if everything ever
        queued was. Waits while the API keeps acknowledging, however long the queue, and
        gives up after ``timeout_s`` without progress. The sender stops once the queue is
        empty: nothing queued later goes out."""
        with self._lock:
            self._closing = True
            self._last_progress_at = time.monotonic()
            self._wakeup.notify()
            while len(self._spool) and not (self._gone or self._gave_up):
                remaining = self._last_progress_at + timeout_s - time.monotonic()
                if remaining <= 0:
                    break
                self._progress.wait(remaining)
            delivered = self._delivered_locked()
            if delivered:
                self._spool.close()
            return delivered

    def _delivered_locked(self) -> bool:
        return not (len(self._spool) or self._gone or self._gave_up or self._rejected_items)

    @property
    def pending_count(self) -> int:
        with self._lock:
            return len(self._spool)

    @property
    def spooled_items(self) -> int:
        """How many items went through the disk so far."""
        with self._lock:
            return self._spool.spilled_items

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

    def _next_batch(self) -> _Batch | None:
        """Block until a batch (possibly an empty heartbeat) is due; None when finished."""
        with self._lock:
            while True:
                if self._gone or self._gave_up:
                    return None
                now = time.monotonic()
                queued = len(self._spool)
                if self._held:
                    return _Batch(self._next_seq, self._spool.peek(self._held, BATCH_MAX_BYTES))
                if queued:
                    wait = self._first_pending_at + self._batch_wait_s - now
                    if not self._urgent:
                        wait = max(wait, self._last_attempt_at + self._pace_s - now)
                    if queued >= self._batch_max or self._closing or wait <= 0:
                        texts = self._spool.peek(self._batch_max, BATCH_MAX_BYTES)
                        self._tell_spool_problem_locked()
                        if texts:
                            self._held = len(texts)
                            self._urgent = False
                            return _Batch(self._next_seq, texts)
                        # The spool cannot read its disk just now; try again shortly.
                        wait = ROOM_RECHECK_S
                elif self._closing:
                    return None
                else:
                    wait = self._last_attempt_at + max(self._heartbeat_s, self._pace_s) - now
                    if wait <= 0:
                        return _Batch(self._next_seq, [])
                self._wakeup.wait(wait)

    def _deliver(self, batch: _Batch) -> None:
        with self._lock:
            self._last_attempt_at = time.monotonic()
        status, payload = self._post(batch.body(self._attempt))
        count = len(batch.texts)
        if 200 <= status < 300:
            self._acknowledge(batch, payload)
        elif status in GONE_HTTP_STATUSES:
            self._diagnostics(f"API answered {status}: the job is gone; discarding reports")
            with self._lock:
                self._gone = True
                self._spool.clear()
                self._held = 0
                self._progress.notify_all()
            self._announce(GONE, f"HTTP {status}")
        elif status >= 500 or status in RETRY_HTTP_STATUSES:
            raise _TransientFailure(f"API answered {status}")
        elif status == 413 and count > 1:
            with self._lock:
                self._held = count // 2
            self._diagnostics(f"API refused a batch of {count} as too large; halving it")
        elif status == 409 and self._resync(batch, _expected_seq(payload)):
            self._diagnostics(f"API expects another seq; renumbered from {batch.first_seq}")
        else:
            # Resending a batch the API refuses would stall the stream forever. It stored
            # none of it, so the items after it take its seqs: the stream stays gapless.
            self._diagnostics(f"API refused {count} items with {status}: {payload[:300]!r}")
            with self._lock:
                self._rejected_items += count
                self._spool.pop(count)
                self._held = 0
                self._progress.notify_all()

    def _resync(self, batch: _Batch, expected: int | None) -> bool:
        """Renumber everything queued from ``expected`` (the API stored none of ``batch``);
        False when that would change nothing, so the batch is refused rather than resent."""
        if expected is None or not batch.texts or expected == batch.first_seq:
            return False
        with self._lock:
            self._held = 0
            self._next_seq = expected
        return True

    def _acknowledge(self, batch: _Batch, payload: bytes) -> None:
        answer = _json_object(payload)
        last_seq = answer.get("last_seq")
        server_seq = last_seq if isinstance(last_seq, int) and last_seq >= 0 else None
        pace = asked_pace(answer)
        with self._lock:
            if pace is not None:
                self._pace_s = pace
            self._first_failure_at = None
            self._last_progress_at = time.monotonic()
            if (
                batch.texts
                and server_seq is not None
                and server_seq > batch.last_seq
                and answer.get("accepted") == 0
            ):
                # The API holds later seqs than ours (another controller of this attempt
                # reported before us), so it took our items for old ones: none was stored.
                self._held = 0
                self._next_seq = server_seq + 1
                return
            self._spool.pop(len(batch.texts))
            self._next_seq += len(batch.texts)
            self._held = 0
            if server_seq is not None and self._next_seq <= server_seq:
                self._next_seq = server_seq + 1
            self._progress.notify_all()
        told = answer.get("batch")
        if self._on_batch is not None and isinstance(told, dict) and told != self._last_batch:
            self._last_batch = told
            self._on_batch(told)
        if answer.get("cancel") is True:
            self._announce(CANCEL, "cancelled through the API")
        if answer.get("halt") is True:
            self._announce(HALT, "halted through the API")

    def _note_failure(self, reason: str) -> bool:
        """Record a failed attempt; True when the deadline has passed and sending stops."""
        now = time.monotonic()
        with self._lock:
            if self._first_failure_at is None:
                self._first_failure_at = now
                self._diagnostics(f"report delivery failing: {reason}; retrying")
            if now - self._first_failure_at < self._deadline_s:
                return False
            self._gave_up = True
            self._spool.clear()
            self._held = 0
            self._progress.notify_all()
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
        """Send one batch to the current address, failing over to the next ones in turn."""
        failure: _TransientFailure | None = None
        for _ in self._targets:
            try:
                return self._post_to_current(body)
            except _TransientFailure as exc:
                failure = exc
                if len(self._targets) > 1:
                    self._current = (self._current + 1) % len(self._targets)
                    self._diagnostics(
                        f"reports fail over to {self._targets[self._current].name}: {exc}"
                    )
        assert failure is not None
        raise failure

    def _post_to_current(self, body: bytes) -> tuple[int, bytes]:
        # Imported here, on the sender thread: http.client pulls in the email package, which
        # would otherwise delay the controller's start by tens of milliseconds.
        import http.client

        target = self._targets[self._current]
        for _ in range(2):
            reused = self._connection is not None
            connection = self._connection or self._connect()
            self._connection = connection
            try:
                connection.request("POST", target.path, body=body, headers=self._headers)
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

        from ffdl.core.tls import client_context

        target = self._targets[self._current]
        if target.scheme == "https":
            if self._tls is None:
                self._tls = client_context(ca_pem=self._ca_pem)
            return http.client.HTTPSConnection(
                target.host, target.port, timeout=self._request_timeout_s, context=self._tls
            )
        return http.client.HTTPConnection(target.host, target.port, timeout=self._request_timeout_s)

    def _close_connection(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


@dataclass(frozen=True)
class _Target:
    """One control-plane address reports can go to."""

    scheme: str
    host: str
    port: int | None
    path: str
    name: str


def _target(api_url: str, reports: str) -> _Target:
    url = urlsplit(api_url)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(f"unusable api_url {api_url!r}")
    return _Target(url.scheme, url.hostname, url.port, f"{url.path.rstrip('/')}{reports}", api_url)


class _Batch:
    """Queued items as sent: consecutive seqs from ``first_seq``."""

    __slots__ = ("first_seq", "texts")

    def __init__(self, first_seq: int, texts: list[str]) -> None:
        self.first_seq = first_seq
        self.texts = texts

    @property
    def last_seq(self) -> int:
        return self.first_seq + len(self.texts) - 1

    def body(self, attempt: int) -> bytes:
        # Each text is a JSON object; its seq goes in front of its first field.
        items = ",".join(
            f'{{"seq":{seq},{text[1:]}' for seq, text in enumerate(self.texts, self.first_seq)
        )
        return f'{{"attempt":{attempt},"items":[{items}]}}'.encode()


def _json_object(payload: bytes) -> dict[str, Any]:
    try:
        answer = json.loads(payload) if payload else {}
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}


def asked_pace(answer: dict[str, Any]) -> float | None:
    """The gap between posts a report answer asks (``pace_s``), at most ``MAX_PACE_S``;
    None when it asks none or something that is not a gap."""
    pace = answer.get("pace_s")
    if isinstance(pace, int | float) and not isinstance(pace, bool) and pace >= 0:
        return min(float(pace), MAX_PACE_S)
    return None


def _expected_seq(payload: bytes) -> int | None:
    """The seq a 409 answer says the API expects next, if it says one."""
    detail = _json_object(payload).get("detail")
    expected = detail.get("expected_seq") if isinstance(detail, dict) else None
    if isinstance(expected, bool) or not isinstance(expected, int) or expected < 1:
        return None
    return expected
