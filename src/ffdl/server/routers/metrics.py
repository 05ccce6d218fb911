"""``GET /metrics``: the Prometheus exposition (see ``ffdl.server.telemetry``)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from ffdl.server.routers.deps import PlatformDep, api_token, basic_auth
from ffdl.server.routers.responses import errors
from ffdl.server.telemetry.exposition import render, scrape_scope

router = APIRouter(tags=["metrics"])


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}},
            "description": "Prometheus text exposition format",
        },
        **errors(401),
    },
    # Document the credentials; ``scrape_scope`` checks them.
    dependencies=[Depends(api_token), Depends(basic_auth)],
)
def prometheus_metrics(request: Request, platform: PlatformDep) -> Response:
    """Every series the caller may see: a platform admin's token or the configured scrape
    token (``metrics_token``) sees all; another user's token only its tenant's."""
    tenant = scrape_scope(platform, request)
    return Response(render(platform, tenant), media_type=CONTENT_TYPE_LATEST)
