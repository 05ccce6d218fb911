"""The ``ffdl`` command line: FfDL's verbs over the HTTP API, plus ``up`` and ``demo``.

Commands reach the server through ``CliContext.client()``; tests pass their own
``CliContext(client_factory=...)`` as the Typer context object to run every command against a
fake transport. ``FfdlGroup`` turns any ``FfdlError`` into one red line and exit code 1.
"""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text
from typer.core import TyperGroup

from ffdl.cli.cluster import (
    drain_command,
    nodes_command,
    queue_command,
    tenant_app,
    undrain_command,
)
from ffdl.cli.context import CliContext, ClientFactory, client_of, state_of
from ffdl.cli.demo import demo_command
from ffdl.cli.render import error_text, log_text, model_panel, models_table, status_change_text
from ffdl.cli.simulate import simulate_command
from ffdl.cli.tokens import audit_command, token_app
from ffdl.client.config import ConfigError
from ffdl.client.http import ApiError, Client
from ffdl.client.settings import ClientSettings
from ffdl.core.errors import FfdlError

LOG_PAGE_SIZE = 500

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


class FfdlGroup(TyperGroup):
    """The root command group: reports ffdl errors as one line instead of a traceback."""

    def invoke(self, ctx: typer.Context) -> Any:  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except FfdlError as exc:
            err_console.print(error_text(exc.code, exc.message), soft_wrap=True)
            raise typer.Exit(1) from None
        except OSError as exc:
            err_console.print(error_text("IO", str(exc)), soft_wrap=True)
            raise typer.Exit(1) from None


app = typer.Typer(
    cls=FfdlGroup,
    name="ffdl",
    help="Fabric for Deep Learning: submit, watch and manage training jobs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    ctx: typer.Context,
    url: Annotated[
        str | None, typer.Option("--url", help="API server URL (default: from FFDL_URL/config).")
    ] = None,
    token: Annotated[
        str | None, typer.Option("--token", help="API token (default: from FFDL_TOKEN/config).")
    ] = None,
) -> None:
    state = state_of(ctx)
    state.url = url or state.url
    state.token = token or state.token


ModelId = Annotated[str, typer.Argument(metavar="ID", help="Model ID (training-...).")]


def _model_status(model: dict[str, Any]) -> str:
    training = model.get("training") or {}
    status = (training.get("training_status") or {}).get("status")
    return str(status or "UNKNOWN")


def _follow(client: Client, model_id: str, *, show_status: bool) -> str:
    """Print the job's log lines (and status changes) until it ends; its final status."""
    for event in client.follow(model_id):
        if event.kind == "log":
            typer.echo(str(event.data.get("line", "")))
        elif event.kind == "status" and show_status:
            console.print(status_change_text(event.data), soft_wrap=True)
        elif event.kind == "end":
            return str(event.data.get("status") or "UNKNOWN")
    return "UNKNOWN"


@app.command()
def up(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
    home: Annotated[
        Path | None, typer.Option(help="Platform home (default: FFDL_HOME or ~/.ffdl).")
    ] = None,
    no_sandbox: Annotated[
        bool,
        typer.Option(
            "--no-sandbox",
            help="Run learners without the bubblewrap sandbox: any job can then reach "
            "the platform's files and other jobs. For trusted single-user machines only.",
        ),
    ] = False,
) -> None:
    """Start the ffdl platform (API server, scheduler, dashboard) in the foreground."""
    # The server stack is heavy; only `up` pays for importing it.
    from ffdl.server.main import serve

    serve(
        home=(home or ClientSettings().home).expanduser(),
        host=host,
        port=port,
        sandbox=False if no_sandbox else None,
    )


@app.command()
def train(
    ctx: typer.Context,
    manifest: Annotated[Path, typer.Argument(help="FfDL manifest (manifest.yml).")],
    code: Annotated[
        Path, typer.Argument(metavar="DIR|ZIP", help="Model code: a directory or a .zip.")
    ],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Stream logs and status until the job ends.")
    ] = False,
) -> None:
    """Submit a training job (retried with the same idempotency key if the server is away,
    so a retry never makes a second job)."""

    def retrying(error: ApiError, delay: float) -> None:
        err_console.print(
            Text(f"{error.message}; retrying in {delay:g} s", style="yellow"), soft_wrap=True
        )

    with client_of(ctx) as client:
        created = client.submit(manifest, code, on_retry=retrying)
        model_id = str(created.get("model_id"))
        for warning in created.get("warnings") or []:
            err_console.print(Text(f"Warning: {warning}", style="yellow"), soft_wrap=True)
        typer.echo(f"Model ID: {model_id}")
        if not follow:
            return
        final = _follow(client, model_id, show_status=True)
    console.print(status_change_text({"status": final, "reason": "job ended"}), soft_wrap=True)
    if final == "FAILED":
        raise typer.Exit(1)


@app.command("list")
def list_models(
    ctx: typer.Context,
    status: Annotated[str | None, typer.Option(help="Only jobs in this status.")] = None,
    limit: Annotated[int, typer.Option(min=1)] = 100,
    offset: Annotated[int, typer.Option(min=0)] = 0,
) -> None:
    """List training jobs."""
    with client_of(ctx) as client:
        body = client.list_models(status=status, limit=limit, offset=offset)
    models = body.get("models") or []
    if not models:
        console.print("No models.")
        return
    total = body.get("total")
    console.print(models_table(models, total if isinstance(total, int) else None))


@app.command()
def show(
    ctx: typer.Context,
    model_id: ModelId,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw JSON.")] = False,
) -> None:
    """Show a job: status, reason, queue position, placement, events, results."""
    with client_of(ctx) as client:
        model = client.get_model(model_id)
    if as_json:
        typer.echo(json.dumps(model, indent=2))
    else:
        console.print(model_panel(model))


