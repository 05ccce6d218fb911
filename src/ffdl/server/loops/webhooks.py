"""The webhook delivery loop: POSTs each job's status events to its registered endpoints.

Each endpoint has a cursor in the store (the last event delivered or given up on), so
deliveries go out in event order, at least once, and resume where they stopped after a
restart. A pass reads what is due in one short session, makes the requests with an async
HTTP client outside any session (the store is reached through worker threads, never from
the event loop itself), then records the outcomes in one write. A failed or timed-out
delivery is retried with doubling back-off; after ``webhook_max_attempts`` tries the event
is given up on (logged, counted on the endpoint) and the next one is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from sqlalchemy import Exists, func, or_, select

from ffdl.core.errors import LeaseLost, Unavailable
from ffdl.server.leases import Fence, LeaseKeeper, reset_fence, set_fence
from ffdl.server.platform import Platform
from ffdl.server.routers.health import ffdl_version
from ffdl.server.services.webhooks import (
    ATTEMPT_HEADER,
    EVENT_ID_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Address,
    HostPolicy,
    encode,
    event_payload,
    literal_address,
    signature,
)
from ffdl.server.store.models import Event, WebhookEndpoint
from ffdl.server.store.transitions import utcnow

log = logging.getLogger("ffdl.webhooks")

# Events sent to one endpoint in one pass: a backlog drains in a few passes, and an
# endpoint deleted meanwhile is noticed before each of them.
BATCH = 20
# Endpoints served at once.
CONCURRENCY = 16


@dataclass(frozen=True)
class Pending:
    """One endpoint's due events, read out of the store: all a delivery needs."""

    pk: int
    url: str
    secret: str
    attempts: int  # failed tries of the first event so far
    events: list[tuple[int, bytes]]  # (event id, JSON body), in order


@dataclass
class Outcome:
    """What a delivery achieved; filled in as it goes, so a cancelled pass keeps it."""

    pk: int
    delivered_through: int | None = None
    delivered: int = 0
    failed_event: int | None = None
    error: str | None = None


@dataclass
class Due:
    pending: list[Pending] = field(default_factory=list)
    next_retry_at: datetime | None = None


def _newer_events(endpoint: type[WebhookEndpoint]) -> Exists:
    """Whether some event past the endpoint's cursor is one its type delivers."""
    return (
        select(Event.id)
        .where(
            Event.job_id == endpoint.job_id,
            Event.id > endpoint.cursor,
            or_(endpoint.event_type != "update", Event.learner.is_(None)),
        )
        .exists()
    )


def load_due(platform: Platform, now: datetime) -> Due:
    """Endpoints with undelivered events whose back-off is over, and the next retry time."""
    due = Due()
    newer = _newer_events(WebhookEndpoint)
    with platform.store.read() as session:
        rows = session.scalars(
            select(WebhookEndpoint)
            .where(
                newer,
                or_(
                    WebhookEndpoint.next_attempt_at.is_(None),
                    WebhookEndpoint.next_attempt_at <= now,
                ),
            )
            .order_by(WebhookEndpoint.id)
        ).all()
        for row in rows:
            query = select(Event).where(Event.job_id == row.job_id, Event.id > row.cursor)
            if row.event_type == "update":
                query = query.where(Event.learner.is_(None))
            events = session.scalars(query.order_by(Event.id).limit(BATCH)).all()
            bodies = [
                (event.id, encode(event_payload(event, row.event_type, row.endpoint_id)))
                for event in events
            ]
            if not bodies:
                continue
            try:
                secret = platform.credentials.open(row.secret_sealed)
            except Exception:  # one unreadable secret must not hold up the others
                log.exception(
                    "webhook %s of model %s: cannot open its secret", row.endpoint_id, row.job_id
                )
                continue
            due.pending.append(Pending(row.id, row.url, secret, row.attempts, bodies))
        due.next_retry_at = session.scalar(
            select(func.min(WebhookEndpoint.next_attempt_at)).where(
                newer,
                WebhookEndpoint.next_attempt_at > now,
            )
        )
    return due


