"""Query parameters FfDL's clients send that ffdl accepts and documents but does not need.

FfDL's clients add ``?version=<date>`` (the API version they speak, e.g. ``2017-02-13``) to
every call, and its log readers ``searchType``. ffdl serves one version: any ``version`` is
accepted, and every search type reads like FfDL's default, ``TERM``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Depends, Query


def api_version(
    version: Annotated[
        str | None,
        Query(
            description=(
                "The API version FfDL's clients name (a date such as 2017-02-13); "
                "accepted and ignored: ffdl serves one version."
            )
        ),
    ] = None,
) -> None:
    return None


# A router's ``dependencies=``: documents and accepts ``version`` on each of its routes.
FFDL_QUERY: list[Any] = [Depends(api_version)]

SearchType = Annotated[
    Literal["TERM", "NESTED", "MATCH", "ALL"] | None,
    Query(alias="searchType", description="FfDL's search type; every one reads as TERM."),
]
