"""``/v1/nodes`` and ``/v1/queue``: the cluster and the queue as users and operators see them."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from ffdl.server.routers.deps import PlatformDep, PrincipalDep
from ffdl.server.services.cluster import cluster_view, queue_view

router = APIRouter(prefix="/v1", tags=["cluster"])


@router.get("/nodes")
def get_nodes(platform: PlatformDep, principal: PrincipalDep) -> dict[str, Any]:
    return cluster_view(platform)


@router.get("/queue")
def get_queue(platform: PlatformDep, principal: PrincipalDep) -> dict[str, Any]:
    return queue_view(platform, principal)
