"""``ffdl nodes``, ``ffdl queue`` and ``ffdl tenant ...``: the cluster, the queue, tenants."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ffdl.cli.cluster_render import (
    holders_table,
    loops_table,
    nodes_table,
    queue_table,
    replicas_table,
    tenants_table,
)
from ffdl.cli.context import client_of

console = Console(highlight=False)
tenant_app = typer.Typer(help="Tenants, quotas and users (admins only).", no_args_is_help=True)


def nodes_command(ctx: typer.Context) -> None:
    """Show each node's capacity and use, its labels, and who holds what on it."""
    with client_of(ctx) as client:
        nodes = client.nodes().get("nodes") or []
    console.print(nodes_table(nodes))
    holders = holders_table(nodes)
    if holders is not None:
        console.print(holders)


def drain_command(
    ctx: typer.Context,
    node: Annotated[str, typer.Argument(help="Node name (see `ffdl nodes`).")],
    reason: Annotated[str, typer.Option(help="Why, shown to users.")] = "maintenance",
) -> None:
    """Take a node out of service: no new work, its jobs are moved or shrunk, not killed."""
    with client_of(ctx) as client:
        result = client.drain(node, reason)
    typer.echo(drain_message(node, result))


def drain_message(node: str, result: dict[str, Any]) -> str:
    """What a drain does to the work on ``node``, as the server counted it."""
    jobs, others = int(result.get("jobs") or 0), int(result.get("nodes_in_service") or 0)
    back = f"`ffdl undrain {node}` to return it"
    if jobs == 0:
        return f"Drained {node}: no job runs there, and it takes no new work; {back}"
    some = f"its {jobs} job{'s' if jobs > 1 else ''}"
    if others == 0:
        verbs = (
            "halts with a checkpoint and waits" if jobs == 1 else "halt with a checkpoint and wait"
        )
        return (
            f"Draining {node}: no other node is in service, so {some} {verbs} in the queue "
            f"until it returns; {back}"
        )
    return (
        f"Draining {node}: {some} move to the {others} other node"
        f"{'s' if others > 1 else ''} in service or shrink, and wait in the queue where "
        f"no node has room; {back}"
    )


def undrain_command(
    ctx: typer.Context, node: Annotated[str, typer.Argument(help="Node name.")]
) -> None:
    """Return a drained node to service."""
    with client_of(ctx) as client:
        client.undrain(node)
    typer.echo(f"{node} is back in service")


def queue_command(ctx: typer.Context) -> None:
    """Show queued jobs: position, ETA and what each one waits for."""
    with client_of(ctx) as client:
        body = client.queue()
    entries = body.get("queue") or []
    if not entries:
        console.print("The queue is empty.")
    else:
        console.print(queue_table(entries, console.width))
    if body.get("tenants"):
        console.print(tenants_table(body["tenants"]))


def status_command(ctx: typer.Context) -> None:
    """Show the control plane: its replicas and which one runs each background loop."""
    with client_of(ctx) as client:
        body = client.replicas()
        limits = client.health().get("learner_limits") or {}
    console.print(replicas_table(body, console.width))
    console.print(loops_table(body))
    if limits:
        console.print(
            Text(f"Learner limits ({limits.get('memory')}): {limits.get('detail', '')}"),
            soft_wrap=True,
        )


MaxGpus = Annotated[int | None, typer.Option("--max-gpus", help="GPU quota (-1: no limit).")]
MaxJobs = Annotated[
    int | None, typer.Option("--max-jobs", help="Running-jobs quota (-1: no limit).")
]


@tenant_app.command("list")
def tenant_list(ctx: typer.Context) -> None:
    """List tenants and their quotas."""
    with client_of(ctx) as client:
        body = client.tenants()
    table = Table(title="Tenants")
    for column in ("tenant", "name", "max GPUs", "max running jobs"):
        table.add_column(column)
    for tenant in body.get("tenants") or []:
        table.add_row(
            tenant["id"],
            tenant.get("name", ""),
            str(tenant.get("max_gpus") if tenant.get("max_gpus") is not None else "-"),
            str(
                tenant.get("max_running_jobs")
                if tenant.get("max_running_jobs") is not None
                else "-"
            ),
        )
    console.print(table)


@tenant_app.command("create")
def tenant_create(
    ctx: typer.Context, tenant_id: str, max_gpus: MaxGpus = None, max_jobs: MaxJobs = None
) -> None:
    """Create a tenant, optionally with quotas."""
    with client_of(ctx) as client:
        tenant = client.create_tenant(tenant_id, max_gpus=max_gpus, max_running_jobs=max_jobs)
    typer.echo(f"Created tenant {tenant['id']}")


@tenant_app.command("quota")
def tenant_quota(
    ctx: typer.Context, tenant_id: str, max_gpus: MaxGpus = None, max_jobs: MaxJobs = None
) -> None:
    """Set a tenant's quotas."""
    with client_of(ctx) as client:
        tenant = client.set_quota(tenant_id, max_gpus=max_gpus, max_running_jobs=max_jobs)
    typer.echo(
        f"{tenant['id']}: max GPUs {tenant.get('max_gpus')}, "
        f"max running jobs {tenant.get('max_running_jobs')}"
    )


@tenant_app.command("add-user")
def tenant_add_user(
    ctx: typer.Context,
    tenant_id: str,
    name: str,
    admin: Annotated[bool, typer.Option("--admin", help="Give the user the admin role.")] = False,
) -> None:
    """Add a user to a tenant and print its token (shown only once)."""
    with client_of(ctx) as client:
        user = client.create_user(tenant_id, name, role="admin" if admin else "member")
    typer.echo(f"Created user {user['user']} ({user['role']})")
    typer.echo(f"Token: {user['token']}")
