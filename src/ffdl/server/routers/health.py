"""``/health``: liveness for operators and for clients waiting on a starting server."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from fastapi import APIRouter

router = APIRouter(tags=["health"])


def ffdl_version() -> str:
    try:
        return version("ffdl")
    except PackageNotFoundError:
        return "0+unknown"


@router.get("/health")
def health() -> dict[str, str]:
    return {"status": "ok", "version": ffdl_version()}
