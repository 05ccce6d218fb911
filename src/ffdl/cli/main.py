"""The ``ffdl`` command line: FfDL's verbs over the HTTP API, plus ``up`` and ``demo``.

FfDL's verbs keep FfDL's flags and, where scripts parse them, FfDL's lines on stdout
(``train``: ``Deploying ...``, ``Model ID: <id>``, ``OK``); what ffdl adds (warnings, retry
notices, status) goes to stderr, after those lines. ``-h`` works as ``--help`` everywhere.

Commands reach the server through ``CliContext.client()``; tests pass their own
``CliContext(client_factory=...)`` as the Typer context object to run every command against a
fake transport. ``FfdlGroup`` turns any ``FfdlError`` into one red line and exit code 1.
"""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.console import Console
from rich.text import Text
from typer.core import TyperGroup

from ffdl.cli.cluster import (
    drain_command,
    nodes_command,
    queue_command,
    status_command,
    tenant_app,
    undrain_command,
)
from ffdl.cli.context import CliContext, ClientFactory, client_of, state_of
from ffdl.cli.db import db_app
from ffdl.cli.demo import demo_command
from ffdl.cli.init_template import init_command
from ffdl.cli.records import emetrics_command, follow_lines, loglines_command, logs_command
from ffdl.cli.render import error_text, model_panel, models_table
from ffdl.cli.simulate import simulate_command
from ffdl.cli.tokens import audit_command, token_app
from ffdl.cli.top import top_command
from ffdl.cli.users import user_app
from ffdl.client.config import ConfigError
from ffdl.client.http import ApiError, Client
from ffdl.client.settings import ClientSettings
from ffdl.core.errors import FfdlError

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
    # Click hands these down to every subcommand and sub-group.
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _client_version() -> str:
    try:
        return package_version("ffdl")
    except PackageNotFoundError:
        return "unknown"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"ffdl {_client_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    url: Annotated[
        str | None, typer.Option("--url", help="API server URL (default: from FFDL_URL/config).")
    ] = None,
    token: Annotated[
        str | None, typer.Option("--token", help="API token (default: from FFDL_TOKEN/config).")
    ] = None,
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the client version."
        ),
    ] = False,
) -> None:
    state = state_of(ctx)
    state.url = url or state.url
    state.token = token or state.token


ModelId = Annotated[str, typer.Argument(metavar="ID", help="Model ID (training-...).")]


def _model_status(model: dict[str, Any]) -> str:
    training = model.get("training") or {}
    status = (training.get("training_status") or {}).get("status")
    return str(status or "UNKNOWN")


def _check_workers(value: str | None) -> str | None:
    """``--workers``: MIN..MAX or N, refused with the reason before anything starts."""
    from ffdl.server.pool.policy import parse_workers

    if value is None:
        return None
    try:
        parse_workers(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc).removeprefix("workers: ")) from None
    return value


