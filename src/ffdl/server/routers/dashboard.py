"""``/`` and ``/static/{name}``: the web dashboard's page and its assets.

The files are public: the page itself holds no data and calls the JSON API with the user's
bearer token, so serving it needs no authentication.
"""

from __future__ import annotations

import re
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from ffdl.core.errors import NotFound
from ffdl.server.routers.responses import content, errors

router = APIRouter(tags=["dashboard"])

STATIC_DIR = Path(__file__).resolve().parents[2] / "dashboard" / "static"

_MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
# A plain file name with a known suffix: no separators and no leading dot, so no request can
# reach outside the static directory or a hidden file inside it.
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*$")
# The assets change with the installed version, not per request: revalidate, never go stale.
_NO_STALE = {"Cache-Control": "no-cache"}


def static_file(name: str) -> Path:
    """The asset called ``name`` in the dashboard's static directory, or ``NotFound``."""
    suffix = Path(name).suffix
    if not _SAFE_NAME.fullmatch(name) or suffix not in _MEDIA_TYPES:
        raise NotFound(f"no dashboard asset {name!r}")
    path = STATIC_DIR / name
    if not path.is_file():
        raise NotFound(f"no dashboard asset {name!r}")
    return path


def _serve(name: str) -> FileResponse:
    path = static_file(name)
    return FileResponse(path, media_type=_MEDIA_TYPES[path.suffix], headers=_NO_STALE)


@router.get(
    "/",
    response_class=FileResponse,
    responses=content("text/html", description="The dashboard's page"),
)
def index() -> FileResponse:
    return _serve("index.html")


@router.get(
    "/static/{name}",
    response_class=FileResponse,
    responses={
        **content(
            *sorted({media.split(";")[0] for media in _MEDIA_TYPES.values()}),
            description="A dashboard asset, its media type by its suffix",
        ),
        **errors(404),
    },
)
def asset(name: str) -> FileResponse:
    return _serve(name)
