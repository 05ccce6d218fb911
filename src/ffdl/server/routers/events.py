"""``/v1/models/{model_id}/events/...``: FfDL's event webhooks, per model and event type."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from ffdl.server.routers.deps import PlatformDep, PrincipalDep
from ffdl.server.routers.responses import AUTHENTICATED, errors
from ffdl.server.services import webhooks

router = APIRouter(prefix="/v1/models", tags=["events"], responses=AUTHENTICATED)


class EventEndpointRegistration(BaseModel):
    """FfDL's registration body: the URL to notify (and, optionally, the event type)."""

    model_config = ConfigDict(extra="ignore")
    url: str | None = Field(default=None, description="http(s) URL the events are POSTed to")
    type: str | None = Field(default=None, description="the event type; the path's if given")


class EndpointDelivery(BaseModel):
    last_event_id: int = Field(description="the last event delivered or given up on")
    delivered: int
    given_up: int = Field(description="events dropped after the last retry failed")
    failed_attempts: int = Field(description="failed tries of the next event so far")
    next_attempt_at: str | None
    last_delivery_at: str | None
    last_error: str | None


class Endpoint(BaseModel):
    """FfDL's ``Endpoint`` (``id``, ``url``) and what ffdl adds."""

    id: str
    url: str
    type: str
    model_id: str
    created_at: str | None
    updated_at: str | None
    delivery: EndpointDelivery
    secret: str | None = Field(
        default=None,
        description="HMAC-SHA256 signing key; given only when the endpoint is created",
    )
    created: bool | None = Field(default=None, description="whether this request created it")


class EndpointList(BaseModel):
    endpoints: list[Endpoint]


class EndpointDeleted(BaseModel):
    id: str
    type: str
    model_id: str
    deleted: bool


@router.get(
    "/{model_id}/events/{event_type}",
    response_model=EndpointList,
    response_model_exclude_unset=True,
    responses=errors(404),
)
def get_event_type_endpoints(
    platform: PlatformDep, principal: PrincipalDep, model_id: str, event_type: str
) -> dict[str, Any]:
    """Every endpoint notified of ``event_type`` events of the model."""
    return webhooks.list_endpoints(platform, principal, model_id, event_type)


@router.get(
    "/{model_id}/events/{event_type}/{endpoint_id}",
    response_model=Endpoint,
    response_model_exclude_unset=True,
    responses=errors(404),
)
def get_event_endpoint(
    platform: PlatformDep,
    principal: PrincipalDep,
    model_id: str,
    event_type: str,
    endpoint_id: str,
) -> dict[str, Any]:
    """One endpoint, and where its deliveries stand."""
    return webhooks.get_endpoint(platform, principal, model_id, event_type, endpoint_id)


@router.post(
    "/{model_id}/events/{event_type}/{endpoint_id}",
    response_model=Endpoint,
    response_model_exclude_unset=True,
    responses=errors(400, 404, 409),
)
def create_event_endpoint(
    platform: PlatformDep,
    principal: PrincipalDep,
    model_id: str,
    event_type: str,
    endpoint_id: str,
    callback_url: EventEndpointRegistration,
) -> dict[str, Any]:
    """Register ``url`` to be POSTed each event, or change an endpoint's URL.

    A new endpoint first receives the model's events so far, then each new one; its
    ``secret`` (shown once) signs every delivery.
    """
    body = callback_url.model_dump()
    return webhooks.register_endpoint(platform, principal, model_id, event_type, endpoint_id, body)


@router.delete(
    "/{model_id}/events/{event_type}/{endpoint_id}",
    response_model=EndpointDeleted,
    responses=errors(404),
)
def delete_event_endpoint(
    platform: PlatformDep,
    principal: PrincipalDep,
    model_id: str,
    event_type: str,
    endpoint_id: str,
) -> dict[str, Any]:
    """Stop notifying the endpoint."""
    return webhooks.delete_endpoint(platform, principal, model_id, event_type, endpoint_id)
