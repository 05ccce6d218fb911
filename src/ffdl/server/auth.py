"""Roles, bearer tokens, job tokens, and the first start's tenant, admin and client config.

User tokens are random and stored only as SHA-256 hashes, beside a short random id that
names them (for listing and revoking) and an expiry. Job tokens are an HMAC of the job id
under the platform's secret, so the lifecycle manager can hand the same token to a
re-deployed controller without storing it, and a token is valid for that one job only.

Roles: a platform admin acts on every tenant, a tenant admin (role ``admin``) on its own
tenant's users, a member on its tenant's jobs. The bootstrap user is the platform admin.

Users with a password may also sign in with HTTP Basic, as FfDL's clients do: the user name
is the user's id (``tenant.name``, ``admin`` for the bootstrap admin), or for a user of the
default tenant its bare name. ``ffdl.server.passwords`` hashes and verifies. FfDL's
``X-Watson-Userinfo`` header names the caller only when the operator declares a trusted proxy.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from ffdl.core.errors import AuthError
from ffdl.server.passwords import BASIC_CHALLENGE, SignIns, TooManyAttempts
from ffdl.server.settings import Settings
from ffdl.server.store.db import Store
from ffdl.server.store.models import ApiToken, Tenant, User
from ffdl.server.store.transitions import utcnow

DEFAULT_TENANT = "default"
ADMIN_USER = "admin"
BOOTSTRAP_TOKEN_NAME = "client.json"
# The bootstrap token is replaced at start when it would expire within this long, so that a
# local user never finds the platform's own client config dead.
RENEW_WITHIN = timedelta(days=7)
# ``last_used_at`` is rewritten at most this often per token: recording every request
# would make each one a database write.
LAST_USED_RESOLUTION = timedelta(seconds=60)
# What FfDL's command-line client prints for any 401; the answer to a failed Basic sign-in.
BAD_CREDENTIALS = "Bad username or password."
BEARER_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="ffdl"'}
USERINFO_HEADER = "X-Watson-Userinfo"
# The key of ``X-Watson-Userinfo`` (``key=value`` pairs separated by ``;``) naming the user.
USERINFO_USER_KEY = "bluemix-instance-id"


class Role(StrEnum):
    PLATFORM_ADMIN = "platform-admin"
    TENANT_ADMIN = "admin"
    MEMBER = "member"


@dataclass(frozen=True, slots=True)
class Principal:
    user_id: str
    tenant_id: str
    role: str
    token_id: str | None = None

    @property
    def is_platform_admin(self) -> bool:
        return self.role == Role.PLATFORM_ADMIN

    @property
    def is_tenant_admin(self) -> bool:
        """An admin of its own tenant (a platform admin is one too)."""
        return self.role in (Role.TENANT_ADMIN, Role.PLATFORM_ADMIN)

    def sees(self, tenant_id: str) -> bool:
        """Whether this caller may see the jobs and objects of ``tenant_id``."""
        return self.is_platform_admin or tenant_id == self.tenant_id

    def administers(self, tenant_id: str) -> bool:
        """Whether this caller may manage the users and tokens of ``tenant_id``."""
        return self.is_platform_admin or (self.is_tenant_admin and tenant_id == self.tenant_id)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def iso(value: datetime | None) -> str | None:
    return None if value is None else value.replace(tzinfo=UTC).isoformat()


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


def new_token_id() -> str:
    return "tok-" + secrets.token_hex(6)


def issue_token(
    session: Session, user_id: str, *, name: str, lifetime: timedelta
) -> tuple[str, ApiToken]:
    """A new token for ``user_id``, added to ``session``: the secret (shown once) and its row."""
    token = "ffdl_" + secrets.token_urlsafe(32)
    now = utcnow()
    row = ApiToken(
        token_hash=hash_token(token),
        user_id=user_id,
        created_at=now,
        id=new_token_id(),
        name=name,
        expires_at=now + lifetime,
    )
    session.add(row)
    return token, row


MAX_TOKEN_DAYS = 36_500.0


def token_lifetime(settings: Settings, days: float | None = None) -> timedelta:
    """``days`` (default: the configured lifetime), capped where datetimes would overflow."""
    return timedelta(days=min(settings.token_ttl_days if days is None else days, MAX_TOKEN_DAYS))


def _upgrade_old_tokens(session: Session, settings: Settings) -> None:
    """Give tokens from before ids and expiry existed an id, and an expiry from now on."""
    expires_at = utcnow() + token_lifetime(settings)
    for row in session.scalars(select(ApiToken).where(ApiToken.id.is_(None))).all():
        row.id = new_token_id()
    session.execute(
        update(ApiToken).where(ApiToken.expires_at.is_(None)).values(expires_at=expires_at)
    )


def _bootstrap_user(session: Session) -> None:
    """The default tenant and its platform admin; an older platform's admin is promoted."""
    now = utcnow()
    if session.get(Tenant, DEFAULT_TENANT) is None:
        session.add(Tenant(id=DEFAULT_TENANT, name="Default tenant", created_at=now))
        session.flush()
    admin = session.get(User, ADMIN_USER)
    if admin is None:
        session.add(
            User(
                id=ADMIN_USER,
                tenant_id=DEFAULT_TENANT,
                name="admin",
                role=Role.PLATFORM_ADMIN.value,
                created_at=now,
            )
        )
    elif admin.tenant_id == DEFAULT_TENANT and admin.role == Role.TENANT_ADMIN:
        admin.role = Role.PLATFORM_ADMIN.value


