"""Running the embedded platform in the foreground (``ffdl up``)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from urllib.parse import urlsplit

import uvicorn
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from ffdl.backends.local import NO_SANDBOX_WARNING
from ffdl.backends.simulated import SIMULATED_WARNING
from ffdl.learner.cgroup_placement import discover
from ffdl.server.announce import announce
from ffdl.server.app import STARTUP_ERRORS, create_app
from ffdl.server.heap import freeze_start_up_objects
from ffdl.server.pool.config import pool_policy
from ffdl.server.pool.policy import Policy
from ffdl.server.services.runtimes import unsandboxed_paths
from ffdl.server.settings import Settings
from ffdl.server.store.db import StoreUnavailable
from ffdl.server.transport import (
    check_transport,
    is_loopback_host,
    plain_http_warning,
    reload_on_hangup,
    uvicorn_tls,
)

log = logging.getLogger("ffdl.server")


def serve(
    home: Path | None = None,
    host: str | None = None,
    port: int | None = None,
    sandbox: bool | None = None,
    backend: str | None = None,
    ray_address: str | None = None,
    advertise_url: str | None = None,
    workers: str | None = None,
    cgroup_parent: str | None = None,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    ca_bundle: Path | None = None,
    api_only: bool = False,
) -> None:
    """Serve the platform until stopped: one process, or with ``workers`` ("MIN..MAX", or
    from the settings) an elastic pool of worker processes (``ffdl.server.pool``)."""
    try:
        settings = Settings.load(
            home,
            host=host,
            port=port,
            sandbox=sandbox,
            backend=backend,
            ray_address=ray_address,
            advertise_url=advertise_url,
            workers=workers,
            cgroup_parent=cgroup_parent,
            tls_cert=tls_cert,
            tls_key=tls_key,
            ca_bundle=ca_bundle,
            run_loops=False if api_only else None,
        )
        # Built here once to report a bad configuration before anything starts.
        settings.backend_config()
        check_transport(settings)
        _check_cgroup_parent(settings)
        policy = pool_policy(settings)
    except ValidationError as exc:
        problems = "; ".join(_problem(error) for error in exc.errors())
        raise SystemExit(f"ffdl: invalid settings: {problems}") from None
    except ValueError as exc:
        raise SystemExit(f"ffdl: {exc}") from None
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # ffdl says in one line what a migration applied; Alembic's own steps are noise here.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    if not settings.sandbox:
        log.warning(NO_SANDBOX_WARNING)
        if (unprovided := unsandboxed_paths(settings.runtimes)) is not None:
            log.warning(unprovided)
    if (exposed := plain_http_warning(settings)) is not None:
        log.warning("PLAIN HTTP: %s", exposed)
    _log_backend(settings)
    if policy is not None:
        _serve_pool(settings, policy)
        return
    try:
        app = create_app(settings)
    except STARTUP_ERRORS as exc:
        raise SystemExit(f"ffdl: {exc}") from None
    announce(settings)
    freeze_start_up_objects()
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level="warning", **uvicorn_tls(settings)
    )
    reload_on_hangup(settings, lambda: config.ssl)
    uvicorn.Server(config).run()


def _problem(error: ErrorDetails) -> str:
    """One refused setting as ``name: reason`` (a rule across settings names them itself)."""
    reason = str(error["msg"]).removeprefix("Value error, ")
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {reason}" if where else reason


def _check_cgroup_parent(settings: Settings) -> None:
    """A ``cgroup_parent`` this host cannot use stops the start, before anything is made
    (CgroupParentError, a ValueError, names the path and what it lacks)."""
    local = settings.backend == "local" and settings.sandbox and settings.learner_cgroups
    if settings.cgroup_parent and local and os.geteuid() == 0:
        discover(settings.cgroup_parent, create=False)


def _serve_pool(settings: Settings, policy: Policy) -> None:
    # Imported here: only a pool needs gunicorn.
    from ffdl.server.pool.master import run_pool

    try:
        run_pool(settings, policy)
    except (StoreUnavailable, ValueError) as exc:
        raise SystemExit(f"ffdl: {exc}") from None


def _log_backend(settings: Settings) -> None:
    if settings.backend == "ray":
        log.info(
            "backend: ray, cluster at %s (namespace %s); learners report to %s",
            settings.ray_address,
            settings.ray_namespace,
            settings.learner_api_url,
        )
        if _is_loopback(settings.learner_api_url):
            log.warning(
                "learners report to %s, a loopback address that learners on other machines "
                "cannot reach; start with --advertise-url http(s)://HOST:PORT",
                settings.learner_api_url,
            )
    elif settings.backend == "simulated" and settings.simulated is not None:
        log.warning(
            "backend: simulated: %s; simulated learners run in the harness at %s",
            SIMULATED_WARNING,
            ", ".join(settings.simulated.harness_url),
        )
    else:
        log.info("backend: local (learners run on this host)")


def _is_loopback(url: str) -> bool:
    return is_loopback_host(urlsplit(url).hostname or "")


def _main() -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m ffdl.server.main")
    parser.add_argument("--home", type=Path, default=None)
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--no-sandbox", action="store_true")
    parser.add_argument("--backend", choices=["local", "ray"], default=None)
    parser.add_argument("--ray-address", default=None, metavar="ADDRESS")
    parser.add_argument("--advertise-url", default=None, metavar="URL")
    parser.add_argument("--workers", default=None, metavar="MIN..MAX")
    parser.add_argument("--tls-cert", type=Path, default=None, metavar="FILE")
    parser.add_argument("--tls-key", type=Path, default=None, metavar="FILE")
    parser.add_argument("--ca-bundle", type=Path, default=None, metavar="FILE")
    parser.add_argument("--api-only", action="store_true")
    args = parser.parse_args()
    serve(
        args.home,
        args.host,
        args.port,
        sandbox=False if args.no_sandbox else None,
        backend=args.backend,
        ray_address=args.ray_address,
        advertise_url=args.advertise_url,
        workers=args.workers,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        ca_bundle=args.ca_bundle,
        api_only=args.api_only,
    )


if __name__ == "__main__":
    _main()
