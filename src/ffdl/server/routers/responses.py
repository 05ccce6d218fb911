"""What the routers document besides their success answers, from one shared definition.

Every error the API gives is an :class:`ffdl.core.errors.FfdlError` (or a request the app
refuses before a handler runs, see ``app.py``), rendered in FfDL's error shape with ffdl's
own code added: :class:`ErrorBody`. A router passes ``responses=errors(...)`` with the
statuses its routes can really answer, so the OpenAPI that FastAPI generates lists them.
Request validation fails with a 400 here, never FastAPI's 422, which
:func:`without_validation_422` drops from the generated document.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

ErrorDetail = dict[str, Any] | list[dict[str, Any]] | None


class ErrorBody(BaseModel):
    """Every error answer: FfDL's ``code``/``error``/``description``, ffdl's stable code and
    machine-readable detail."""

    code: int = Field(description="the HTTP status, as FfDL's clients decode it")
    error: str = Field(description="the HTTP status's short phrase, e.g. `Not Found`")
    description: str = Field(description="what went wrong, for people")
    ffdl_code: str = Field(
        description="ffdl's stable code, e.g. C101 (manifest), C103 (auth), C404, S100"
    )
    detail: ErrorDetail = Field(
        default=None,
        description="the offending field and why, or one entry per invalid request field",
    )


_DESCRIPTIONS = {
    400: "Invalid request: a field, parameter, manifest or archive the API refuses",
    401: "Missing, invalid, expired or revoked token",
    403: "The caller's role may not do this",
    404: "No such object, or another tenant's",
    409: "The request contradicts the object's current state",
    410: "A report for a learner attempt that was superseded or a job that has ended",
    413: "An upload over the platform's limits",
    503: "The platform's database is unreachable for now; retry after `Retry-After` seconds",
    507: "The platform's disk is full; nothing was stored",
}

Responses = dict[int | str, dict[str, Any]]


def errors(*statuses: int) -> Responses:
    """The ``responses=`` entries documenting ``statuses`` with :class:`ErrorBody`."""
    documented: Responses = {}
    for status in statuses:
        entry: dict[str, Any] = {"model": ErrorBody, "description": _DESCRIPTIONS[status]}
        if status == 503:
            entry["headers"] = {"Retry-After": header("seconds to wait before retrying")}
        documented[status] = entry
    return documented


def header(description: str) -> dict[str, Any]:
    """A header every answer of its status carries."""
    return {"description": description, "required": True, "schema": {"type": "string"}}


def content(
    *media_types: str,
    binary: bool = False,
    description: str = "",
    headers: dict[str, dict[str, Any]] | None = None,
) -> Responses:
    """A 200 answer that is not JSON: ``media_types`` with a string (or binary) body."""
    schema: dict[str, Any] = {"type": "string"}
    if binary:
        schema["format"] = "binary"
    entry: dict[str, Any] = {"content": {media: {"schema": schema} for media in media_types}}
    if description:
        entry["description"] = description
    if headers:
        entry["headers"] = headers
    return {200: entry}


def event_stream(events: list[str], description: str) -> Responses:
    """A 200 stream of Server-Sent Events named ``events``, each with a JSON ``data``.

    ``itemSchema`` describes one event, as FastAPI documents its own event streams.
    """
    item = {
        "type": "object",
        "properties": {
            "event": {"type": "string", "enum": events},
            "data": {"type": "string", "contentMediaType": "application/json"},
        },
        "required": ["event", "data"],
    }
    return {
        200: {"description": description, "content": {"text/event-stream": {"itemSchema": item}}}
    }


def download(media_type: str, description: str) -> Responses:
    """A 200 file download: ``media_type`` and the ``Content-Disposition`` naming the file."""
    return content(
        media_type,
        binary=True,
        description=description,
        headers={"Content-Disposition": header("attachment; the file's name")},
    )


# Every route behind a token can refuse the caller, and needs the database to check it.
AUTHENTICATED = errors(401, 503)


def without_validation_422(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` without the 422 answers FastAPI adds to every route with parameters.

    The app answers an invalid request with a 400 :class:`ErrorBody` (``app.py``); each
    route documents that 400 itself, so a 422 would be an answer the API never gives.
    """
    for path_item in document.get("paths", {}).values():
        for operation in path_item.values():
            if isinstance(operation, dict):
                operation.get("responses", {}).pop("422", None)
    schemas = document.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    return document
