"""The ASGI application: routers, error rendering, and the lifespan that runs the loops."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from ffdl.backends.base import Backend, BackendConfigError, BackendUnavailable
from ffdl.backends.factory import open_backend
from ffdl.backends.local import SandboxUnavailable
from ffdl.core.errors import FfdlError, Unavailable, error_body
from ffdl.server.auth import JobTokens, bootstrap, load_or_create_secret
from ffdl.server.credentials import CredentialVault
from ffdl.server.home import secure_home
from ffdl.server.leases import LeaseKeeper, new_replica_id
from ffdl.server.loops.autoscaler import AutoscalerLoop
from ffdl.server.loops.lcm import lcm_pass
from ffdl.server.loops.monitor import monitor_pass
from ffdl.server.loops.runner import run_forever
from ffdl.server.loops.scheduler import SchedulerLoop
from ffdl.server.loops.webhooks import WebhookLoop
from ffdl.server.platform import Platform
from ffdl.server.routers import (
    admin,
    audit,
    cluster,
    dashboard,
    events,
    health,
    internal,
    logs,
    metrics,
    models,
    pool,
    stream,
    tokens,
    training_logs,
)
from ffdl.server.routers.health import ffdl_version
from ffdl.server.routers.responses import without_validation_422
from ffdl.server.services.record_archive import archive_pass
from ffdl.server.settings import Settings
from ffdl.server.store.availability import DatabaseAway, DatabaseFull, fault_of, first_line
from ffdl.server.store.db import Store, StoreUnavailable
from ffdl.server.telemetry.middleware import RequestTiming
from ffdl.server.wakeup_relay import WakeupRelay

log = logging.getLogger("ffdl.server")


class FfdlApp(FastAPI):
    """The app, whose OpenAPI lists the answers it really gives (400, never 422)."""

    def openapi(self) -> dict[str, Any]:
        return without_validation_422(super().openapi())


# What ``create_app`` raises for a configuration or an environment it cannot start with;
# ``ffdl up`` reports them in one line.
STARTUP_ERRORS: tuple[type[Exception], ...] = (
    SandboxUnavailable,
    BackendConfigError,
    BackendUnavailable,
    StoreUnavailable,
    ValueError,
)


def prepare_home(settings: Settings, store: Store) -> bytes:
    """What every start does once before serving: the home's directories, the schema
    migrated, the administrator and client config, the secret (returned)."""
    from ffdl.server.store.schema import upgrade as upgrade_schema

    settings.home.mkdir(parents=True, exist_ok=True)
    settings.jobs_dir.mkdir(parents=True, exist_ok=True)
    applied = upgrade_schema(store)
    if applied:
        log.info("database %s: schema migrated to %s", store.address, " -> ".join(applied))
    bootstrap(store, settings)
    secret = load_or_create_secret(settings.home)
    secure_home(settings)
    return secret


def build_platform(settings: Settings, backend: Backend | None = None) -> Platform:
    store = Store(settings.db_url)
    secret = prepare_home(settings, store)
    return Platform(
        settings=settings,
        store=store,
        backend=backend or open_backend(settings.backend_config()),
        job_tokens=JobTokens(secret),
        credentials=CredentialVault(secret),
        keeper=LeaseKeeper(
            store,
            replica_id=new_replica_id(),
            url=settings.learner_api_url,
            version=ffdl_version(),
            ttl_s=settings.lease_ttl_s,
            hang_s=settings.loop_hang_s,
            # Spread only where wake-ups reach every replica (``_start_relay``).
            spread=settings.spread_loops and store.dialect == "postgresql",
            runs_loops=settings.run_loops,
        ),
    )


async def keep_leases(keeper: LeaseKeeper, platform: Platform) -> None:
    """Renew this replica's leases and take free ones, every third of their length."""
    while True:
        await asyncio.sleep(platform.settings.lease_ttl_s / 3)
        try:
            taken = await asyncio.to_thread(keeper.tick)
        except asyncio.CancelledError:
            raise
        except Unavailable:
            continue  # the store logged the outage; the leases lapse until it is back
        except Exception:
            log.exception("renewing the loop leases failed")
            continue
        # Only here: the other replicas do not lead these loops.
        platform.wakeups.notify_here(*taken)


def _start_relay(platform: Platform) -> WakeupRelay | None:
    """Relay wake-ups between the replicas of a shared PostgreSQL database; SQLite has
    one replica (its pool workers share a file, not a channel)."""
    if platform.store.dialect != "postgresql" or platform.keeper is None:
        return None
    relay = WakeupRelay(
        platform.store,
        platform.keeper.replica_id,
        lambda names: platform.wakeups.notify_here(*names),
    )
    relay.start()
    platform.wakeups.relay_to(relay.publish)
    return relay