@app.command()
def logs(
    ctx: typer.Context,
    model_id: ModelId,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Follow until the end.")] = False,
) -> None:
    """Print a job's log lines."""
    with client_of(ctx) as client:
        if follow:
            final = _follow(client, model_id, show_status=False)
            err_console.print(status_change_text({"status": final}), soft_wrap=True)
            return
        pos = 0
        while True:
            page = client.loglines(model_id, pagesize=LOG_PAGE_SIZE, pos=pos)
            for item in page:
                typer.echo(log_text(item).plain)
            if len(page) < LOG_PAGE_SIZE:
                return
            pos += len(page)


SinceTime = Annotated[
    str | None, typer.Option("--since-time", help="ISO 8601 time or epoch milliseconds.")
]
PageSize = Annotated[int | None, typer.Option("--pagesize", help="Records per page.")]
Pos = Annotated[
    int | None, typer.Option("--pos", help="Offset from the start (>= 0) or the end (< 0).")
]


@app.command()
def loglines(
    ctx: typer.Context,
    model_id: ModelId,
    since_time: SinceTime = None,
    pagesize: PageSize = None,
    pos: Pos = None,
) -> None:
    """Print a job's log records as JSON, one per line."""
    with client_of(ctx) as client:
        lines = client.loglines(model_id, since_time=since_time, pagesize=pagesize, pos=pos)
    for item in lines:
        typer.echo(json.dumps(item))


@app.command()
def emetrics(
    ctx: typer.Context,
    model_id: ModelId,
    since_time: SinceTime = None,
    pagesize: PageSize = None,
    pos: Pos = None,
) -> None:
    """Print a job's evaluation metrics as JSON, one record per line."""
    with client_of(ctx) as client:
        records = client.emetrics(model_id, since_time=since_time, pagesize=pagesize, pos=pos)
    for record in records:
        typer.echo(json.dumps(record))


@app.command()
def halt(ctx: typer.Context, model_id: ModelId) -> None:
    """Halt a job; it keeps its place and can be resumed."""
    with client_of(ctx) as client:
        model = client.halt(model_id)
    typer.echo(f"{model_id}: {_model_status(model)}")


@app.command()
def resume(ctx: typer.Context, model_id: ModelId) -> None:
    """Resume a halted or failed job from its last checkpoint."""
    with client_of(ctx) as client:
        model = client.resume(model_id)
    typer.echo(f"{model_id}: {_model_status(model)}")


@app.command()
def priority(
    ctx: typer.Context,
    model_id: ModelId,
    value: Annotated[int, typer.Argument(metavar="N", help="New priority.")],
) -> None:
    """Change a job's priority."""
    with client_of(ctx) as client:
        model = client.set_priority(model_id, value)
    typer.echo(f"{model_id}: priority {model.get('priority', value)}")


@app.command()
def scale(
    ctx: typer.Context,
    model_id: ModelId,
    gpus: Annotated[
        int, typer.Option("--gpus", min=1, help="Total GPUs for the job, within elastic.gpus.")
    ],
) -> None:
    """Rescale a running job to a new number of GPUs."""
    with client_of(ctx) as client:
        model = client.scale(model_id, gpus)
    typer.echo(f"{model_id}: {_model_status(model)}")


@app.command()
def delete(ctx: typer.Context, model_id: ModelId) -> None:
    """Cancel a live job, or remove a finished job's record."""
    with client_of(ctx) as client:
        body = client.delete(model_id)
    if body.get("deleted"):
        typer.echo(f"Deleted {model_id}")
    else:
        typer.echo(
            f"Cancelled {model_id} (status {body.get('status')}); "
            "delete it again once it has stopped to remove its record"
        )


@app.command()
def download(
    ctx: typer.Context,
    model_id: ModelId,
    trained_model: Annotated[
        bool, typer.Option("--trained-model", help="The trained model (results).")
    ] = False,
    definition: Annotated[
        bool, typer.Option("--definition", help="The submitted model definition.")
    ] = False,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="File to write.")] = None,
) -> None:
    """Download a job's trained model or its model definition as a zip."""
    if trained_model == definition:
        raise typer.BadParameter("give exactly one of --trained-model or --definition")
    kind = "trained-model" if trained_model else "definition"
    dest = output or Path(f"{model_id}-{kind}.zip")
    with client_of(ctx) as client:
        if trained_model:
            client.download_trained_model(model_id, dest)
        else:
            client.download_definition(model_id, dest)
    typer.echo(f"Saved {kind} of {model_id} to {dest}")


def _client_version() -> str:
    try:
        return package_version("ffdl")
    except PackageNotFoundError:
        return "unknown"


@app.command()
def version(ctx: typer.Context) -> None:
    """Print the client version, and the server's when one is configured."""
    typer.echo(f"ffdl {_client_version()}")
    try:
        with client_of(ctx) as client:
            health = client.health()
        typer.echo(f"server {health.get('version', 'unknown')} at {client.url}")
    except ConfigError:
        return
    except ApiError as exc:
        err_console.print(Text(f"server: {exc.message}", style="yellow"), soft_wrap=True)


app.command("demo")(demo_command)
app.command("nodes")(nodes_command)
app.command("queue")(queue_command)
app.command("simulate")(simulate_command)
app.command("drain")(drain_command)
app.command("undrain")(undrain_command)
app.command("audit")(audit_command)
app.add_typer(tenant_app, name="tenant")
app.add_typer(token_app, name="token")

__all__ = ["CliContext", "ClientFactory", "app", "main"]


def main() -> None:
    app(prog_name="ffdl")


if __name__ == "__main__":
    main()
