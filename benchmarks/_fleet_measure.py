"""What ``fleet.py`` reads off a running platform: quantiles, the replicas' ``/metrics``
histograms, the harnesses' counts, processes' CPU and memory, and the database's size."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from _server import LiveServer
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from ffdl.server.store.db import Store


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """``q`` of a cumulative histogram's (upper bound, count) pairs, interpolated."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound
            span = count - lower_count
            return lower_bound + (bound - lower_bound) * (
                (rank - lower_count) / span if span else 0
            )
        lower_bound, lower_count = bound, count
    return None


PASSES = "ffdl_loop_pass_duration_seconds"
REQUESTS = "ffdl_api_request_duration_seconds"


@dataclass(frozen=True)
class Scrape:
    """Every replica's ``/metrics`` at one moment, summed over the replicas: each
    histogram's cumulative buckets and its ``_sum``, by family and label set."""

    buckets: dict[tuple[str, frozenset[tuple[str, str]]], dict[float, float]]
    sums: dict[tuple[str, frozenset[tuple[str, str]]], float]

    def buckets_since(
        self, before: Scrape, family: str, labels: dict[str, str]
    ) -> list[tuple[float, float]]:
        """(upper bound, count) of the series of ``family`` that carry ``labels``, counted
        since ``before``."""
        now, then = self._bucket_totals(family, labels), before._bucket_totals(family, labels)
        return [(bound, now[bound] - then.get(bound, 0.0)) for bound in sorted(now)]

    def sum(self, family: str, labels: dict[str, str]) -> float:
        """The ``_sum`` of the series of ``family`` that carry ``labels``."""
        wanted = set(labels.items())
        return sum(v for (name, ls), v in self.sums.items() if name == family and wanted <= ls)

    def _bucket_totals(self, family: str, labels: dict[str, str]) -> dict[float, float]:
        wanted = set(labels.items())
        totals: dict[float, float] = {}
        for (name, ls), counts in self.buckets.items():
            if name == family and wanted <= ls:
                for bound, count in counts.items():
                    totals[bound] = totals.get(bound, 0.0) + count
        return totals


def scrape_histograms(replicas: list[LiveServer]) -> Scrape:
    """One ``/metrics`` page from each replica, read once (a page is over a MiB at 10,000
    nodes); a replica that does not answer counts nothing."""
    buckets: dict[tuple[str, frozenset[tuple[str, str]]], dict[float, float]] = {}
    sums: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for replica in replicas:
        with contextlib.suppress(httpx.HTTPError):
            page = replica.client.get("/metrics").text
            for family in text_string_to_metric_families(page):
                if family.name not in (PASSES, REQUESTS):
                    continue
                for sample in family.samples:
                    labels = {k: v for k, v in sample.labels.items() if k != "le"}
                    key = (family.name, frozenset(labels.items()))
                    if sample.name.endswith("_bucket"):
                        counts = buckets.setdefault(key, {})
                        bound = float(sample.labels["le"])
                        counts[bound] = counts.get(bound, 0.0) + sample.value
                    elif sample.name.endswith("_sum"):
                        sums[key] = sums.get(key, 0.0) + sample.value
    return Scrape(buckets, sums)


def database_bytes(database_url: str, home: Path) -> int:
    if database_url.startswith("sqlite"):
        return sum(p.stat().st_size for p in home.glob("ffdl.db*"))
    store = Store(database_url)
    try:
        with store.read() as session:
            return int(
                session.execute(text("SELECT pg_database_size(current_database())")).scalar_one()
            )
    finally:
        store.dispose()


def harness_stats(urls: list[str]) -> dict[str, Any]:
    """Every harness's ``/stats``, added up; of the post latencies, the slowest harness's."""
    each = [httpx.get(f"{url}/stats", timeout=30).json() for url in urls]
    total: dict[str, Any] = {"learners": {}, "answers": {}}
    for stats in each:
        for key in ("learners", "answers"):
            for name, count in stats[key].items():
                total[key][name] = total[key].get(name, 0) + count
        for key in ("lines_acked", "metrics_acked", "posts", "backlog_items"):
            total[key] = total.get(key, 0) + stats[key]
    for key in ("post_p50_ms", "post_p99_ms"):
        values = [stats[key] for stats in each if stats[key] is not None]
        total[key] = max(values) if values else None
    return total


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0