def create_app(settings: Settings, backend: Backend | None = None) -> FastAPI:
    platform = build_platform(settings, backend)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        platform.wakeups.bind(asyncio.get_running_loop())
        keeper = platform.keeper
        relay = _start_relay(platform)
        if keeper is not None:
            # Take the leases that are free before the loops start, so that a lone
            # replica runs its loops from its first turn.
            try:
                await asyncio.to_thread(keeper.tick)
            except Unavailable:
                pass  # logged by the store; the next turn tries again
            except Exception:
                log.exception("taking the loop leases failed; retrying on the next turn")
        loops: list[tuple[str, Callable[[], object], float, float]] = [
            ("scheduler", SchedulerLoop(platform), settings.scheduler_interval_s, 0.2),
            ("lcm", lambda: lcm_pass(platform), settings.lcm_interval_s, 0.0),
            ("monitor", lambda: monitor_pass(platform), settings.monitor_interval_s, 0.2),
            ("autoscaler", AutoscalerLoop(platform), settings.autoscaler_interval_s, 0.5),
            ("archiver", lambda: archive_pass(platform), settings.archive_interval_s, 0.0),
        ]
        tasks = [
            asyncio.create_task(
                run_forever(name, step, interval, platform.wakeups, min_gap, keeper), name=name
            )
            for name, step, interval, min_gap in (loops if settings.run_loops else [])
        ]
        if settings.run_loops:
            tasks.append(asyncio.create_task(WebhookLoop(platform).run(keeper), name="webhooks"))
        if keeper is not None:
            tasks.append(asyncio.create_task(keep_leases(keeper, platform), name="leases"))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if relay is not None:
                platform.wakeups.relay_to(None)
                await asyncio.to_thread(relay.stop)
            if keeper is not None:
                try:
                    # Handed back at once: another replica takes the loops over without
                    # waiting for the leases to expire (a rolling restart).
                    await asyncio.to_thread(keeper.release)
                except Exception:
                    log.exception("giving back the loop leases failed")
            platform.close()

    app = FfdlApp(
        title="ffdl",
        version=ffdl_version(),
        description="Fabric for Deep Learning: submit, schedule, run and follow training jobs.",
        lifespan=lifespan,
    )
    app.state.platform = platform
    for module in (
        health,
        models,
        # ``/events/stream`` before ``/events/{event_type}``: the fixed path must win.
        stream,
        events,
        training_logs,
        logs,
        cluster,
        pool,
        admin,
        tokens,
        audit,
        internal,
        metrics,
        dashboard,
    ):
        app.include_router(module.router)
    app.include_router(admin.users_router)
    app.add_middleware(RequestTiming)
    _install_error_handlers(app, platform)
    return app


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(app: FastAPI, path: str) -> list[str]:
    """Every method some route of ``app`` answers at ``path``: what a 405's ``Allow`` lists.

    (The route that raises the 405 knows only its own methods, not those of the other
    routes at the same path, e.g. ``GET`` and ``POST /v1/models``.)
    """
    allowed = []
    for method in _METHODS:
        scope = {"type": "http", "method": method, "path": path, "root_path": "", "headers": []}
        if any(route.matches(scope)[0] == Match.FULL for route in app.router.routes):
            allowed.append(method)
    return allowed


def _install_error_handlers(app: FastAPI, platform: Platform) -> None:
    @app.exception_handler(FfdlError)
    async def ffdl_error(_request: Request, exc: FfdlError) -> JSONResponse:
        return JSONResponse(status_code=exc.http_status, content=exc.to_json(), headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body", "query"))
            problems.append({"field": where, "reason": err.get("msg", "invalid")})
        first = problems[0] if problems else {"field": "", "reason": "invalid request"}
        message = f"invalid request: {first['field']}: {first['reason']}"
        return JSONResponse(status_code=400, content=error_body(400, message, "C100", problems))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Keep the exception's headers; a 405 says every method the path is ``Allow``-ed.
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            allowed = allowed_methods(app, request.url.path)
            if allowed:
                headers["Allow"] = ", ".join(allowed)
        return JSONResponse(
            status_code=exc.status_code,
            content=error_body(exc.status_code, str(exc.detail), f"H{exc.status_code}"),
            headers=headers,
        )

    async def fault_or_unexpected(request: Request, exc: Exception) -> JSONResponse:
        # A database fault met outside the store's sessions, or a file write that found the
        # disk full, is still the answer for that fault (503 or 507), not a 500. (Handled
        # here by type: Starlette re-raises what the catch-all handler answers, and the
        # server then drops the connection.)
        fault = fault_of(exc, platform.store.dialect)
        if fault == "away":
            platform.store.availability.went_away(first_line(exc))
            return await ffdl_error(request, DatabaseAway(platform.store.address, first_line(exc)))
        if fault == "full":
            where = str(getattr(exc, "filename", None) or platform.settings.home)
            return await ffdl_error(request, DatabaseFull(where, first_line(exc)))
        return await unexpected(request, exc)

    app.add_exception_handler(OSError, fault_or_unexpected)
    app.add_exception_handler(SQLAlchemyError, fault_or_unexpected)

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return JSONResponse(
            status_code=500,
            content=error_body(500, "internal server error", "E500"),
        )
