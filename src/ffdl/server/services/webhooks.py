"""Event webhooks: registering callback URLs for a job's events, and what a delivery carries.

An endpoint belongs to one job and one event type (``update``: the job's status changes;
``all``: the learners' status changes as well) and is named by its caller. Registration
checks the callback URL and its host against the operator's allow-list (the server makes
these requests itself, so an unchecked URL would let a user reach inside its network), and
returns a signing secret once. The delivery loop (``loops/webhooks.py``) POSTs each event
as JSON signed with HMAC-SHA256 over ``"<timestamp>.<body>"``; :func:`verify_signature` is
what a receiver does.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import re
import secrets
import socket
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ffdl.core.errors import BadRequest, ConflictError, NotFound
from ffdl.core.redact import redact_url
from ffdl.server.auth import Principal
from ffdl.server.platform import Platform
from ffdl.server.services import audit
from ffdl.server.services.queries import iso, load_job
from ffdl.server.store.models import Event, Job, WebhookEndpoint
from ffdl.server.store.transitions import utcnow

# What each event type delivers; FfDL's spec names ``update`` and ``all`` among its types.
EVENT_TYPES: dict[str, str] = {
    "update": "the job's status changes",
    "all": "the job's and its learners' status changes",
}
MAX_URL_LENGTH = 2048
_ENDPOINT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
PUBLIC = "public"
SIGNATURE_HEADER = "X-FfDL-Signature"
TIMESTAMP_HEADER = "X-FfDL-Timestamp"
EVENT_ID_HEADER = "X-FfDL-Event-Id"
ATTEMPT_HEADER = "X-FfDL-Delivery-Attempt"

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


# -- callback hosts --------------------------------------------------------------------------


def _plain(address: Address) -> Address:
    """An IPv4-mapped IPv6 address as the IPv4 address it is (``::ffff:127.0.0.1``)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


