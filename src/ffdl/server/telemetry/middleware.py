"""Timing every API request by its route template (``/v1/models/{model_id}``), never by
its raw path, so that the series stay few whatever ids callers send."""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ffdl.server.telemetry.instruments import API_REQUEST_SECONDS

UNMATCHED = "unmatched"


class RequestTiming:
    """Pure ASGI middleware: streams pass through untouched (no body buffering)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            template = getattr(scope.get("route"), "path", None) or UNMATCHED
            API_REQUEST_SECONDS.labels(template, scope["method"], str(status)).observe(
                time.perf_counter() - started
            )
