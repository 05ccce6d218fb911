"""A closed-loop HTTP load generator on 127.0.0.1, and an ``ffdl up --workers`` server.

``LoadGenerator`` runs an asyncio loop in a thread: up to ``max_clients`` clients, of which
the first ``clients`` (changed at any time with ``set``) each send one request after
another (waiting ``think_s`` between them) over one shared keep-alive connection pool, as a
busy client library does. Every answer is recorded: its time, latency, and whether it
failed (an error status or any transport error: a reset, a refused or dropped connection).
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.integration.live import LiveServer

# Below the server's keep-alive (``pool_keepalive_s``, 5 s): a client must give up an idle
# connection before the server may close it, as HTTP clients are advised to.
CLIENT_KEEPALIVE_S = 2.0


@dataclass
class PoolServer(LiveServer):
    """A real ``ffdl up --workers WORKERS`` (the CLI) in a subprocess."""

    workers: str = "1..3"

    def argv(self) -> list[str]:
        ffdl = str(Path(sys.executable).parent / "ffdl")
        port = str(self.port)
        return [ffdl, "up", "--home", str(self.home), "--port", port, "--workers", self.workers]

    def pool(self) -> dict[str, Any]:
        response = self.client.get("/v1/cluster/pool")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body


@dataclass
class Outcome:
    at: float  # time.monotonic() when the answer came
    seconds: float
    failure: str | None


@dataclass
class LoadGenerator:
    url: str
    token: str
    path: str = "/v1/models"
    max_clients: int = 32
    outcomes: list[Outcome] = field(default_factory=list)
    clients: int = 0
    think_s: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def set(self, clients: int, think_s: float = 0.0) -> None:
        self.clients = min(clients, self.max_clients)
        self.think_s = think_s

    def start(self) -> LoadGenerator:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[Outcome]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        return list(self.outcomes)

    @property
    def failures(self) -> list[str]:
        return [o.failure for o in self.outcomes if o.failure is not None]

    async def _run(self) -> None:
        limits = httpx.Limits(
            max_connections=self.max_clients,
            max_keepalive_connections=self.max_clients,
            keepalive_expiry=CLIENT_KEEPALIVE_S,
        )
        headers = {"Authorization": f"Bearer {self.token}"}
        async with httpx.AsyncClient(
            base_url=self.url, headers=headers, limits=limits, timeout=60
        ) as client:
            await asyncio.gather(*(self._client(client, n) for n in range(self.max_clients)))

    async def _client(self, client: httpx.AsyncClient, number: int) -> None:
        while not self._stop.is_set():
            if number >= self.clients:
                await asyncio.sleep(0.02)
                continue
            if self.think_s:
                await asyncio.sleep(self.think_s)
            began = time.monotonic()
            failure: str | None = None
            try:
                response = await client.get(self.path)
                if response.status_code != 200:
                    failure = f"{response.status_code}: {response.text[:200]}"
            except httpx.HTTPError as exc:
                failure = f"{type(exc).__name__}: {exc}"
            now = time.monotonic()
            self.outcomes.append(Outcome(now, now - began, failure))