@app.command()
def up(
    host: Annotated[
        str | None,
        typer.Option(help="Interface to listen on. Default: FFDL_HOST, config.yaml, or 127.0.0.1."),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(help="Port to listen on. Default: FFDL_PORT, config.yaml, or 8080."),
    ] = None,
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
    backend: Annotated[
        Literal["local", "ray"] | None,
        typer.Option(
            help="Where learners run: 'local' (this host) or 'ray' (the machines of a Ray "
            "cluster; needs --ray-address). Default: FFDL_BACKEND, config.yaml, or local.",
        ),
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray-address",
            metavar="ADDRESS",
            help="The Ray cluster's GCS address HOST:PORT (as 'ray start --head' prints it).",
        ),
    ] = None,
    advertise_url: Annotated[
        str | None,
        typer.Option(
            "--advertise-url",
            metavar="URL",
            help="The API address learners report to, reachable from every node "
            "(default: http(s)://HOST:PORT of this server).",
        ),
    ] = None,
    workers: Annotated[
        str | None,
        typer.Option(
            "--workers",
            metavar="MIN..MAX",
            callback=_check_workers,
            help="Serve the API from a pool of MIN..MAX worker processes that grows and "
            "shrinks with the load (N: a fixed pool of N). Default: FFDL_WORKERS, "
            "config.yaml, or one process. See GET /v1/cluster/pool.",
        ),
    ] = None,
    cgroup_parent: Annotated[
        str | None,
        typer.Option(
            "--cgroup-parent",
            metavar="CGROUP",
            help="Make learners' cgroups under this cgroup (v2: a path below "
            "/sys/fs/cgroup such as /ffdl.slice; it must exist and have the memory "
            "controller). Default: FFDL_CGROUP_PARENT, config.yaml, or found on the host.",
        ),
    ] = None,
    tls_cert: Annotated[
        Path | None,
        typer.Option(
            "--tls-cert",
            metavar="FILE",
            help="Serve HTTPS with this certificate (PEM: the server's, then its chain); "
            "needs --tls-key. Default: FFDL_TLS_CERT or config.yaml's tls_cert.",
        ),
    ] = None,
    tls_key: Annotated[
        Path | None,
        typer.Option("--tls-key", metavar="FILE", help="The certificate's private key (PEM)."),
    ] = None,
    ca_bundle: Annotated[
        Path | None,
        typer.Option(
            "--ca-bundle",
            metavar="FILE",
            help="The CA that signed the certificate, when the system's trust store lacks it: "
            "learners verify the server with it, and client.json names it for the CLI. "
            "Default: FFDL_CA_BUNDLE or config.yaml's ca_bundle.",
        ),
    ] = None,
    api_only: Annotated[
        bool,
        typer.Option(
            "--api-only",
            help="Serve the API only and run none of the background loops (scheduler, "
            "LCM, ...): other replicas on the same PostgreSQL database run them. "
            "Default: FFDL_RUN_LOOPS or config.yaml's run_loops.",
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
        backend=backend,
        ray_address=ray_address,
        advertise_url=advertise_url,
        workers=workers,
        cgroup_parent=cgroup_parent,
        tls_cert=tls_cert,
        tls_key=tls_key,
        ca_bundle=ca_bundle,
        api_only=api_only,
    )


def deploying_line(manifest: Path, code: Path) -> str:
    """FfDL's first line of ``train``, naming the manifest and the model code."""
    if code.is_dir():
        return f"Deploying model with manifest '{manifest.name}' and model files in '{code}'..."
    return f"Deploying model with manifest '{manifest.name}' and model file '{code}'..."


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
    so a retry never makes a second job).

    Prints FfDL's lines on stdout (``Model ID: <id>`` then ``OK``); warnings follow on stderr.
    """

    def retrying(error: ApiError, delay: float) -> None:
        err_console.print(
            Text(f"{error.message}; retrying in {delay:g} s", style="yellow"), soft_wrap=True
        )

    with client_of(ctx) as client:
        typer.echo(deploying_line(manifest, code))
        created = client.submit(manifest, code, on_retry=retrying)
        model_id = str(created.get("model_id"))
        # FfDL's scripts take the third field of the "Model ID" line, and notebooks the
        # second line of the output: these lines come first, alone, on stdout.
        typer.echo(f"Model ID: {model_id}")
        typer.echo("OK")
        for warning in created.get("warnings") or []:
            err_console.print(Text(f"Warning: {warning}", style="yellow"), soft_wrap=True)
        if not follow:
            return
        final = follow_lines(client, model_id, on_status=True)
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
        # Which nodes are hosts without GPUs, whose "GPUs" the panel calls CPU slots.
        types = {} if as_json or not model.get("placement") else _node_types(client)
    if as_json:
        typer.echo(json.dumps(model, indent=2))
    else:
        console.print(model_panel(model, types))


def _node_types(client: Client) -> dict[str, str]:
    try:
        nodes = client.nodes().get("nodes") or []
    except ApiError:
        return {}
    return {str(node.get("name")): str(node.get("gpu_type") or "") for node in nodes}


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
def cancel(ctx: typer.Context, model_id: ModelId) -> None:
    """Stop a job for good and keep its record (delete removes it)."""
    with client_of(ctx) as client:
        model = client.cancel(model_id)
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
        int | None,
        typer.Option("--gpus", min=1, help="Total GPUs for the job, within elastic.gpus."),
    ] = None,
    gpu_type: Annotated[
        str | None,
        typer.Option(
            "--gpu-type", help="Run on GPUs of this type (one the job accepts); 'any' lifts it."
        ),
    ] = None,
) -> None:
    """Rescale an elastic job to a number of GPUs, a GPU type, or both."""
    if gpus is None and gpu_type is None:
        raise typer.BadParameter("give --gpus, --gpu-type or both")
    with client_of(ctx) as client:
        model = client.scale(model_id, gpus, gpu_type)
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
        bool,
        typer.Option(
            "--trained-model", help="The trained model (default file: ID-trained-model.zip)."
        ),
    ] = False,
    trainedmodel: Annotated[
        bool,
        typer.Option(
            "--trainedmodel", help="The trained model (default file: ID-trainedmodel.zip)."
        ),
    ] = False,
    definition: Annotated[
        bool,
        typer.Option(
            "--definition", help="The submitted model definition (default: ID-definition.zip)."
        ),
    ] = False,
    output: Annotated[
        Path | None, typer.Option("--filename", "--output", "-o", help="File to write.")
    ] = None,
) -> None:
    """Download a job's trained model or its model definition as a zip."""
    if (trained_model or trainedmodel) == definition:
        raise typer.BadParameter(
            "give exactly one of --trainedmodel (or --trained-model) and --definition"
        )
    # Each spelling keeps its own CLI's default name: FfDL's --trainedmodel wrote
    # ID-trainedmodel.zip, ffdl's --trained-model writes ID-trained-model.zip.
    kind = "definition" if definition else "trained-model" if trained_model else "trainedmodel"
    dest = output or Path(f"{model_id}-{kind}.zip")
    with client_of(ctx) as client:
        if definition:
            typer.echo(f"Getting model definition for '{model_id}'...")
            client.download_definition(model_id, dest)
        else:
            typer.echo(f"Getting trained model for '{model_id}'...")
            client.download_trained_model(model_id, dest)
    typer.echo(f"Downloaded file: {dest}")
    typer.echo("OK")


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


app.command("init")(init_command)
app.command("logs")(logs_command)
app.command("loglines")(loglines_command)
app.command("emetrics")(emetrics_command)
app.command("demo")(demo_command)
app.command("nodes")(nodes_command)
app.command("queue")(queue_command)
app.command("top")(top_command)
app.command("status")(status_command)
app.command("simulate")(simulate_command)
app.command("drain")(drain_command)
app.command("undrain")(undrain_command)
app.command("audit")(audit_command)
app.add_typer(tenant_app, name="tenant")
app.add_typer(token_app, name="token")
app.add_typer(user_app, name="user")
app.add_typer(db_app, name="db")

__all__ = ["CliContext", "ClientFactory", "app", "main"]


def main() -> None:
    app(prog_name="ffdl")


if __name__ == "__main__":
    main()
