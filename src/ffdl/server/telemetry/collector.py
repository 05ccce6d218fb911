"""Series read from the store at scrape time: the same from every replica and worker.

One scrape runs a handful of aggregate queries in one read transaction (jobs by status
and tenant; the current learners of the jobs that hold resources, with their heartbeats
and latest GPU figures; those jobs' progress and GPU use), then asks the backend for its
nodes outside the transaction. Per-job and per-learner series exist only for jobs that
hold resources, so their number follows the cluster's size, not the store's history.

A ``tenant`` limits the series to that tenant's: per-node series, which mix tenants, are
left out then. While the database is away these series are left out of the scrape (the
process's own series, ``ffdl_database_up`` among them, still answer).
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import and_, func, select

from ffdl.core.errors import Unavailable
from ffdl.core.progress import remaining_now
from ffdl.core.resources import Node
from ffdl.core.status import HOLDING_JOB_STATES, JobStatus
from ffdl.server.platform import Platform
from ffdl.server.services.nodes import effective_nodes
from ffdl.server.store.models import Job, Learner
from ffdl.server.store.transitions import utcnow

_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class _Snapshot:
    jobs: list[tuple[str, str, int]]
    learners: list[Any]
    holding: list[Any]


class StoreCollector(Collector):
    def __init__(self, platform: Platform, tenant: str | None = None) -> None:
        self._platform = platform
        self._tenant = tenant

    def collect(self) -> Iterator[Metric]:
        try:
            snapshot = self._read()
        except Unavailable:
            return
        yield from self._job_counts(snapshot)
        yield from self._learner_series(snapshot)
        yield from self._job_series(snapshot)
        if self._tenant is None:
            yield from self._node_series(snapshot)

    def _read(self) -> _Snapshot:
        holding = [status.value for status in HOLDING_JOB_STATES]
        with self._platform.store.read() as session:
            counts = select(Job.tenant_id, Job.status, func.count()).group_by(
                Job.tenant_id, Job.status
            )
            learners = (
                select(
                    Job.id,
                    Job.tenant_id,
                    Learner.index,
                    Learner.status,
                    Learner.node,
                    Learner.gpu_ids,
                    Learner.last_heartbeat,
                    Learner.gpu_util,
                    Learner.gpu_memory_mb,
                )
                .join(Learner, and_(Learner.job_id == Job.id, Learner.attempt == Job.attempt))
                .where(Job.status.in_(holding))
            )
            jobs = select(
                Job.id,
                Job.tenant_id,
                Job.status,
                Job.placement,
                Job.gpus,
                Job.progress,
                Job.gpu_idle_flagged_at,
            ).where(Job.status.in_(holding))
            if self._tenant is not None:
                counts = counts.where(Job.tenant_id == self._tenant)
                learners = learners.where(Job.tenant_id == self._tenant)
                jobs = jobs.where(Job.tenant_id == self._tenant)
            return _Snapshot(
                jobs=[(row[0], row[1], int(row[2])) for row in session.execute(counts)],
                learners=list(session.execute(learners)),
                holding=list(session.execute(jobs)),
            )

    def _job_counts(self, snapshot: _Snapshot) -> Iterator[Metric]:
        by_status = GaugeMetricFamily(
            "ffdl_jobs", "Jobs in the store, by tenant and status.", labels=["tenant", "status"]
        )
        queued = GaugeMetricFamily(
            "ffdl_queue_length", "Jobs waiting QUEUED, per tenant.", labels=["tenant"]
        )
        queue_by_tenant: Tally[str] = Tally()
        for tenant, status, count in snapshot.jobs:
            by_status.add_metric([tenant, status], count)
            if status == JobStatus.QUEUED.value:
                queue_by_tenant[tenant] += count
            else:
                queue_by_tenant[tenant] += 0
        for tenant, count in sorted(queue_by_tenant.items()):
            queued.add_metric([tenant], count)
        yield by_status
        yield queued

    def _learner_series(self, snapshot: _Snapshot) -> Iterator[Metric]:
        now = utcnow()
        learners = GaugeMetricFamily(
            "ffdl_learners",
            "Current learners of the jobs that hold resources, by tenant and status.",
            labels=["tenant", "status"],
        )
        age = GaugeMetricFamily(
            "ffdl_learner_heartbeat_age_seconds",
            "Seconds since each current learner's last report.",
            labels=["tenant", "job", "learner"],
        )
        util = GaugeMetricFamily(
            "ffdl_learner_gpu_utilization_ratio",
            "Each learner's GPUs at their latest sample: mean utilisation, 0 to 1.",
            labels=["tenant", "job", "learner", "node"],
        )
        memory = GaugeMetricFamily(
            "ffdl_learner_gpu_memory_used_bytes",
            "Each learner's GPU memory in use at its latest sample.",
            labels=["tenant", "job", "learner", "node"],
        )
        tally: Tally[tuple[str, str]] = Tally()
        for row in snapshot.learners:
            job_id, tenant, index, status, node = row[0], row[1], str(row[2]), row[3], row[4]
            tally[(tenant, status)] += 1
            if row.last_heartbeat is not None:
                seconds = max((now - row.last_heartbeat).total_seconds(), 0.0)
                age.add_metric([tenant, job_id, index], seconds)
            if row.gpu_util is not None:
                util.add_metric([tenant, job_id, index, node], row.gpu_util / 100.0)
            if row.gpu_memory_mb is not None:
                memory.add_metric([tenant, job_id, index, node], row.gpu_memory_mb * _MIB)
        for (tenant, status), count in sorted(tally.items()):
            learners.add_metric([tenant, status], count)
        yield from (learners, age, util, memory)

    def _job_series(self, snapshot: _Snapshot) -> Iterator[Metric]:
        idle = GaugeMetricFamily(
            "ffdl_job_gpus_idle",
            "1 for each job flagged for holding GPUs it leaves idle (only those are listed).",
            labels=["tenant", "job"],
        )
        progress = GaugeMetricFamily(
            "ffdl_job_progress_ratio",
            "How far a running job has come against the total it declared, 0 to 1.",
            labels=["tenant", "job"],
        )
        remaining = GaugeMetricFamily(
            "ffdl_job_remaining_seconds",
            "A running job's estimated time left.",
            labels=["tenant", "job"],
        )
        throughput = GaugeMetricFamily(
            "ffdl_job_samples_per_second",
            "A running job's recent training throughput, from the samples it reports.",
            labels=["tenant", "job"],
        )
        gpus = GaugeMetricFamily(
            "ffdl_job_gpus",
            "GPUs a job holds now (all its learners).",
            labels=["tenant", "job"],
        )
        now = time.time()
        for row in snapshot.holding:
            labels = [row.tenant_id, row.id]
            gpus.add_metric(labels, row.gpus * len(row.placement or []))
            if row.gpu_idle_flagged_at is not None:
                idle.add_metric(labels, 1.0)
            state = row.progress or {}
            if state.get("fraction") is not None:
                progress.add_metric(labels, float(state["fraction"]))
            left = remaining_now(state, now)
            if left is not None:
                remaining.add_metric(labels, left)
            if state.get("samples_rate") is not None:
                throughput.add_metric(labels, float(state["samples_rate"]))
        yield from (gpus, idle, progress, remaining, throughput)

    def _node_series(self, snapshot: _Snapshot) -> Iterator[Metric]:
        # The backend may be remote (Ray): asked after the read transaction has ended.
        nodes = effective_nodes(self._platform)
        held: Tally[str] = Tally()
        working: dict[str, float] = {}
        for row in snapshot.learners:
            gpu_count = len(row.gpu_ids or [])
            held[row.node] += gpu_count
            if row.gpu_util is not None:
                working[row.node] = working.get(row.node, 0.0) + row.gpu_util / 100.0 * gpu_count
        yield from _type_totals(nodes, held, working)
        if len(nodes) > self._platform.settings.metrics_node_series_max:
            return
        rows = [(n.name, n.gpus, held[n.name], working.get(n.name, 0.0)) for n in nodes]
        yield from _gpu_series("ffdl_node_gpus", "node", "of a node", rows)


def _type_totals(
    nodes: list[Node], held: Tally[str], working: dict[str, float]
) -> Iterator[Metric]:
    """The nodes and their GPUs added up per GPU type: a few series however large the
    cluster (the per-node ones stop at ``metrics_node_series_max`` nodes)."""
    count = GaugeMetricFamily("ffdl_nodes", "Nodes, by GPU type.", labels=["gpu_type"])
    sums: dict[str, list[float]] = {}
    for node in nodes:
        of_type = sums.setdefault(node.gpu_type or "none", [0.0, 0.0, 0.0, 0.0])
        of_type[0] += 1
        of_type[1] += node.gpus
        of_type[2] += held[node.name]
        of_type[3] += working.get(node.name, 0.0)
    rows = []
    for gpu_type, (node_count, gpus, held_gpus, busy_gpus) in sorted(sums.items()):
        count.add_metric([gpu_type], node_count)
        rows.append((gpu_type, gpus, held_gpus, busy_gpus))
    yield count
    yield from _gpu_series("ffdl_gpus", "gpu_type", "of a GPU type", rows)


def _gpu_series(
    name: str, label: str, whose: str, rows: Sequence[tuple[str, float, float, float]]
) -> Iterator[Metric]:
    """GPUs offered, held by learners and really busy (their latest utilisation summed, in
    GPUs), one sample per ``(label value, offered, held, busy)`` row."""
    total = GaugeMetricFamily(name, f"GPUs {whose} offered.", labels=[label])
    allocated = GaugeMetricFamily(
        f"{name}_allocated", f"GPUs {whose} held by learners.", labels=[label]
    )
    busy = GaugeMetricFamily(
        f"{name}_busy",
        f"GPUs {whose} really busy: its learners' latest utilisation summed, in GPUs.",
        labels=[label],
    )
    for value, offered, held_gpus, busy_gpus in rows:
        total.add_metric([value], offered)
        allocated.add_metric([value], held_gpus)
        busy.add_metric([value], busy_gpus)
    yield from (total, allocated, busy)
