"""The tables of ``ffdl nodes``, ``ffdl queue`` and ``ffdl status``, made to be read in a
terminal 80 columns wide: no vertical rules, ids and numbers never split across lines (what
gives way is free text, which wraps between words), memory in GiB, and a node's "GPUs"
called CPU slots where the host has no GPUs.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table

from ffdl.cli.render import TIMES, short_time
from ffdl.core.resources import slot_noun

# Below this width, the queue leaves out the tenant column and status the replicas' versions.
WIDE = 100
MIB_PER_GIB = 1024


def _table(title: str) -> Table:
    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)


def memory_text(used_mb: Any, total_mb: Any) -> str:
    """``3.7/23.5 GiB`` (``512/2048 MiB`` below a GiB)."""
    used, total = float(used_mb or 0), float(total_mb or 0)
    if total < MIB_PER_GIB:
        return f"{used:g}/{total:g} MiB"
    return f"{used / MIB_PER_GIB:.1f}/{total / MIB_PER_GIB:.1f} GiB"


def in_use_text(node: dict[str, Any]) -> str:
    """``1/8 GPUs`` or ``2/2 CPU slots``: the node's GPUs (or slots) held by learners."""
    total = int(node.get("gpus") or 0)
    used = (node.get("used") or {}).get("gpus", 0)
    return f"{used}/{total} {slot_noun(node.get('gpu_type'), total)}"


def node_name(node: dict[str, Any]) -> str:
    return str(node.get("name")) + ("" if node.get("schedulable", True) else " (drained)")


def nodes_table(nodes: list[dict[str, Any]]) -> Table:
    table = _table("Nodes")
    table.add_column("node", no_wrap=True)
    table.add_column("type", no_wrap=True)
    table.add_column("in use", no_wrap=True)
    table.add_column("busy", justify="right", no_wrap=True)
    table.add_column("CPUs", justify="right", no_wrap=True)
    table.add_column("memory", justify="right", no_wrap=True)
    table.add_column("labels")
    for node in nodes:
        used = node.get("used") or {}
        busy = node.get("gpus_busy")
        table.add_row(
            node_name(node),
            str(node.get("gpu_type") or ""),
            in_use_text(node),
            "-" if busy is None else f"{float(busy):.1f}",
            f"{float(used.get('cpus', 0)):g}/{float(node.get('cpus') or 0):g}",
            memory_text(used.get("memory", 0), node.get("memory")),
            ", ".join(f"{k}={v}" for k, v in (node.get("labels") or {}).items()),
        )
    return table


def holders_table(nodes: list[dict[str, Any]]) -> Table | None:
    """Who holds what on each node: every learner placed there, whether it holds GPUs (or
    CPU slots) or CPUs only; None when nothing is held."""
    table = _table("Held by")
    table.add_column("node", no_wrap=True)
    table.add_column("holds", no_wrap=True)
    table.add_column("job", no_wrap=True)
    table.add_column("learner", justify="right", no_wrap=True)
    table.add_column("status", no_wrap=True)
    rows = 0
    for node in nodes:
        for holder in node.get("holders") or []:
            ids = holder.get("gpu_ids") or []
            holds = f"{slot_noun(node.get('gpu_type'), len(ids))} {','.join(map(str, ids))}"
            table.add_row(
                str(node.get("name")),
                holds if ids else "CPUs only",
                # Another tenant's allocation comes without its job: only that it is in use.
                str(holder.get("model_id") or "another tenant's job"),
                str(holder.get("learner") or "-"),
                str(holder.get("status") or ""),
            )
            rows += 1
    return table if rows else None


def queue_table(entries: list[dict[str, Any]], width: int) -> Table:
    table = _table("Queue")
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("job", no_wrap=True)
    if width >= WIDE:
        table.add_column("tenant", no_wrap=True)
    table.add_column("prio", justify="right", no_wrap=True)
    table.add_column(f"L{TIMES}G", justify="right", no_wrap=True)
    table.add_column("ETA", no_wrap=True)
    if width >= WIDE:
        table.add_column("rho", justify="right", no_wrap=True)
    table.add_column("waiting for", ratio=1)
    for entry in entries:
        cells = [str(entry.get("position") or "-"), str(entry["model_id"])]
        if width >= WIDE:
            cells.append(str(entry.get("tenant", "")))
        cells += [
            str(entry.get("priority", "")),
            f"{entry.get('learners')}{TIMES}{entry.get('gpus')}",
            str(entry.get("eta") or "unknown"),
        ]
        if width >= WIDE:
            cells.append(rho_text(entry.get("rho")))
        cells.append(str(entry.get("reason", "")))
        table.add_row(*cells)
    return table


def tenants_table(rows: list[dict[str, Any]]) -> Table:
    """Each tenant's GPUs against those it is entitled to (``GET /v1/queue``'s tenants)."""
    table = _table("Tenants")
    table.add_column("tenant", no_wrap=True)
    table.add_column("GPUs", justify="right", no_wrap=True)
    table.add_column("entitled", justify="right", no_wrap=True)
    table.add_column("share", justify="right", no_wrap=True)
    for row in rows:
        share = row.get("share")
        table.add_row(
            str(row.get("tenant", "")),
            str(row.get("gpus", 0)),
            f"{float(row.get('entitled_gpus') or 0):g}",
            "-" if share is None else f"{float(share):.2f}{TIMES}",
        )
    table.caption = "share: GPUs held over those entitled (quota-weighted among active tenants)"
    return table


def rho_text(rho: object) -> str:
    """A job's finish-time fairness for a table: ``1.4`` (above 1: behind an equal share)."""
    return f"{float(rho):.2f}" if isinstance(rho, int | float) else "-"


def replicas_table(body: dict[str, Any], width: int) -> Table:
    this = body.get("this_replica")
    table = _table("Replicas")
    table.add_column("replica", no_wrap=True)
    table.add_column("url", no_wrap=True)
    if width >= WIDE:
        table.add_column("version", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("seen", no_wrap=True)
    for replica in body.get("replicas") or []:
        name = str(replica["id"]) + (" *" if replica["id"] == this else "")
        cells = [name, str(replica.get("url", ""))]
        if width >= WIDE:
            cells.append(str(replica.get("version", "")))
        state = "up" if replica.get("alive") else "gone"
        if replica.get("runs_loops") is False:
            state += ", API only"
        cells += [state, short_time(replica.get("seen_at"))]
        table.add_row(*cells)
    table.caption = "* answered this request; the loops each runs are below"
    return table


def loops_table(body: dict[str, Any]) -> Table:
    table = _table("Loops")
    table.add_column("loop", no_wrap=True)
    table.add_column("run by", no_wrap=True)
    table.add_column("fencing token", justify="right", no_wrap=True)
    for lease in body.get("leases") or []:
        table.add_row(lease["name"], str(lease.get("holder") or "nobody"), str(lease["token"]))
    return table
