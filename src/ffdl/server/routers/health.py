"""``/health``: liveness for operators and for clients waiting on a starting server."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from fastapi import APIRouter

from ffdl.server.routers.deps import PlatformDep

router = APIRouter(tags=["health"])


def ffdl_version() -> str:
    try:
        return version("ffdl")
    except PackageNotFoundError:
        return "0+unknown"


@router.get("/health")
def health(platform: PlatformDep) -> dict[str, object]:
    """Liveness, the version, and whether learners run sandboxed (``--no-sandbox`` shows
    ``false`` and a warning, so that no one mistakes an unconfined platform for a safe one)."""
    body: dict[str, object] = {
        "status": "ok",
        "version": ffdl_version(),
        "sandbox": platform.settings.sandbox,
    }
    if not platform.settings.sandbox:
        body["warning"] = "learners are not sandboxed (--no-sandbox)"
    return body
