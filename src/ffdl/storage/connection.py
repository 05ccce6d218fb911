"""How a data store's ``connection`` fields name an S3 endpoint and its credentials.

FfDL's manifests spell them ``auth_url``, ``user_name``, ``password``; S3 tools spell them
``endpoint``, ``access_key``, ``secret_key``. Both are accepted (with a few common variants),
and ``S3Connection`` is the one shape the rest of ffdl uses. This module uses the standard
library only: the manifest parser and the learner controller import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# The first name of each tuple is FfDL's; the others are accepted as well.
ENDPOINT_KEYS = ("auth_url", "endpoint", "endpoint_url")
ACCESS_KEY_KEYS = ("user_name", "access_key", "access_key_id", "aws_access_key_id")
SECRET_KEY_KEYS = ("password", "secret_key", "secret_access_key", "aws_secret_access_key")
REGION_KEYS = ("region", "region_name")


class ConnectionFieldError(ValueError):
    """A connection field is missing or unusable; ``key`` names it as the user would."""

    def __init__(self, key: str, alternative: str) -> None:
        super().__init__(f"connection.{key} is required for an object store (or {alternative})")
        self.key = key
        self.alternative = alternative


def _first(fields: Mapping[str, str], keys: tuple[str, ...]) -> tuple[str, str] | None:
    """The first of ``keys`` given a non-blank value in ``fields``, with that value."""
    lowered = {str(key).lower(): str(value) for key, value in fields.items()}
    for key in keys:
        value = lowered.get(key, "").strip()
        if value:
            return key, value
    return None


@dataclass(frozen=True)
class S3Connection:
    """Where an S3-compatible store is and who connects; the secret never shows in a repr."""

    access_key: str
    secret_key: str = field(repr=False)
    endpoint: str | None = None
    region: str | None = None

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> S3Connection:
        """Read a manifest's connection; ``ConnectionFieldError`` names what is missing."""
        access = _first(fields, ACCESS_KEY_KEYS)
        if access is None:
            raise ConnectionFieldError(ACCESS_KEY_KEYS[0], ACCESS_KEY_KEYS[1])
        secret = _first(fields, SECRET_KEY_KEYS)
        if secret is None:
            raise ConnectionFieldError(SECRET_KEY_KEYS[0], SECRET_KEY_KEYS[1])
        endpoint = _first(fields, ENDPOINT_KEYS)
        region = _first(fields, REGION_KEYS)
        return cls(
            access_key=access[1],
            secret_key=secret[1],
            endpoint=endpoint[1] if endpoint else None,
            region=region[1] if region else None,
        )

    @staticmethod
    def endpoint_key(fields: Mapping[str, str]) -> str:
        """The key the user gave the endpoint under (FfDL's ``auth_url`` when none)."""
        found = _first(fields, ENDPOINT_KEYS)
        return found[0] if found else ENDPOINT_KEYS[0]

    def to_fields(self) -> dict[str, str]:
        """The canonical fields, as written into a learner's spec."""
        fields = {"access_key": self.access_key, "secret_key": self.secret_key}
        if self.endpoint:
            fields["endpoint"] = self.endpoint
        if self.region:
            fields["region"] = self.region
        return fields