class HostPolicy:
    """The operator's allow-list of callback hosts (setting ``webhook_allowed_hosts``)."""

    def __init__(self, entries: Iterable[str]) -> None:
        self.public = False
        self.names: set[str] = set()
        self.suffixes: list[str] = []
        self.networks: list[Network] = []
        for raw in entries:
            entry = raw.strip().lower()
            if entry == PUBLIC:
                self.public = True
            elif entry.startswith("*."):
                self.suffixes.append(entry[1:])
            else:
                try:
                    self.networks.append(ipaddress.ip_network(entry, strict=False))
                except ValueError:
                    if not re.fullmatch(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?", entry):
                        raise ValueError(
                            f"webhook_allowed_hosts: {raw!r} is neither 'public', a host "
                            "name, '*.domain', an IP address nor a network"
                        ) from None
                    self.names.add(entry.rstrip("."))

    @property
    def enabled(self) -> bool:
        return self.public or bool(self.names or self.suffixes or self.networks)

    def admits_name(self, host: str) -> bool:
        """Whether ``host`` is listed by name: then it is admitted whatever it resolves to."""
        name = host.lower().rstrip(".")
        return name in self.names or any(name.endswith(s) for s in self.suffixes)

    def admits_address(self, address: Address) -> bool:
        plain = _plain(address)
        if any(plain in network for network in self.networks):
            return True
        return self.public and plain.is_global

    def refusal(self, host: str, addresses: Iterable[Address]) -> str | None:
        """Why a request to ``host`` (resolving to ``addresses``) is refused, or None."""
        if self.admits_name(host):
            return None
        found = list(addresses)
        if not found:
            return f"callback host {host!r} does not resolve"
        for address in found:
            if not self.admits_address(address):
                return (
                    f"callback host {host!r} resolves to {_plain(address)}, which the "
                    "platform's webhook_allowed_hosts does not admit"
                )
        return None


def literal_address(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def resolve(host: str, port: int) -> list[Address]:
    """The addresses ``host`` resolves to (none when it does not resolve)."""
    literal = literal_address(host)
    if literal is not None:
        return [literal]
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return [ipaddress.ip_address(info[4][0]) for info in infos]


def _url_error(url: Any, reason: str) -> BadRequest:
    return BadRequest(f"url: {reason}", detail={"field": "url", "value": str(url)[:200]})


def check_callback_url(url: Any, policy: HostPolicy) -> tuple[str, int]:
    """The host and port of a valid callback ``url``; a 400 naming ``url`` otherwise.

    Only the form and a host admitted by name or by its literal address are checked here;
    a host name's addresses are checked by :func:`check_callback_host`.
    """
    if not isinstance(url, str) or not url:
        raise _url_error(url, "a callback URL (http or https) is required")
    if len(url) > MAX_URL_LENGTH:
        raise _url_error(url, f"is {len(url)} characters long, over {MAX_URL_LENGTH}")
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
        raise _url_error(url, "must not contain spaces or control characters")
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https"):
        raise _url_error(url, f"scheme must be http or https, got {parts.scheme or 'none'!r}")
    if parts.username is not None or parts.password is not None:
        raise _url_error(redact_url(url), "must not carry credentials (user:password@)")
    host = parts.hostname or ""
    if not host:
        raise _url_error(url, "has no host")
    try:
        port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    except ValueError:
        raise _url_error(url, "has an invalid port") from None
    if not policy.enabled:
        raise _url_error(url, "webhooks are turned off on this platform")
    literal = literal_address(host)
    if literal is not None and not policy.admits_name(host):
        reason = policy.refusal(host, [literal])
        if reason is not None:
            raise _url_error(url, reason)
    return host, port


def check_callback_host(url: str, host: str, port: int, policy: HostPolicy) -> None:
    """Refuse a host name that resolves to addresses the policy does not admit.

    A name that does not resolve yet is accepted: every delivery checks again.
    """
    if policy.admits_name(host) or literal_address(host) is not None:
        return
    addresses = resolve(host, port)
    if addresses:
        reason = policy.refusal(host, addresses)
        if reason is not None:
            raise _url_error(url, reason)


# -- signatures ------------------------------------------------------------------------------


def new_secret() -> str:
    return "whsec_" + secrets.token_urlsafe(32)


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """``v1=`` and the hex HMAC-SHA256 of ``"<timestamp>.<body>"`` under ``secret``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return "v1=" + mac.hexdigest()


def verify_signature(
    secret: str, timestamp: str, header: str, body: bytes, now: float, tolerance_s: float = 300
) -> bool:
    """What a receiver checks: a fresh timestamp and a matching signature."""
    try:
        sent = int(timestamp)
    except ValueError:
        return False
    if abs(now - sent) > tolerance_s:
        return False
    return hmac.compare_digest(signature(secret, sent, body), header)


def event_payload(event: Event, event_type: str, endpoint_id: str) -> dict[str, Any]:
    """The JSON a delivery carries for one status event."""
    return {
        "event_id": event.id,
        "event_type": event_type,
        "endpoint_id": endpoint_id,
        "model_id": event.job_id,
        "learner": event.learner,
        "from_status": event.from_status,
        "to_status": event.to_status,
        "status": event.to_status,
        "reason": redact_url(event.reason or ""),
        "time": iso(event.created_at),
        "timestamp": int(event.created_at.timestamp() * 1000) if event.created_at else None,
    }


def encode(payload: Mapping[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()


# -- endpoints -------------------------------------------------------------------------------


def check_event_type(event_type: str) -> None:
    if event_type not in EVENT_TYPES:
        known = ", ".join(sorted(EVENT_TYPES))
        raise NotFound(
            f"no event type {event_type[:64]!r}; event types: {known}",
            detail={"field": "event_type", "value": event_type[:64]},
        )


def check_endpoint_id(endpoint_id: str) -> None:
    if not _ENDPOINT_ID.fullmatch(endpoint_id):
        raise BadRequest(
            f"endpoint_id {endpoint_id[:80]!r} must be 1 to 64 letters, digits, '.', '_' or "
            "'-', starting with a letter or digit",
            detail={"field": "endpoint_id", "value": endpoint_id[:80]},
        )


def endpoint_view(row: WebhookEndpoint, secret: str | None = None) -> dict[str, Any]:
    """FfDL's ``Endpoint`` (``id``, ``url``) with what ffdl adds: type, times, delivery."""
    view: dict[str, Any] = {
        "id": row.endpoint_id,
        "url": row.url,
        "type": row.event_type,
        "model_id": row.job_id,
        "created_at": iso(row.created_at),
        "updated_at": iso(row.updated_at),
        "delivery": {
            "last_event_id": row.cursor,
            "delivered": row.delivered,
            "given_up": row.given_up,
            "failed_attempts": row.attempts,
            "next_attempt_at": iso(row.next_attempt_at),
            "last_delivery_at": iso(row.last_delivery_at),
            "last_error": row.last_error,
        },
    }
    if secret is not None:
        view["secret"] = secret
    return view


def _find(session: Session, job_id: str, event_type: str, endpoint_id: str) -> WebhookEndpoint:
    row = session.scalars(
        select(WebhookEndpoint).where(
            WebhookEndpoint.job_id == job_id,
            WebhookEndpoint.event_type == event_type,
            WebhookEndpoint.endpoint_id == endpoint_id,
        )
    ).first()
    if row is None:
        raise NotFound(
            f"no endpoint {endpoint_id!r} for {event_type!r} events of model {job_id!r}",
            detail={"field": "endpoint_id", "value": endpoint_id},
        )
    return row


def _audit_foreign(session: Session, principal: Principal, job: Job, action: str) -> None:
    if job.tenant_id != principal.tenant_id:
        audit.record(session, principal, action, job.id, tenant_id=job.tenant_id)


def register_endpoint(
    platform: Platform,
    principal: Principal,
    model_id: str,
    event_type: str,
    endpoint_id: str,
    body: Mapping[str, Any],
) -> dict[str, Any]:
    """Create the endpoint (its view carries the new ``secret``) or change its URL."""
    check_event_type(event_type)
    check_endpoint_id(endpoint_id)
    named_type = body.get("type")
    if named_type not in (None, "", event_type):
        raise BadRequest(
            f"type {str(named_type)[:64]!r} differs from the event type in the path "
            f"({event_type!r})",
            detail={"field": "type", "value": str(named_type)[:64]},
        )
    url = body.get("url")
    policy = HostPolicy(platform.settings.webhook_allowed_hosts)
    host, port = check_callback_url(url, policy)
    assert isinstance(url, str)
    with platform.store.read() as session:
        load_job(session, principal, model_id)  # a 404 before any name lookup
    check_callback_host(url, host, port, policy)
    now = utcnow()
    with platform.store.write() as session:
        job = load_job(session, principal, model_id)
        try:
            row = _find(session, model_id, event_type, endpoint_id)
        except NotFound:
            row = None
        if row is not None:
            row.url = url
            row.updated_at = now
            # A corrected URL is tried at once, not after the back-off of the old one.
            row.attempts = 0
            row.next_attempt_at = None
            _audit_foreign(session, principal, job, "webhook.update")
            view = endpoint_view(row)
            view["created"] = False
            return view
        count = session.scalar(
            select(func.count())
            .select_from(WebhookEndpoint)
            .where(WebhookEndpoint.job_id == model_id)
        )
        limit = platform.settings.webhook_max_endpoints_per_job
        if (count or 0) >= limit:
            raise ConflictError(
                f"model {model_id!r} already has {limit} event endpoints, the most allowed",
                detail={"limit": limit},
            )
        secret = new_secret()
        row = WebhookEndpoint(
            job_id=model_id,
            event_type=event_type,
            endpoint_id=endpoint_id,
            url=url,
            secret_sealed=platform.credentials.seal(secret),
            cursor=0,
            attempts=0,
            delivered=0,
            given_up=0,
            created_at=now,
            updated_at=now,
        )
        session.add(row)
        session.flush()
        _audit_foreign(session, principal, job, "webhook.create")
        view = endpoint_view(row, secret=secret)
        view["created"] = True
    platform.wakeups.notify("webhooks")
    return view


def list_endpoints(
    platform: Platform, principal: Principal, model_id: str, event_type: str
) -> dict[str, Any]:
    """FfDL's ``EndpointList``: the endpoints for ``event_type`` events of the model."""
    with platform.store.read() as session:
        load_job(session, principal, model_id)
        check_event_type(event_type)
        rows = session.scalars(
            select(WebhookEndpoint)
            .where(WebhookEndpoint.job_id == model_id, WebhookEndpoint.event_type == event_type)
            .order_by(WebhookEndpoint.endpoint_id)
        ).all()
        return {"endpoints": [endpoint_view(row) for row in rows]}


def get_endpoint(
    platform: Platform, principal: Principal, model_id: str, event_type: str, endpoint_id: str
) -> dict[str, Any]:
    with platform.store.read() as session:
        load_job(session, principal, model_id)
        check_event_type(event_type)
        return endpoint_view(_find(session, model_id, event_type, endpoint_id))


def delete_endpoint(
    platform: Platform, principal: Principal, model_id: str, event_type: str, endpoint_id: str
) -> dict[str, Any]:
    """Remove the endpoint: no delivery to it starts after this returns."""
    with platform.store.write() as session:
        job = load_job(session, principal, model_id)
        check_event_type(event_type)
        row = _find(session, model_id, event_type, endpoint_id)
        session.delete(row)
        _audit_foreign(session, principal, job, "webhook.delete")
    return {"id": endpoint_id, "type": event_type, "model_id": model_id, "deleted": True}
