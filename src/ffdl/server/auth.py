"""Tenants, users, bearer tokens and job tokens.

User tokens are random and stored only as SHA-256 hashes. Job tokens are an HMAC of the job
id under the platform's secret, so the lifecycle manager can hand the same token to a
re-deployed controller without storing it, and a token is valid for that one job only.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select

from ffdl.core.errors import AuthError
from ffdl.server.settings import Settings
from ffdl.server.store.db import Store
from ffdl.server.store.models import ApiToken, Tenant, User
from ffdl.server.store.transitions import utcnow

DEFAULT_TENANT = "default"
ADMIN_USER = "admin"


@dataclass(frozen=True, slots=True)
class Principal:
    user_id: str
    tenant_id: str
    role: str

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def load_or_create_secret(home: Path) -> bytes:
    path = home / "secret.key"
    if path.exists():
        return bytes.fromhex(path.read_text().strip())
    secret = secrets.token_bytes(32)
    _write_private(path, secret.hex())
    return secret


class JobTokens:
    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def issue(self, job_id: str) -> str:
        return hmac.new(self._secret, job_id.encode(), hashlib.sha256).hexdigest()

    def verify(self, job_id: str, token: str) -> bool:
        return hmac.compare_digest(self.issue(job_id), token)


def create_token(store: Store, user_id: str) -> str:
    token = "ffdl_" + secrets.token_urlsafe(32)
    with store.write() as session:
        session.add(ApiToken(token_hash=hash_token(token), user_id=user_id, created_at=utcnow()))
    return token


def bootstrap(store: Store, settings: Settings) -> None:
    """First start: default tenant and admin; always: a client config that works."""
    with store.write() as session:
        if session.get(Tenant, DEFAULT_TENANT) is None:
            now = utcnow()
            session.add(Tenant(id=DEFAULT_TENANT, name="Default tenant", created_at=now))
            session.flush()
            session.add(
                User(
                    id=ADMIN_USER,
                    tenant_id=DEFAULT_TENANT,
                    name="admin",
                    role="admin",
                    created_at=now,
                )
            )
    config_path = settings.client_config_path
    token: str | None = None
    if config_path.exists():
        try:
            existing = json.loads(config_path.read_text())
            candidate = str(existing.get("token", ""))
            with store.read() as session:
                if session.get(ApiToken, hash_token(candidate)) is not None:
                    token = candidate
        except (ValueError, OSError):
            token = None
    if token is None:
        token = create_token(store, ADMIN_USER)
    _write_private(config_path, json.dumps({"url": settings.api_url, "token": token}, indent=2))


def authenticate(store: Store, authorization: str | None) -> Principal:
    if not authorization or not authorization.lower().startswith("bearer "):
        raise AuthError("missing bearer token: send 'Authorization: Bearer <token>'")
    token = authorization.split(" ", 1)[1].strip()
    with store.read() as session:
        row = session.execute(
            select(User.id, User.tenant_id, User.role)
            .join(ApiToken, ApiToken.user_id == User.id)
            .where(ApiToken.token_hash == hash_token(token))
        ).first()
    if row is None:
        raise AuthError("invalid or revoked token")
    return Principal(user_id=row[0], tenant_id=row[1], role=row[2])