def _usable_client_token(store: Store, config_path: Path) -> str | None:
    """The token of an existing client config, if it is valid for more than a week yet."""
    try:
        candidate = str(json.loads(config_path.read_text()).get("token", ""))
    except (ValueError, OSError, AttributeError):
        return None
    with store.read() as session:
        row = session.get(ApiToken, hash_token(candidate))
    if row is None or row.user_id != ADMIN_USER:
        return None
    if row.expires_at is not None and row.expires_at - utcnow() < RENEW_WITHIN:
        return None
    return candidate


def bootstrap(store: Store, settings: Settings) -> None:
    """Every start: the default tenant and platform admin, and a client config that works."""
    with store.write() as session:
        _bootstrap_user(session)
        _upgrade_old_tokens(session, settings)
    config_path = settings.client_config_path
    token = _usable_client_token(store, config_path) if config_path.exists() else None
    if token is None:
        with store.write() as session:
            token, _row = issue_token(
                session, ADMIN_USER, name=BOOTSTRAP_TOKEN_NAME, lifetime=token_lifetime(settings)
            )
    client: dict[str, str] = {"url": settings.api_url, "token": token}
    if settings.ca_bundle is not None:
        # The CLI on this host verifies the server with the CA the operator named.
        client["ca_bundle"] = str(settings.ca_bundle.resolve())
    _write_private(config_path, json.dumps(client, indent=2))


def refused(message: str, challenge: dict[str, str], detail: Any = None) -> AuthError:
    """A 401 with its ``WWW-Authenticate`` challenge."""
    error = AuthError(message, detail=detail)
    error.headers = dict(challenge)
    return error


def find_user(session: Session, name: str) -> User | None:
    """The user called ``name``: its id, or the bare name of a user of the default tenant."""
    user = session.get(User, name)
    if user is None and name and "." not in name:
        user = session.get(User, f"{DEFAULT_TENANT}.{name}")
    return user


def authenticate(
    store: Store,
    authorization: str | None,
    *,
    sign_ins: SignIns | None = None,
    client: str = "",
) -> Principal:
    """The caller named by an ``Authorization`` header: a bearer token, or HTTP Basic."""
    scheme, _, credentials = (authorization or "").strip().partition(" ")
    if scheme.lower() == "bearer":
        return _authenticate_token(store, credentials.strip())
    if scheme.lower() == "basic":
        return sign_in_basic(store, sign_ins or SignIns(), credentials.strip(), client)
    if not scheme:
        raise refused(
            "missing credentials: send 'Authorization: Bearer <token>', or HTTP Basic with "
            "a user name and password",
            BASIC_CHALLENGE,
        )
    raise refused(
        f"unsupported authorization scheme {scheme[:32]!r}: use Bearer or Basic", BASIC_CHALLENGE
    )


