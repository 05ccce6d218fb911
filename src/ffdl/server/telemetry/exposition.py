"""The ``/metrics`` answer: who may scrape what, and the exposition itself.

Access: a platform admin's token, or the scrape token an operator configures
(``metrics_token``, given to Prometheus as its bearer token), sees every series. Any other
user's token sees only its own tenant's series: the per-tenant store series and the
per-tenant process series (queue delays, restarts, failures, ...). Cluster-wide series
(per node, API latency, loop durations) are left out for them, since they mix tenants. A
scrape token reads metrics and nothing else, so Prometheus never holds a credential that
could submit or delete jobs.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from starlette.requests import HTTPConnection

from ffdl.server.platform import Platform
from ffdl.server.routers.deps import connection_principal
from ffdl.server.telemetry.collector import StoreCollector
from ffdl.server.telemetry.instruments import REGISTRY

ALL_TENANTS = None


def scrape_scope(platform: Platform, connection: HTTPConnection) -> str | None:
    """The tenant whose series the caller may see; ``ALL_TENANTS`` for every series.

    Raises ``AuthError`` (401) for a missing or invalid credential.
    """
    expected = platform.settings.metrics_token
    header = connection.headers.get("authorization", "")
    scheme, _, presented = header.partition(" ")
    if (
        expected
        and scheme.lower() == "bearer"
        and hmac.compare_digest(presented.strip().encode(), expected.encode())
    ):
        return ALL_TENANTS
    principal = connection_principal(platform, connection)
    return ALL_TENANTS if principal.is_platform_admin else principal.tenant_id


class _OneTenant(Collector):
    """The samples of ``source`` labelled with ``tenant``; families without that label go."""

    def __init__(self, source: Collector | CollectorRegistry, tenant: str) -> None:
        self._source = source
        self._tenant = tenant

    def collect(self) -> Iterator[Metric]:
        for family in self._source.collect():
            kept = [s for s in family.samples if s.labels.get("tenant") == self._tenant]
            if not kept:
                continue
            family.samples = kept
            yield family


class _Together(Collector):
    def __init__(self, sources: Iterable[Collector | CollectorRegistry]) -> None:
        self._sources = list(sources)

    def collect(self) -> Iterator[Metric]:
        for source in self._sources:
            yield from source.collect()


def render(platform: Platform, tenant: str | None) -> bytes:
    """The exposition text of every series ``tenant`` may see (all of them for None)."""
    registry = CollectorRegistry(auto_describe=False)
    store = StoreCollector(platform, tenant)
    if tenant is ALL_TENANTS:
        registry.register(_Together([store, REGISTRY]))
    else:
        registry.register(_Together([store, _OneTenant(REGISTRY, tenant)]))
    return generate_latest(registry)