def still_registered(platform: Platform, pk: int) -> bool:
    with platform.store.read() as session:
        return session.get(WebhookEndpoint, pk) is not None


def backoff_s(platform: Platform, attempts: int) -> float:
    settings = platform.settings
    return float(
        min(settings.webhook_retry_max_s, settings.webhook_retry_base_s * 2 ** (attempts - 1))
    )


def record(platform: Platform, outcomes: list[Outcome]) -> None:
    """Advance cursors past what was delivered; schedule a retry or give up on a failure."""
    if not outcomes:
        return
    max_attempts = platform.settings.webhook_max_attempts
    with platform.store.write() as session:
        now = utcnow()
        for outcome in outcomes:
            row = session.get(WebhookEndpoint, outcome.pk)
            if row is None:  # deleted meanwhile
                continue
            through = outcome.delivered_through
            if through is not None and through > row.cursor:
                row.cursor = through
                row.attempts = 0
                row.delivered += outcome.delivered
                row.last_delivery_at = now
                row.last_error = None
            failed = outcome.failed_event
            if failed is None or failed <= row.cursor:
                row.next_attempt_at = None
                continue
            row.attempts += 1
            row.last_error = outcome.error
            if row.attempts >= max_attempts:
                log.warning(
                    "webhook %s of model %s (%s): gave up on event %d after %d attempts: %s",
                    row.endpoint_id,
                    row.job_id,
                    row.event_type,
                    failed,
                    row.attempts,
                    outcome.error,
                )
                row.cursor = failed
                row.given_up += 1
                row.attempts = 0
                row.next_attempt_at = None
            else:
                row.next_attempt_at = now + timedelta(seconds=backoff_s(platform, row.attempts))


async def _addresses(host: str, port: int) -> list[Address]:
    literal = literal_address(host)
    if literal is not None:
        return [literal]
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return [ipaddress.ip_address(info[4][0]) for info in infos]


@dataclass(frozen=True)
class Target:
    """A callback URL pinned to the address that was checked, so that a second DNS answer
    (a rebinding) cannot send the request elsewhere. ``Host`` and TLS's server name stay the
    URL's host, so virtual hosts and certificate checks work as they would without pinning."""

    url: str
    host_header: str
    extensions: dict[str, Any]


def _pinned(url: str, host: str, port: int, address: Address) -> Target | None:
    if literal_address(host) is not None:
        return None  # nothing to resolve, nothing to pin
    parts = urlsplit(url)
    shown = f"[{address}]" if address.version == 6 else str(address)
    host_header = parts.netloc.rsplit("@", 1)[-1]
    pinned = urlunsplit(parts._replace(netloc=f"{shown}:{port}"))
    extensions: dict[str, Any] = {"sni_hostname": host} if parts.scheme == "https" else {}
    return Target(pinned, host_header, extensions)


