"""One simulated learner: what a controller does on the wire, and nothing else.

It starts no process and touches no file. Over the real report API of the real platform
it reports ``DOWNLOADING`` and ``PROCESSING``, then, every ``report_every_s`` (sooner when a
heartbeat is due, later when the API's answers ask a longer ``pace_s``), the log lines and
metric points its rates made since the last batch;
after ``duration_s`` it reports ``STORING`` and its result (``COMPLETED``, or ``FAILED``
with exit code 1). A halt, asked by the backend or in a report's answer, ends it
``HALTED``; a kill ends it at once with no result. Batches follow the report protocol: a
gapless ``seq`` from 1, resent unchanged after a failure, renumbered from the seq a 409
names; 401/403/404/410 mean the job is gone. Reports fail over to the other replicas'
addresses while one cannot be reached.

It counts what it did for the harness's ``/stats``: items acknowledged, the API's answers
by status, the latency of each post, and its backlog (items made, not yet acknowledged).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import httpx

from ffdl.learner.reporter import asked_pace

GONE_STATUSES = frozenset({401, 403, 404, 410})
BATCH_MAX_ITEMS = 2000
BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 2.0
RETRY_STATUSES = frozenset({0, 408, 429})
LATENCY_WINDOW = 20_000


@dataclass(frozen=True, slots=True)
class Behaviour:
    """What a simulated learner does: for how long, how chatty, and how it ends."""

    duration_s: float
    lines_per_s: float
    metrics_per_s: float
    report_every_s: float = 1.0
    heartbeat_s: float = 2.0
    result: str = "COMPLETED"


@dataclass(frozen=True, slots=True)
class Identity:
    """Which learner attempt this is, and where and how it reports."""

    training_id: str
    learner: int
    attempt: int
    job_token: str
    api_urls: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"{self.training_id}/{self.learner}/{self.attempt}"


@dataclass
class Counts:
    """What every simulated learner of a harness did, together."""

    lines_acked: int = 0
    metrics_acked: int = 0
    posts: int = 0
    refused_items: int = 0
    answers: Counter[int] = field(default_factory=Counter)
    # The latest posts' latencies (a bounded window, whatever the run's length).
    post_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    backlog: int = 0

    def snapshot(self) -> dict[str, Any]:
        latencies = sorted(self.post_seconds)

        def quantile(q: float) -> float | None:
            if not latencies:
                return None
            return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 2)

        return {
            "lines_acked": self.lines_acked,
            "metrics_acked": self.metrics_acked,
            "posts": self.posts,
            "refused_items": self.refused_items,
            "answers": {str(status): n for status, n in sorted(self.answers.items())},
            "post_p50_ms": quantile(0.50),
            "post_p99_ms": quantile(0.99),
            "backlog_items": self.backlog,
        }


class SimulatedLearner:
    """Runs one learner attempt's reports as an asyncio task of the harness."""

    def __init__(
        self, identity: Identity, behaviour: Behaviour, http: httpx.AsyncClient, counts: Counts
    ) -> None:
        self.identity = identity
        self.behaviour = behaviour
        self._http = http
        self._counts = counts
        self._pending: list[dict[str, Any]] = []
        self._next_seq = 1
        self._target = 0
        self._pace_s = 0.0
        self._halt = asyncio.Event()
        self.result: dict[str, Any] | None = None
        self.killed = False
        self.gone = False
        self._lines = itertools.count(1)
        self._iterations = itertools.count(1)
        self.task: asyncio.Task[None] | None = None

    # -- what the backend asks ------------------------------------------------------------

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name=self.identity.key)

    def halt(self) -> None:
        self._halt.set()

    def kill(self) -> None:
        self.killed = True
        if self.task is not None:
            self.task.cancel()

    @property
    def state(self) -> str:
        if self.result is not None:
            return "exited"
        if self.killed or self.gone or (self.task is not None and self.task.done()):
            return "missing"
        return "running"

    # -- the run --------------------------------------------------------------------------

    async def _run(self) -> None:
        b = self.behaviour
        started = time.monotonic()
        self._status("DOWNLOADING")
        self._status("PROCESSING")
        last = started
        owed_lines = owed_metrics = 0.0
        while not self.gone:
            # What the command printed since the last wake-up (up to its end), first: a
            # learner paced for longer than its run still reports every line of it.
            now = min(time.monotonic(), started + b.duration_s)
            owed_lines += b.lines_per_s * (now - last)
            owed_metrics += b.metrics_per_s * (now - last)
            last = now
            for _ in range(int(owed_lines)):
                self._log(f"simulated line {next(self._lines)}")
            for _ in range(int(owed_metrics)):
                iteration = next(self._iterations)
                self._metric(iteration, {"loss": 1.0 / iteration})
            owed_lines -= int(owed_lines)
            owed_metrics -= int(owed_metrics)
            if self._halt.is_set():
                await self._finish("HALTED", "halted", None)
                return
            if now - started >= b.duration_s:
                failed = b.result == "FAILED"
                await self._finish(
                    b.result,
                    "simulated command exited with 1" if failed else None,
                    1 if failed else 0,
                )
                return
            await self._send_all()
            wait = max(min(b.report_every_s, b.heartbeat_s), self._pace_s)
            wait = min(wait, max(0.0, started + b.duration_s - now))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._halt.wait(), timeout=max(wait, 0.01))

    async def _finish(self, status: str, reason: str | None, exit_code: int | None) -> None:
        if status != "HALTED":
            self._status("STORING")
        error_code = "C201" if status == "FAILED" else None
        self._status(status, reason=reason, exit_code=exit_code, error_code=error_code)
        await self._send_all()
        self.result = {
            "status": status,
            "reason": reason,
            "exit_code": exit_code,
            "error_code": error_code,
        }

    # -- items --------------------------------------------------------------------------

    def _item(self, kind: str, **fields: Any) -> None:
        self._pending.append({"type": kind, "time": time.time(), **fields})
        self._counts.backlog += 1

    def _status(self, status: str, **fields: Any) -> None:
        self._item("status", status=status, **fields)

    def _log(self, text: str) -> None:
        self._item("log", stream="stdout", text=text)

    def _metric(self, iteration: int, values: dict[str, float]) -> None:
        self._item("emetric", group="train", iteration=iteration, values=values)

    # -- sending ------------------------------------------------------------------------

    async def _send_all(self) -> None:
        """Deliver what is pending (an empty batch is a heartbeat); retry until done."""
        backoff = BACKOFF_FIRST_S
        first = True
        while (self._pending or first) and not self.gone:
            first = False
            batch = self._pending[:BATCH_MAX_ITEMS]
            status, answer = await self._post(batch)
            if 200 <= status < 300:
                self._acknowledged(batch, answer)
                backoff = BACKOFF_FIRST_S
            elif status in GONE_STATUSES:
                self.gone = True
                self._counts.backlog -= len(self._pending)
                self._pending.clear()
            elif status == 409 and _expected_seq(answer) is not None:
                self._next_seq = int(_expected_seq(answer) or self._next_seq)
            elif status in RETRY_STATUSES or status >= 500:
                # Unreachable, away or overloaded: the same batch again, later.
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
            else:
                # Refused for good: the items after it take its seqs, as a controller does.
                del self._pending[: len(batch)]
                self._counts.backlog -= len(batch)
                self._counts.refused_items += len(batch)

    def _acknowledged(self, batch: list[dict[str, Any]], answer: dict[str, Any]) -> None:
        del self._pending[: len(batch)]
        self._next_seq += len(batch)
        last_seq = answer.get("last_seq")
        if isinstance(last_seq, int) and last_seq >= self._next_seq:
            self._next_seq = last_seq + 1
        pace = asked_pace(answer)
        if pace is not None:
            self._pace_s = pace
        self._counts.backlog -= len(batch)
        self._counts.lines_acked += sum(1 for item in batch if item["type"] == "log")
        self._counts.metrics_acked += sum(1 for item in batch if item["type"] == "emetric")
        if answer.get("halt") is True or answer.get("cancel") is True:
            self._halt.set()

    async def _post(self, batch: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
        identity = self.identity
        items = [{"seq": seq, **item} for seq, item in enumerate(batch, self._next_seq)]
        body = json.dumps({"attempt": identity.attempt, "items": items}).encode()
        path = f"/v1/internal/jobs/{identity.training_id}/learners/{identity.learner}/reports"
        headers = {"Authorization": f"Bearer {identity.job_token}"}
        headers["Content-Type"] = "application/json"
        url = identity.api_urls[self._target % len(identity.api_urls)]
        started = time.monotonic()
        try:
            response = await self._http.post(f"{url}{path}", content=body, headers=headers)
        except httpx.HTTPError:
            self._target += 1  # the next replica, as a controller fails over
            self._counts.answers[0] += 1
            return 0, {}
        self._counts.posts += 1
        self._counts.post_seconds.append(time.monotonic() - started)
        self._counts.answers[response.status_code] += 1
        try:
            answer = response.json()
        except ValueError:
            answer = {}
        return response.status_code, answer if isinstance(answer, dict) else {}


def _expected_seq(answer: dict[str, Any]) -> int | None:
    detail = answer.get("detail")
    expected = detail.get("expected_seq") if isinstance(detail, dict) else None
    return expected if isinstance(expected, int) and not isinstance(expected, bool) else None