def _authenticate_token(store: Store, token: str) -> Principal:
    token_hash = hash_token(token)
    with store.read() as session:
        row = session.execute(
            select(
                User.id,
                User.tenant_id,
                User.role,
                ApiToken.id,
                ApiToken.expires_at,
                ApiToken.last_used_at,
            )
            .join(ApiToken, ApiToken.user_id == User.id)
            .where(ApiToken.token_hash == token_hash)
        ).first()
    if row is None:
        raise refused("invalid or revoked token", BEARER_CHALLENGE)
    user_id, tenant_id, role, token_id, expires_at, last_used_at = row
    now = utcnow()
    if expires_at is not None and expires_at <= now:
        raise refused(
            f"token expired at {iso(expires_at)}: get a new one (`ffdl token create` "
            "with a valid token, or from an admin)",
            BEARER_CHALLENGE,
            detail={"reason": "expired", "expires_at": iso(expires_at)},
        )
    if last_used_at is None or now - last_used_at >= LAST_USED_RESOLUTION:
        with store.write() as session:
            session.execute(
                update(ApiToken).where(ApiToken.token_hash == token_hash).values(last_used_at=now)
            )
    return Principal(user_id=user_id, tenant_id=tenant_id, role=role, token_id=token_id)


def parse_basic(credentials: str) -> tuple[str, str]:
    """``(user, password)`` of the base64 part of a Basic ``Authorization`` header."""
    try:
        decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        raise refused(
            "malformed Basic credentials: expected base64 of 'user:password'", BASIC_CHALLENGE
        ) from None
    username, colon, password = decoded.partition(":")
    if not colon or not username:
        raise refused(
            "malformed Basic credentials: expected base64 of 'user:password'", BASIC_CHALLENGE
        )
    return username, password


def _principal_with_hash(store: Store, user_id: str, password_hash: str) -> Principal | None:
    """The user ``user_id`` if its stored password hash is still ``password_hash``."""
    with store.read() as session:
        row = session.execute(
            select(User.tenant_id, User.role).where(
                User.id == user_id, User.password_hash == password_hash
            )
        ).first()
    return None if row is None else Principal(user_id=user_id, tenant_id=row[0], role=row[1])


def sign_in_basic(store: Store, sign_ins: SignIns, credentials: str, client: str) -> Principal:
    """The user of HTTP Basic ``credentials``; 401 with FfDL's message when they are wrong."""
    username, password = parse_basic(credentials)
    remembered = sign_ins.remembered(username, password)
    if remembered is not None:
        principal = _principal_with_hash(store, *remembered)
        if principal is not None:
            return principal
        sign_ins.forget(username, password)
    wait = sign_ins.blocked_for(username, client)
    if wait > 0:
        raise TooManyAttempts(
            f"too many failed sign-ins as {username[:64]!r}: try again in {wait:.0f} s", wait
        )
    with store.read() as session:
        user = find_user(session, username)
        found = None if user is None else Principal(user.id, user.tenant_id, user.role)
        password_hash = None if user is None else user.password_hash
    verified = sign_ins.verify(password_hash, password)
    if found is None or password_hash is None or not verified.ok:
        sign_ins.failed(username, client)
        raise refused(BAD_CREDENTIALS, BASIC_CHALLENGE)
    sign_ins.succeeded(username, client)
    if verified.rehashed is not None:
        # Only over the hash just verified: a password set meanwhile is never overwritten.
        with store.write() as session:
            stale = session.scalar(
                select(User).where(User.id == found.user_id, User.password_hash == password_hash)
            )
            if stale is not None:
                stale.password_hash = password_hash = verified.rehashed
    sign_ins.remember(username, password, found.user_id, password_hash)
    return found


def userinfo_user(header: str) -> str | None:
    """The user named by an ``X-Watson-Userinfo`` value (``key=value;...``), if any."""
    for pair in header.split(";"):
        key, equals, value = pair.partition("=")
        if equals and key.strip() == USERINFO_USER_KEY and value.strip():
            return value.strip()
    return None


def authenticate_userinfo(store: Store, header: str) -> Principal:
    """The caller a trusted proxy names in ``X-Watson-Userinfo``."""
    name = userinfo_user(header)
    if name is None:
        raise refused(f"Missing or malformed {USERINFO_HEADER} header.", BASIC_CHALLENGE)
    with store.read() as session:
        user = find_user(session, name)
        if user is None:
            raise refused(f"{USERINFO_HEADER} names no user here: {name[:64]!r}", BASIC_CHALLENGE)
        return Principal(user_id=user.id, tenant_id=user.tenant_id, role=user.role)
