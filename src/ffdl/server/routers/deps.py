"""Request dependencies shared by the routers: the platform and the authenticated caller."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBasic, HTTPBearer
from starlette.requests import HTTPConnection

from ffdl.server.auth import (
    USERINFO_HEADER,
    Principal,
    authenticate,
    authenticate_userinfo,
    refused,
)
from ffdl.server.passwords import BASIC_CHALLENGE
from ffdl.server.platform import Platform

# Documents the bearer token as the API's security scheme; ``authenticate`` checks it (and
# gives its own 401 for a missing one, so the scheme never answers by itself).
api_token = HTTPBearer(
    auto_error=False,
    scheme_name="ApiToken",
    description="An API token: `ffdl token create`, or the `token` in HOME/client.json.",
)


class _DocumentedBasic(HTTPBasic):
    """HTTP Basic in the OpenAPI document only: ``authenticate`` checks the credentials
    (FastAPI's own parser would refuse passwords that are not ASCII)."""

    async def __call__(self, request: HTTPConnection) -> None:  # type: ignore[override]
        return None


basic_auth = _DocumentedBasic(
    auto_error=False,
    scheme_name="BasicAuth",
    realm="ffdl",
    description="A user name (`tenant.name`) and the password an admin set "
    "(`ffdl user password`), as FfDL's clients send them.",
)


def get_platform(request: Request) -> Platform:
    platform: Platform = request.app.state.platform
    return platform


# FfDL's CLI sends no credentials for `logs` and `logs --metrics` without `--follow` (its
# swagger declares those calls `security: []`), only this header, which FfDL's server
# trusted. Anyone can send it, so it names nobody here unless a trusted proxy set it.
HEADER_ONLY_REFUSAL = (
    f"this client sent no credentials for this call, only {USERINFO_HEADER}, which this "
    "platform does not trust from clients (FfDL's CLI does this for `logs` and `logs "
    "--metrics` without --follow): use `logs --follow` or `logs --metrics --follow`, ffdl's "
    "`ffdl loglines`/`ffdl emetrics`, or run the platform behind an authenticating proxy "
    "with trusted_proxy on"
)


def principal_from_headers(
    platform: Platform, headers: Mapping[str, str], client: str = ""
) -> Principal:
    """The caller of a request (or websocket) with ``headers`` from address ``client``.

    With ``trusted_proxy`` on, an ``X-Watson-Userinfo`` header names the caller (the proxy
    has authenticated it); otherwise that header is ignored and ``Authorization`` decides.
    """
    userinfo = headers.get(USERINFO_HEADER)
    if platform.settings.trusted_proxy:
        if userinfo:
            return authenticate_userinfo(platform.store, userinfo)
    elif userinfo and not headers.get("authorization"):
        raise refused(HEADER_ONLY_REFUSAL, BASIC_CHALLENGE)
    return authenticate(
        platform.store, headers.get("authorization"), sign_ins=platform.sign_ins, client=client
    )


def connection_principal(platform: Platform, connection: HTTPConnection) -> Principal:
    """``principal_from_headers`` for a request or websocket connection."""
    client = connection.client.host if connection.client is not None else ""
    return principal_from_headers(platform, connection.headers, client)


def get_principal(
    request: Request,
    platform: Annotated[Platform, Depends(get_platform)],
    _token: Annotated[HTTPAuthorizationCredentials | None, Depends(api_token)],
    _basic: Annotated[None, Depends(basic_auth)],
) -> Principal:
    return connection_principal(platform, request)


PlatformDep = Annotated[Platform, Depends(get_platform)]
PrincipalDep = Annotated[Principal, Depends(get_principal)]
