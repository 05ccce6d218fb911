"""``/v1/nodes``, ``/v1/queue``, ``/v1/cluster/history`` and ``/v1/replicas``: the cluster,
the queue, their history and the control plane as users and operators see them."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from ffdl.server.routers.deps import PlatformDep, PrincipalDep
from ffdl.server.routers.responses import AUTHENTICATED, errors
from ffdl.server.services.cluster import cluster_view, drain, queue_view, replicas_view
from ffdl.server.services.history import history

router = APIRouter(prefix="/v1", tags=["cluster"], responses=AUTHENTICATED)


@router.get("/nodes")
def get_nodes(platform: PlatformDep, principal: PrincipalDep) -> dict[str, Any]:
    return cluster_view(platform, principal)


@router.get("/queue")
def get_queue(platform: PlatformDep, principal: PrincipalDep) -> dict[str, Any]:
    return queue_view(platform, principal)


@router.get("/cluster/history", responses=errors(400))
def get_cluster_history(
    platform: PlatformDep,
    principal: PrincipalDep,
    since: Annotated[
        float | None, Query(description="only samples after this time (epoch seconds)")
    ] = None,
) -> dict[str, Any]:
    """The cluster over time: GPUs total, allocated and busy, queue length, running jobs
    (whole-platform totals; no tenant's jobs are named)."""
    with platform.store.read() as session:
        return history(session, since)


@router.get("/replicas", responses=errors(403))
def get_replicas(platform: PlatformDep, principal: PrincipalDep) -> dict[str, Any]:
    """The control plane's replicas (alive or lately seen) and who leads each loop."""
    return replicas_view(platform, principal)


class DrainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(default="maintenance", max_length=200)


@router.post("/nodes/{name}/drain", responses=errors(400, 403, 404))
def drain_node(
    platform: PlatformDep, principal: PrincipalDep, name: str, body: DrainRequest | None = None
) -> dict[str, Any]:
    reason = body.reason if body is not None else "maintenance"
    return drain(platform, principal, name, True, reason)


@router.post("/nodes/{name}/undrain", responses=errors(403, 404))
def undrain_node(platform: PlatformDep, principal: PrincipalDep, name: str) -> dict[str, Any]:
    return drain(platform, principal, name, False)
