"""``/v1/tokens``: the caller's API tokens (and, for admins, those of the users they manage)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from ffdl.server.routers.deps import PlatformDep, PrincipalDep
from ffdl.server.routers.responses import AUTHENTICATED, errors
from ffdl.server.services import tokens
from ffdl.server.services.tokens import TokenCreate

router = APIRouter(prefix="/v1/tokens", tags=["tokens"], responses=AUTHENTICATED)


@router.get("", responses=errors(400))
def get_tokens(
    platform: PlatformDep,
    principal: PrincipalDep,
    user: Annotated[str | None, Query(max_length=200)] = None,
) -> dict[str, Any]:
    return {"tokens": tokens.list_tokens(platform, principal, user)}


@router.post("", status_code=201, responses=errors(400))
def post_token(platform: PlatformDep, principal: PrincipalDep, body: TokenCreate) -> dict[str, Any]:
    return tokens.create_token(platform, principal, body)


@router.delete("/{token_id}", responses=errors(404))
def delete_token(platform: PlatformDep, principal: PrincipalDep, token_id: str) -> dict[str, Any]:
    return tokens.revoke_token(platform, principal, token_id)
