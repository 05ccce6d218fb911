"""``/health``: liveness for operators and for clients waiting on a starting server."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from fastapi import APIRouter

from ffdl.backends.simulated import SIMULATED_WARNING
from ffdl.server.routers.deps import PlatformDep
from ffdl.server.transport import plain_http_warning

router = APIRouter(tags=["health"])


def ffdl_version() -> str:
    try:
        return version("ffdl")
    except PackageNotFoundError:
        return "0+unknown"


@router.get("/health")
def health(platform: PlatformDep) -> dict[str, object]:
    """Liveness, the version, whether learners run sandboxed (``--no-sandbox`` shows
    ``false`` and a warning, so that no one mistakes an unconfined platform for a safe one),
    and what holds learners to their memory and CPUs on this replica's hosts. Under the
    load-testing backend, ``learners`` is ``simulated`` and a warning says so. ``tls`` says
    whether the API is served over HTTPS; on plain HTTP off loopback, ``transport_warning``
    says that credentials cross the network in clear text.

    While this replica cannot reach its database, ``status`` is ``degraded``, ``reason``
    says why and ``degraded_for_s`` for how long: the process is alive (do not restart it),
    and requests that need the database get 503 until it is back."""
    outage = platform.store.availability.outage()
    body: dict[str, object] = {
        "status": "ok" if outage is None else "degraded",
        "version": ffdl_version(),
        "sandbox": platform.settings.sandbox,
        "learner_limits": platform.backend.learner_limits(),
        "tls": platform.settings.tls,
    }
    if (exposed := plain_http_warning(platform.settings)) is not None:
        body["transport_warning"] = exposed
    if outage is not None:
        detail, lasted = outage
        body["reason"] = f"database unreachable at {platform.store.address}: {detail}"
        body["degraded_for_s"] = round(lasted, 1)
    if platform.settings.backend == "simulated":
        body["learners"] = "simulated"
        body["warning"] = SIMULATED_WARNING
    elif not platform.settings.sandbox:
        body["warning"] = "learners are not sandboxed (--no-sandbox)"
    return body