class WebhookLoop:
    """Runs delivery passes forever: on its timer, when woken, or when a retry falls due."""

    def __init__(self, platform: Platform) -> None:
        self.platform = platform
        # Fails the start on a malformed allow-list rather than at the first delivery.
        self.policy = HostPolicy(platform.settings.webhook_allowed_hosts)
        self.user_agent = f"ffdl-webhooks/{ffdl_version()}"

    async def run(self, keeper: LeaseKeeper | None = None) -> None:
        """Deliver until cancelled; with a ``keeper``, only while it holds the lease."""
        settings = self.platform.settings
        wake = self.platform.wakeups.event("webhooks")
        async with httpx.AsyncClient(
            timeout=settings.webhook_timeout_s,
            follow_redirects=False,  # a redirect could lead anywhere the allow-list forbids
            trust_env=False,
            # No pooled connections: with pinned addresses, a connection made (and its TLS
            # certificate checked) for one host name must not carry another's requests.
            limits=httpx.Limits(max_keepalive_connections=0),
        ) as client:
            while True:
                wake.clear()
                wait = settings.webhook_interval_s
                fence = keeper.fence("webhooks") if keeper is not None else None
                if keeper is None or fence is not None:
                    wait = min(wait, await self._fenced_pass(client, fence))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout=max(wait, 0.05))

    async def _fenced_pass(self, client: httpx.AsyncClient, fence: Fence | None) -> float:
        # The worker threads of the pass copy this task's context, fence included.
        token = set_fence(fence)
        try:
            return await self.pass_once(client)
        except asyncio.CancelledError:
            raise
        except LeaseLost as exc:
            log.warning("webhooks pass stopped: %s", exc)
        except Unavailable as exc:
            # Logged once by the store; what was sent and not recorded goes again later.
            log.debug("webhooks pass stopped: %s", exc)
        except Exception:
            log.exception("webhooks pass failed")
        finally:
            reset_fence(token)
        return float("inf")

    async def pass_once(self, client: httpx.AsyncClient) -> float:
        """Deliver what is due; the seconds until the next retry falls due."""
        now = utcnow()
        due = await asyncio.to_thread(load_due, self.platform, now)
        outcomes = [Outcome(pending.pk) for pending in due.pending]
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(pending: Pending, outcome: Outcome) -> None:
            async with gate:
                await self.deliver(client, pending, outcome)

        try:
            await asyncio.gather(*(one(p, o) for p, o in zip(due.pending, outcomes, strict=True)))
        except asyncio.CancelledError:
            # Shutting down: keep what was delivered, so a restart does not send it again
            # (one short write; the event loop has nothing else left to serve).
            record(self.platform, outcomes)
            raise
        await asyncio.to_thread(record, self.platform, outcomes)
        if due.next_retry_at is None:
            return float("inf")
        return max((due.next_retry_at - utcnow()).total_seconds(), 0.0)

    async def deliver(self, client: httpx.AsyncClient, pending: Pending, outcome: Outcome) -> None:
        """Send ``pending``'s events in order, stopping at the first that fails."""
        parts = urlsplit(pending.url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        addresses = await _addresses(host, port)
        refusal = self.policy.refusal(host, addresses)
        if refusal is not None:
            outcome.failed_event, outcome.error = pending.events[0][0], refusal
            return
        targets = [_pinned(pending.url, host, port, address) for address in addresses]
        for index, (event_id, body) in enumerate(pending.events):
            if not await asyncio.to_thread(still_registered, self.platform, pending.pk):
                return
            error = await self._post(client, pending, targets, event_id, body, index)
            if error is not None:
                outcome.failed_event, outcome.error = event_id, error
                return
            outcome.delivered_through = event_id
            outcome.delivered += 1

    async def _post(
        self,
        client: httpx.AsyncClient,
        pending: Pending,
        targets: list[Target | None],
        event_id: int,
        body: bytes,
        index: int,
    ) -> str | None:
        stamp = int(time.time())
        headers = {
            "Content-Type": "application/json",
            "User-Agent": self.user_agent,
            EVENT_ID_HEADER: str(event_id),
            ATTEMPT_HEADER: str(pending.attempts + 1 if index == 0 else 1),
            TIMESTAMP_HEADER: str(stamp),
            SIGNATURE_HEADER: signature(pending.secret, stamp, body),
        }
        error = "no address to send to"
        # Each address the host resolved to, in order, while connections are refused: what
        # a client resolving the name itself would do.
        for target in targets:
            url, extensions = pending.url, {}
            if target is not None:
                url, extensions = target.url, target.extensions
                headers["Host"] = target.host_header
            try:
                # Streamed and never read: a receiver's answer body is not ours to buffer.
                async with client.stream(
                    "POST", url, content=body, headers=headers, extensions=extensions
                ) as answer:
                    status = answer.status_code
            except httpx.ConnectError as exc:
                error = f"{type(exc).__name__}: {exc}"[:500]
                continue
            except httpx.HTTPError as exc:
                return f"{type(exc).__name__}: {exc}"[:500]
            return None if 200 <= status < 300 else f"HTTP {status}"
        return error
