"""Request dependencies shared by the routers: the platform and the authenticated caller."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ffdl.server.auth import Principal, authenticate
from ffdl.server.platform import Platform

# Documents the bearer token as the API's security scheme; ``authenticate`` checks it (and
# gives its own 401 for a missing one, so the scheme never answers by itself).
api_token = HTTPBearer(
    auto_error=False,
    scheme_name="ApiToken",
    description="An API token: `ffdl token create`, or the `token` in HOME/client.json.",
)


def get_platform(request: Request) -> Platform:
    platform: Platform = request.app.state.platform
    return platform


def get_principal(
    request: Request,
    platform: Annotated[Platform, Depends(get_platform)],
    _token: Annotated[HTTPAuthorizationCredentials | None, Depends(api_token)],
) -> Principal:
    return authenticate(platform.store, request.headers.get("authorization"))


PlatformDep = Annotated[Platform, Depends(get_platform)]
PrincipalDep = Annotated[Principal, Depends(get_principal)]
