"""Request dependencies shared by the routers: the platform and the authenticated caller."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from ffdl.server.auth import Principal, authenticate
from ffdl.server.platform import Platform


def get_platform(request: Request) -> Platform:
    platform: Platform = request.app.state.platform
    return platform


def get_principal(
    platform: Annotated[Platform, Depends(get_platform)],
    authorization: Annotated[str | None, Header()] = None,
) -> Principal:
    return authenticate(platform.store, authorization)


PlatformDep = Annotated[Platform, Depends(get_platform)]
PrincipalDep = Annotated[Principal, Depends(get_principal)]
