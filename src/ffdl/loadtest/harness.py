"""The load-testing harness: one process running thousands of simulated learners.

``python -m ffdl.loadtest.harness --port PORT`` serves, on 127.0.0.1 only, what the
``simulated`` backend of every replica asks of it (``ffdl.backends.simulated``):

- ``PUT /learners/{training_id}/{learner}/{attempt}``: start that learner (idempotent: a
  learner that runs or has a result is left as it is); the body gives its token, the API
  addresses to report to and its behaviour (``ffdl.loadtest.learner.Behaviour``);
- ``GET`` of the same path: ``{"state": "running" | "exited" | "missing", "result": ...}``;
- ``POST .../halt`` asks it to end ``HALTED``; ``DELETE`` kills it (no result);
- ``GET /stats``: how many learners are in each state and what they sent (``Counts``).

Every simulated learner is an asyncio task sharing one ``httpx.AsyncClient``. A learner a
replica never heard of is answered ``missing``, as a controller that is gone would be.
This is a tool for measuring the platform under load, never a way to run jobs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ffdl.loadtest.learner import Behaviour, Counts, Identity, SimulatedLearner

# Connections to the API shared by all learners: enough for thousands of learners that
# each post about once a second, few enough for one machine.
MAX_CONNECTIONS = 256


class Harness:
    def __init__(self) -> None:
        self.learners: dict[str, SimulatedLearner] = {}
        self.counts = Counts()
        self.http: httpx.AsyncClient | None = None

    def launch(self, key: str, body: dict[str, Any]) -> SimulatedLearner:
        existing = self.learners.get(key)
        if existing is not None and existing.state != "missing":
            return existing
        training_id, learner, attempt = key.split("/")
        identity = Identity(
            training_id=training_id,
            learner=int(learner),
            attempt=int(attempt),
            job_token=str(body["job_token"]),
            api_urls=tuple(str(url).rstrip("/") for url in body["api_urls"]),
        )
        behaviour = Behaviour(**body["behaviour"])
        assert self.http is not None
        simulated = SimulatedLearner(identity, behaviour, self.http, self.counts)
        self.learners[key] = simulated
        simulated.start()
        return simulated

    def stats(self) -> dict[str, Any]:
        states = Counter(learner.state for learner in self.learners.values())
        return {"learners": dict(states), **self.counts.snapshot()}


def _key(request: Request) -> str:
    params = request.path_params
    return f"{params['training_id']}/{int(params['learner'])}/{int(params['attempt'])}"


def build_app(harness: Harness) -> Starlette:
    async def put_learner(request: Request) -> JSONResponse:
        body = await request.json()
        try:
            learner = harness.launch(_key(request), body)
        except (KeyError, TypeError, ValueError) as exc:
            return JSONResponse({"error": f"bad launch request: {exc}"}, status_code=400)
        return JSONResponse({"state": learner.state})

    async def get_learner(request: Request) -> JSONResponse:
        learner = harness.learners.get(_key(request))
        if learner is None:
            return JSONResponse({"state": "missing", "result": None})
        return JSONResponse({"state": learner.state, "result": learner.result})

    async def halt_learner(request: Request) -> JSONResponse:
        learner = harness.learners.get(_key(request))
        if learner is not None:
            learner.halt()
        return JSONResponse({"ok": True})

    async def kill_learner(request: Request) -> JSONResponse:
        learner = harness.learners.get(_key(request))
        if learner is not None:
            learner.kill()
        return JSONResponse({"ok": True})

    async def stats(_request: Request) -> JSONResponse:
        return JSONResponse(harness.stats())

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        limits = httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=64)
        async with httpx.AsyncClient(limits=limits, timeout=30.0, trust_env=False) as http:
            harness.http = http
            yield
            for learner in harness.learners.values():
                learner.kill()

    path = "/learners/{training_id}/{learner:int}/{attempt:int}"
    return Starlette(
        routes=[
            Route(path, put_learner, methods=["PUT"]),
            Route(path, get_learner, methods=["GET"]),
            Route(path, kill_learner, methods=["DELETE"]),
            Route(path + "/halt", halt_learner, methods=["POST"]),
            Route("/stats", stats, methods=["GET"]),
        ],
        lifespan=lifespan,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Run simulated learners for the 'simulated' backend (load tests only)."
    )
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    config = uvicorn.Config(
        build_app(Harness()), host="127.0.0.1", port=args.port, log_level="warning"
    )
    asyncio.run(uvicorn.Server(config).serve())


if __name__ == "__main__":
    main()
