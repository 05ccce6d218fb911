"""The pool's gunicorn worker: uvicorn-worker's ``UvicornWorker``, which retires without
a reset and hands busy clients on to the workers a grown pool adds.

When the pool shrinks, gunicorn's arbiter sends the oldest worker SIGTERM and uvicorn shuts
down gracefully: it stops accepting, finishes the requests it has, then runs the app's
lifespan shutdown. Stock uvicorn also closes every *idle* keep-alive connection at once,
and a client may have just sent its next request on one: that request would meet a reset,
although the client did nothing wrong. This worker drains instead:

- an idle connection stays open until its ordinary keep-alive timeout (the same close a
  client meets on any idle connection, which it must expect anyway); a request that
  arrives on it meanwhile is answered, with ``Connection: close``;
- every response from then on says ``Connection: close`` (``LoadMiddleware`` adds it), so
  the client sends its next request on a new connection, to a worker that stays;
- the worker keeps beating gunicorn's heartbeat while it drains, so the arbiter does not
  take a long drain for a hang; requests still running after ``graceful_timeout`` minus
  ``LIFESPAN_GRACE_S`` are cancelled, leaving the lifespan shutdown (loops stopped, leases
  handed back) its own few seconds before the arbiter's deadline.

When the pool grows, clients that keep their connections busy would stay on the workers
they first reached, and a new worker would get only new clients. So a connection that has
served for ``pool_connection_max_s`` ends the same way, ``Connection: close`` on a
response: its client reconnects, and the kernel hands the new connection to whichever
worker accepts first, most often an idle one.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from typing import Any

from gunicorn.arbiter import Arbiter  # type: ignore[import-untyped]
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import Server
from uvicorn_worker import UvicornWorker  # type: ignore[import-untyped]

from ffdl.server.pool.counters import CLOSE_CONNECTION, LoadMiddleware

LIFESPAN_GRACE_S = 5


class DrainingH11Protocol(H11Protocol):
    """uvicorn's h11 protocol whose graceful shutdown leaves idle connections to their
    keep-alive timeout, and which ends a connection after a response (``Connection:
    close``) once it is draining or has served for ``max_age_s`` (0: no limit)."""

    max_age_s: float = 0.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._draining = False
        self._born = self.loop.time()

    def shutdown(self) -> None:
        self._draining = True
        if self.cycle is None or self.cycle.response_complete:
            if self.timeout_keep_alive_task is None:
                # Accepted, and no request yet: it may be on its way.
                self.timeout_keep_alive_task = self.loop.call_later(
                    self.timeout_keep_alive, self.timeout_keep_alive_handler
                )
        else:
            self._last_request()

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is None or self.cycle.response_complete:
            return
        old = 0 < self.max_age_s <= self.loop.time() - self._born
        if self._draining or old:
            self._last_request()

    def _last_request(self) -> None:
        """Close the connection after the current response, saying so in it if it has not
        started (``LoadMiddleware`` adds the header)."""
        self.cycle.keep_alive = False
        self.cycle.scope.setdefault("extensions", {})[CLOSE_CONNECTION] = {}


class DrainingServer(Server):
    """uvicorn's server that says when it begins to drain and beats the heartbeat during."""

    def __init__(self, config: Config, on_drain: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_drain = on_drain

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._on_drain()
        beating = asyncio.create_task(self._beat())
        try:
            await super().shutdown(sockets=sockets)
        finally:
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating

    async def _beat(self) -> None:
        notify = self.config.callback_notify
        while notify is not None:
            await asyncio.sleep(1.0)
            await notify()


class PoolWorker(UvicornWorker):  # type: ignore[misc]
    """``UvicornWorker`` serving with ``DrainingServer`` and ``DrainingH11Protocol``."""

    CONFIG_KWARGS: dict[str, Any] = {"loop": "asyncio", "http": DrainingH11Protocol}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        graceful_s = int(self.cfg.graceful_timeout) - LIFESPAN_GRACE_S
        self.config.timeout_graceful_shutdown = max(1, graceful_s)
        max_age_s = float(getattr(self.app, "connection_max_s", 0.0))
        self.config.http = type("PoolH11Protocol", (DrainingH11Protocol,), {"max_age_s": max_age_s})

    def _start_draining(self) -> None:
        if isinstance(self.wsgi, LoadMiddleware):
            self.wsgi.counters.draining = True

    async def _serve(self) -> None:
        self.config.app = self.wsgi
        server = DrainingServer(config=self.config, on_drain=self._start_draining)
        self._install_sigquit_handler()
        await server.serve(sockets=self.sockets)
        if not server.started:
            raise SystemExit(Arbiter.WORKER_BOOT_ERROR)
