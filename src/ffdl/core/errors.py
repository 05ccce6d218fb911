"""The exception hierarchy every layer of ffdl raises and the API turns into JSON.

::

    FfdlError                      code, http_status, message, detail
    ├── BadRequest (400)
    │   ├── ManifestError          C101 (C104 for resource specs): names the field
    │   ├── ArchiveError           C102: the model definition archive is unusable
    │   └── UnschedulableError     S100: the job can never fit on this cluster
    ├── AuthError (401)            C103: missing or invalid credentials
    ├── Forbidden (403)            the caller may not do this (e.g. not an admin)
    ├── NotFound (404)             unknown id, or another tenant's object
    ├── ConflictError (409)        the request contradicts the object's state
    │   ├── IllegalTransition      the status machine forbids this change
    │   ├── StatusChanged          another replica changed the status meanwhile
    │   └── LeaseLost              a loop's write under a lease this replica lost
    ├── Gone (410)                 a report for a learner attempt that was superseded
    ├── PayloadTooLarge (413)      an upload over the configured limits
    ├── Unavailable (503)          S503: a part the request needs (the database) is away
    │                              for now; ``Retry-After`` says when to try again
    └── InsufficientStorage (507)  S507: the platform's disk is full; nothing was stored

The API renders each with its HTTP status in FfDL's error shape, plus ffdl's own code and
detail (:func:`error_body`); nothing else leaks to a client::

    {"code": 404, "error": "Not Found", "description": "Model not found: ...",
     "ffdl_code": "C404", "detail": null}
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any


def status_phrase(status: int) -> str:
    """The HTTP reason phrase of ``status`` (FfDL's short ``error`` text)."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def error_body(status: int, description: str, ffdl_code: str, detail: Any = None) -> dict[str, Any]:
    """An error answer as FfDL's clients decode it (``code`` is the HTTP status, an integer;
    ``error`` its phrase; ``description`` the message for people), with ffdl's stable code in
    ``ffdl_code`` and the machine-readable ``detail``."""
    return {
        "code": status,
        "error": status_phrase(status),
        "description": description,
        "ffdl_code": ffdl_code,
        "detail": detail,
    }


class FfdlError(Exception):
    """Base of all errors ffdl reports to a user."""

    http_status = 500
    default_code = "E500"
    # Extra HTTP headers of the response, e.g. the ``WWW-Authenticate`` challenge of a 401.
    headers: dict[str, str] | None = None

    def __init__(self, message: str, *, code: str | None = None, detail: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.detail = detail

    def to_json(self) -> dict[str, Any]:
        return error_body(self.http_status, self.message, self.code, self.detail)


class BadRequest(FfdlError):
    http_status = 400
    default_code = "C100"


class ManifestError(BadRequest):
    """An invalid manifest; ``field`` is the dotted path of the offending field."""

    default_code = "C101"

    def __init__(self, field: str, reason: str, *, code: str | None = None) -> None:
        super().__init__(
            f"invalid manifest: {field}: {reason}",
            code=code,
            detail={"field": field, "reason": reason},
        )
        self.field = field
        self.reason = reason


class ArchiveError(BadRequest):
    default_code = "C102"


class UnschedulableError(BadRequest):
    default_code = "S100"


class AuthError(FfdlError):
    http_status = 401
    default_code = "C103"


class Forbidden(FfdlError):
    http_status = 403
    default_code = "C105"


class NotFound(FfdlError):
    http_status = 404
    default_code = "C404"


class ConflictError(FfdlError):
    http_status = 409
    default_code = "C409"


class IllegalTransition(ConflictError):
    def __init__(self, kind: str, current: str, target: str) -> None:
        super().__init__(
            f"{kind} cannot go from {current} to {target}",
            detail={"from": current, "to": target},
        )
        self.current = current
        self.target = target


class StatusChanged(ConflictError):
    """The status read at the start of a transaction was changed by another one since.

    Raised by the status gate's compare-and-set; the whole transaction rolls back, and the
    caller (a loop's next pass, a client's retry) decides again from the new status.
    """

    def __init__(self, kind: str, read: str, now: str) -> None:
        super().__init__(
            f"{kind} changed from {read} to {now} meanwhile; retry",
            detail={"read": read, "now": now},
        )


class LeaseLost(ConflictError):
    """A background loop's write, refused: this replica no longer holds the loop's lease."""


class Gone(FfdlError):
    http_status = 410
    default_code = "C410"


class PayloadTooLarge(FfdlError):
    http_status = 413
    default_code = "C413"


class Unavailable(FfdlError):
    """The request needs a part of the platform that is away for now (its database).

    Nothing the request asked for was done, so the same request may be sent again: the
    answer's ``Retry-After`` says after how many seconds.
    """

    http_status = 503
    default_code = "S503"

    def __init__(self, message: str, *, retry_after_s: int = 2, detail: Any = None) -> None:
        super().__init__(message, detail=detail)
        self.retry_after_s = retry_after_s
        self.headers = {"Retry-After": str(retry_after_s)}


class InsufficientStorage(FfdlError):
    """A write the platform could not make for lack of disk space; nothing half-written
    is kept."""

    http_status = 507
    default_code = "S507"
