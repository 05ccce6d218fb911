"""``ffdl top``: a live view of the cluster: nodes, running jobs with their progress and
time left, and the head of the queue. Redrawn every ``--interval`` seconds until Ctrl-C;
``--once`` prints one frame (for scripts and terminals that cannot redraw)."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from ffdl.cli.cluster_render import in_use_text, node_name, rho_text, tenants_table
from ffdl.cli.context import client_of
from ffdl.cli.render import TIMES, duration_text
from ffdl.client.http import Client

QUEUE_HEAD = 10
BAR_WIDTH = 16


def frame(client: Client) -> RenderableType:
    """One picture of the cluster as the API answers now."""
    nodes = client.nodes().get("nodes") or []
    running = client.list_models(status="PROCESSING", limit=50).get("models") or []
    body = client.queue()
    queue = (body.get("queue") or [])[:QUEUE_HEAD]
    stamp = datetime.now().astimezone().strftime("%H:%M:%S")
    parts: list[RenderableType] = [
        Text(f"ffdl top  {stamp}  (Ctrl-C quits)", style="bold"),
        nodes_table(nodes),
        running_table(running),
        queue_table(queue),
    ]
    if body.get("tenants"):
        parts.append(tenants_table(body["tenants"]))
    return Group(*parts)


def nodes_table(nodes: list[dict[str, Any]]) -> Table:
    table = Table(title="Nodes", title_justify="left")
    table.add_column("node", no_wrap=True)
    table.add_column("in use", justify="right", no_wrap=True)
    table.add_column("busy", justify="right")
    table.add_column("CPUs", justify="right")
    table.add_column("type", overflow="fold")
    for node in nodes:
        used = node.get("used") or {}
        busy = node.get("gpus_busy")
        table.add_row(
            node_name(node),
            in_use_text(node),
            "-" if busy is None else f"{float(busy):.1f}",
            f"{float(used.get('cpus', 0)):g}/{float(node.get('cpus', 0)):g}",
            str(node.get("gpu_type") or ""),
        )
    return table


def running_table(models: list[dict[str, Any]]) -> Table:
    table = Table(title=f"Running ({len(models)})", title_justify="left")
    table.add_column("job", no_wrap=True)
    table.add_column("progress", no_wrap=True, width=BAR_WIDTH)
    table.add_column("done", justify="right", no_wrap=True)
    table.add_column("left", justify="right")
    table.add_column(f"L{TIMES}G", justify="right")
    table.add_column("rho", justify="right", no_wrap=True)
    table.add_column("name", overflow="fold")
    for model in models:
        progress = model.get("progress") or {}
        fraction = progress.get("fraction")
        bar: RenderableType = (
            ProgressBar(total=1.0, completed=float(fraction), width=BAR_WIDTH)
            if isinstance(fraction, int | float)
            else Text("no total declared" if progress else "-", style="dim")
        )
        training = model.get("training") or {}
        table.add_row(
            str(model.get("model_id")),
            bar,
            f"{fraction:.0%}" if isinstance(fraction, int | float) else "-",
            duration_text(progress.get("remaining_s")),
            f"{training.get('learners')}{TIMES}{training.get('gpus')}",
            rho_text(model.get("rho")),
            str(model.get("name") or ""),
        )
    return table


def queue_table(entries: list[dict[str, Any]]) -> Table:
    table = Table(title="Queue (head)", title_justify="left")
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("job", no_wrap=True)
    table.add_column("ETA", justify="right")
    table.add_column(f"L{TIMES}G", justify="right")
    table.add_column("waiting for", overflow="fold")
    for entry in entries:
        table.add_row(
            str(entry.get("position") or "-"),
            str(entry.get("model_id")),
            duration_text(entry.get("eta_s")) if entry.get("eta_s") is not None else "?",
            f"{entry.get('learners')}{TIMES}{entry.get('gpus')}",
            str(entry.get("reason") or ""),
        )
    return table


def top_command(
    ctx: typer.Context,
    interval: Annotated[float, typer.Option(min=0.5, help="Seconds between redraws.")] = 2.0,
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit.")] = False,
) -> None:
    """A live view of the cluster: GPUs busy and allocated, running jobs, the queue."""
    console = Console(highlight=False)
    with client_of(ctx) as client:
        if once:
            console.print(frame(client))
            return
        try:
            with Live(frame(client), console=console, screen=False, auto_refresh=False) as live:
                while True:
                    time.sleep(interval)
                    live.update(frame(client), refresh=True)
        except KeyboardInterrupt:
            pass
