"""Users' passwords: argon2id hashing, the length policy, and the bookkeeping of sign-ins.

Hashes come from argon2-cffi's ``PasswordHasher`` with its defaults (RFC 9106's low-memory
argon2id profile); a hash made with other parameters is replaced at the next successful sign-in.

Verifying a password is slow and memory-hungry on purpose (about 100 ms and 64 MiB). FfDL's
clients send their password with every request, so ``SignIns`` remembers a successful
verification for ``REMEMBER_S``, keyed by an HMAC of the credentials under a key that exists
only in this process (the password itself is never kept). A remembered sign-in counts only
while the user's stored hash is still the one it was checked against, so a changed or removed
password ends it at once, in every server process.

Guessing: after ``FAILURES_BEFORE_BACKOFF`` failures in a row for one user name from one client
address, that pair is refused without verifying (a 401 with ``Retry-After``) for a delay that
doubles with each further failure, up to ``MAX_BACKOFF_S``. A right password that is already
remembered is never held back, so a flood of wrong guesses cannot lock out a client that is
working. At most ``MAX_CONCURRENT_VERIFICATIONS`` verifications run at once, so a flood of
sign-ins cannot exhaust the server's memory.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from ffdl.core.errors import AuthError, BadRequest

MAX_PASSWORD_LENGTH = 1024
REMEMBER_S = 300.0
REMEMBER_MAX_ENTRIES = 4096
FAILURES_BEFORE_BACKOFF = 5
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 300.0
# Failure records older than this are forgotten: the back-off starts over.
FAILURE_MEMORY_S = 900.0
FAILURE_MAX_ENTRIES = 10_000
MAX_CONCURRENT_VERIFICATIONS = 4
# The challenge of every 401 to a Basic sign-in (RFC 7617).
BASIC_CHALLENGE = {"WWW-Authenticate": 'Basic realm="ffdl"'}

_hasher = PasswordHasher()


class TooManyAttempts(AuthError):
    """Sign-ins refused for a while after repeated failures; ``retry_after`` in seconds.

    A 401 like any refused sign-in (clients handle that one, FfDL's among them), with the
    wait in ``Retry-After``.
    """

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message, detail={"retry_after": round(retry_after, 1)})
        self.retry_after = retry_after
        self.headers = {**BASIC_CHALLENGE, "Retry-After": str(max(1, math.ceil(retry_after)))}


def check_password(password: str, min_length: int) -> None:
    """Raise ``BadRequest`` naming the rule when ``password`` may not be set."""
    if len(password) < min_length:
        raise BadRequest(
            f"password too short: {len(password)} characters, at least {min_length} needed",
            detail={"field": "password"},
        )
    if len(password) > MAX_PASSWORD_LENGTH:
        raise BadRequest(
            f"password too long: {len(password)} characters, at most {MAX_PASSWORD_LENGTH}",
            detail={"field": "password"},
        )
    if any(ch in password for ch in "\x00\r\n"):
        raise BadRequest(
            "password may not contain NUL or line breaks", detail={"field": "password"}
        )


def hash_password(password: str) -> str:
    """The argon2id hash of ``password``, with the current parameters."""
    return _hasher.hash(password)


@dataclass(frozen=True, slots=True)
class Verified:
    ok: bool
    # A new hash to store in place of the old one (parameters changed); None when current.
    rehashed: str | None = None


@dataclass(slots=True)
class _Remembered:
    user_id: str
    password_hash: str
    until: float


@dataclass(slots=True)
class _Failures:
    count: int
    last: float
    blocked_until: float


class SignIns:
    """Verification with a short memory of successes, a back-off on failures, and a cap on
    concurrent verifications. Safe to use from many request threads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._key = secrets.token_bytes(32)
        self._lock = threading.Lock()
        self._remembered: OrderedDict[bytes, _Remembered] = OrderedDict()
        self._failures: OrderedDict[tuple[str, str], _Failures] = OrderedDict()
        self._verifying = threading.BoundedSemaphore(MAX_CONCURRENT_VERIFICATIONS)
        self._dummy_hash: str | None = None

    # -- remembered successes ---------------------------------------------------------------

    def _credential_key(self, username: str, password: str) -> bytes:
        message = username.encode() + b"\x00" + password.encode()
        return hmac.new(self._key, message, hashlib.sha256).digest()

    def remembered(self, username: str, password: str) -> tuple[str, str] | None:
        """``(user_id, password_hash)`` of a recent successful sign-in with these credentials."""
        key = self._credential_key(username, password)
        with self._lock:
            entry = self._remembered.get(key)
            if entry is None:
                return None
            if entry.until <= self._clock():
                del self._remembered[key]
                return None
            return entry.user_id, entry.password_hash

    def remember(self, username: str, password: str, user_id: str, password_hash: str) -> None:
        key = self._credential_key(username, password)
        with self._lock:
            self._remembered[key] = _Remembered(user_id, password_hash, self._clock() + REMEMBER_S)
            self._remembered.move_to_end(key)
            while len(self._remembered) > REMEMBER_MAX_ENTRIES:
                self._remembered.popitem(last=False)

    def forget_user(self, user_id: str) -> None:
        """Drop every remembered sign-in of ``user_id`` (its password changed)."""
        with self._lock:
            for key in [k for k, v in self._remembered.items() if v.user_id == user_id]:
                del self._remembered[key]

    def forget(self, username: str, password: str) -> None:
        with self._lock:
            self._remembered.pop(self._credential_key(username, password), None)

    # -- failures ---------------------------------------------------------------------------

    def blocked_for(self, username: str, client: str) -> float:
        """Seconds this user name from this client must wait before the next try (0: none)."""
        now = self._clock()
        with self._lock:
            record = self._failures.get((username, client))
            if record is None:
                return 0.0
            if now - record.last > FAILURE_MEMORY_S:
                del self._failures[(username, client)]
                return 0.0
            return max(0.0, record.blocked_until - now)

    def failed(self, username: str, client: str) -> None:
        now = self._clock()
        key = (username, client)
        with self._lock:
            record = self._failures.get(key)
            if record is None or now - record.last > FAILURE_MEMORY_S:
                record = _Failures(0, now, now)
            record.count += 1
            record.last = now
            beyond = record.count - FAILURES_BEFORE_BACKOFF
            if beyond >= 0:
                record.blocked_until = now + min(FIRST_BACKOFF_S * 2.0**beyond, MAX_BACKOFF_S)
            self._failures[key] = record
            self._failures.move_to_end(key)
            while len(self._failures) > FAILURE_MAX_ENTRIES:
                self._failures.popitem(last=False)

    def succeeded(self, username: str, client: str) -> None:
        with self._lock:
            self._failures.pop((username, client), None)

    # -- verification -----------------------------------------------------------------------

    def verify(self, password_hash: str | None, password: str) -> Verified:
        """Check ``password`` against ``password_hash``; with no hash, spend the same time
        on a stand-in (so answers do not tell which user names exist) and fail."""
        if password_hash is None:
            self._verify_quietly(self._stand_in(), password)
            return Verified(ok=False)
        if not self._verify_quietly(password_hash, password):
            return Verified(ok=False)
        if _hasher.check_needs_rehash(password_hash):
            return Verified(ok=True, rehashed=hash_password(password))
        return Verified(ok=True)

    def _verify_quietly(self, password_hash: str, password: str) -> bool:
        with self._verifying:
            try:
                return _hasher.verify(password_hash, password)
            except (VerificationError, InvalidHashError):
                return False

    def _stand_in(self) -> str:
        if self._dummy_hash is None:
            self._dummy_hash = hash_password(secrets.token_urlsafe(16))
        return self._dummy_hash
