"""``ffdl demo``: a first run end to end: start a platform, train an example, show the result.

The platform runs as a child process (``ffdl up``) with its output in ``HOME/server.log``;
whatever happens, including Ctrl-C, the child is stopped before the command returns.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from ffdl.cli.render import demo_summary_panel, log_text, status_change_text
from ffdl.client.config import read_client_file
from ffdl.client.http import ApiError, Client
from ffdl.core.errors import FfdlError
from ffdl.core.progress import PROGRESS_KEYS

DEFAULT_HOME = Path(".ffdl-demo")
DEFAULT_EXAMPLE = Path("examples/digits")
HEALTH_DEADLINE_S = 60.0
STOP_GRACE_S = 15.0
POLL_INTERVAL_S = 0.25
LOG_TAIL_LINES = 20
MANIFEST_NAMES = ("manifest.yml", "manifest.yaml")
INTERRUPTED_EXIT_CODE = 130

_EPOCHS = re.compile(r"--epochs(?:=|\s+)(\d+)")
_TEST_ACCURACY = re.compile(r"test accuracy\s*[:=]\s*([0-9]*\.?[0-9]+(?:[eE][-+]?\d+)?)", re.I)


class DemoError(FfdlError):
    default_code = "DEMO"


@dataclass(frozen=True, slots=True)
class FollowOutcome:
    status: str
    test_accuracy: str | None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def find_manifest(example: Path) -> Path:
    for name in MANIFEST_NAMES:
        candidate = example / name
        if candidate.is_file():
            return candidate
    raise DemoError(f"no manifest.yml in {example}: pass --example DIR with an FfDL example")


def epochs_from_manifest(manifest: Path) -> int | None:
    """N of ``--epochs N`` in the manifest's ``framework.command``, if it has one."""
    try:
        loaded: Any = yaml.safe_load(manifest.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    command = loaded.get("framework", {}).get("command") if isinstance(loaded, dict) else None
    match = _EPOCHS.search(command) if isinstance(command, str) else None
    return int(match.group(1)) if match else None


def short_number(value: str) -> str:
    """A metric value as reported, trimmed to four significant digits when it is a float."""
    try:
        number = float(value)
    except ValueError:
        return value
    return value if number.is_integer() else f"{number:.4g}"


def accuracy_from_log_line(line: str) -> str | None:
    match = _TEST_ACCURACY.search(line)
    return match.group(1) if match else None


def _metric_value(record: dict[str, Any], section: str, *names: str) -> str | None:
    entries = record.get(section)
    if not isinstance(entries, dict):
        return None
    for name in names:
        entry = entries.get(name)
        if isinstance(entry, dict) and entry.get("value") is not None:
            return str(entry["value"])
    return None


def accuracy_from_test_emetric(record: dict[str, Any]) -> str | None:
    if record.get("grouplabel") != "test":
        return None
    return _metric_value(record, "values", "accuracy")


def start_server(argv: Sequence[str], home: Path, port: int) -> subprocess.Popen[bytes]:
    """Start the platform with its output in ``home/server.log``."""
    home.mkdir(parents=True, exist_ok=True)
    with (home / "server.log").open("wb") as log:
        # The child keeps its own copy of the descriptor, so closing ours here is safe.
        return subprocess.Popen(
            [*argv, "--home", str(home), "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            # Outside the terminal's process group: Ctrl-C reaches only the demo, which then
            # stops the platform in order.
            start_new_session=True,
        )


def stop_server(server: subprocess.Popen[Any], grace: float = STOP_GRACE_S) -> None:
    """SIGTERM, then SIGKILL if the platform has not exited within ``grace`` seconds."""
    if server.poll() is not None:
        return
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=grace)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        server.kill()
        server.wait()


def _log_tail(home: Path) -> str:
    try:
        lines = (home / "server.log").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-LOG_TAIL_LINES:])


def wait_until_ready(
    server: subprocess.Popen[bytes],
    url: str,
    home: Path,
    console: Console,
    deadline_s: float = HEALTH_DEADLINE_S,
) -> str | None:
    """Wait for ``/health`` and ``client.json``; the admin token the platform wrote."""
    give_up_at = time.monotonic() + deadline_s
    problem = "no answer yet"
    with console.status(f"Starting the platform at {url} ...", spinner="dots"):
        while time.monotonic() < give_up_at:
            if server.poll() is not None:
                console.print(Text(_log_tail(home), style="dim"))
                raise DemoError(
                    f"the platform exited with code {server.returncode} before it was ready;"
                    f" see {home / 'server.log'}"
                )
            try:
                with Client(url, None, timeout=2.0) as probe:
                    probe.health()
                return read_client_file(home / "client.json").get("token")
            except FfdlError as exc:
                # Covers both a server not yet listening and a client.json not yet written.
                problem = exc.message
            time.sleep(POLL_INTERVAL_S)
    raise DemoError(
        f"the platform at {url} was not ready within {deadline_s:g} s ({problem});"
        f" see {home / 'server.log'}"
    )


class _ProgressView:
    """Live view of a job: prints statuses and log lines above a progress line."""

    def __init__(self, progress: Progress, epochs: int | None) -> None:
        self.progress = progress
        self.epochs = epochs
        self.task: TaskID = progress.add_task("QUEUED", total=epochs)
        self.status = "QUEUED"
        self.metrics = ""
        self.emetric_accuracy: str | None = None
        self.log_accuracy: str | None = None

    def _describe(self) -> None:
        self.progress.update(self.task, description=f"{self.status} {self.metrics}".strip())

    def on_status(self, data: dict[str, Any]) -> None:
        self.status = str(data.get("status") or self.status)
        self.progress.console.print(status_change_text(data), soft_wrap=True)
        self._describe()

    def on_log(self, data: dict[str, Any]) -> None:
        text = log_text(data)
        self.progress.console.print(text, soft_wrap=True)
        self.log_accuracy = accuracy_from_log_line(text.plain) or self.log_accuracy

    def on_emetric(self, record: dict[str, Any]) -> None:
        self.emetric_accuracy = accuracy_from_test_emetric(record) or self.emetric_accuracy
        if record.get("grouplabel") != "train":
            return
        step = _metric_value(record, "etimes", "epoch", "iteration")
        if step is not None and step.lstrip("-").isdigit() and self.epochs is not None:
            done = max(int(step), int(self.progress.tasks[self.task].completed))
            self.progress.update(self.task, completed=min(done, self.epochs))
        values = record.get("values")
        if isinstance(values, dict):
            # The progress counts (epoch, totals) show in the bar; the line shows metrics.
            self.metrics = "  ".join(
                f"{name} {short_number(str(entry.get('value')))}"
                for name, entry in values.items()
                if isinstance(entry, dict) and name not in PROGRESS_KEYS
            )
        self._describe()

    def on_end(self, data: dict[str, Any]) -> None:
        self.status = str(data.get("status") or "UNKNOWN")
        if self.status == "COMPLETED" and self.epochs is not None:
            self.progress.update(self.task, completed=self.epochs)
        self._describe()


def follow_with_progress(
    client: Client, model_id: str, epochs: int | None, console: Console
) -> FollowOutcome:
    """Follow the job to its end with live progress; its final status and test accuracy."""
    columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn()]
    if epochs is not None:
        columns += [MofNCompleteColumn(), TextColumn("epochs")]
    with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
        view = _ProgressView(progress, epochs)
        for event in client.follow(model_id):
            if event.kind == "status":
                view.on_status(event.data)
            elif event.kind == "log":
                view.on_log(event.data)
            elif event.kind == "emetric":
                view.on_emetric(event.data)
            elif event.kind == "end":
                view.on_end(event.data)
                break
    accuracy = view.emetric_accuracy
    if accuracy is None:
        # The stream may start after early records; the stored metrics are complete.
        with contextlib.suppress(ApiError):
            for record in client.emetrics(model_id, pagesize=1000):
                accuracy = accuracy_from_test_emetric(record) or accuracy
    accuracy = accuracy or view.log_accuracy
    return FollowOutcome(view.status, None if accuracy is None else short_number(accuracy))


def _download_hint(home: Path, port: int, model_id: str) -> str:
    config = shlex.quote(str(home / "client.json"))
    return (
        f"ffdl up --home {shlex.quote(str(home))} --port {port}\n"
        "then, in another shell:\n"
        f"FFDL_CONFIG={config} ffdl download {model_id} --trained-model"
    )


def run_demo(
    *,
    port: int,
    home: Path,
    example: Path,
    console: Console,
    server_argv: Sequence[str] | None = None,
    health_deadline_s: float = HEALTH_DEADLINE_S,
    stop_grace_s: float = STOP_GRACE_S,
) -> int:
    """The whole demo; its exit code (0 only when the job completed)."""
    manifest = find_manifest(example)
    epochs = epochs_from_manifest(manifest)
    home = home.expanduser().absolute()
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    # -u: unbuffered, so server.log shows the platform's output as it happens.
    argv = server_argv or [sys.executable, "-u", "-m", "ffdl.cli.main", "up"]
    server = start_server(argv, home, port)
    try:
        token = wait_until_ready(server, url, home, console, health_deadline_s)
        console.print(f"Platform ready at {url} (log: {home / 'server.log'})")
        # soft_wrap: the terminal wraps the link, so it stays one piece to copy.
        console.print(f"Dashboard, live while the demo runs: {url}/#token={token}", soft_wrap=True)
        with Client(url, token) as client:
            created = client.submit(manifest, example)
            model_id = str(created.get("model_id"))
            console.print(f"Model ID: {model_id}")
            outcome = follow_with_progress(client, model_id, epochs, console)
            model = client.get_model(model_id)
        results = model.get("results") or {}
        console.print(
            demo_summary_panel(
                model_id=model_id,
                status=outcome.status,
                test_accuracy=outcome.test_accuracy,
                results_location=results.get("location"),
                download_hint=_download_hint(home, port, model_id),
                dashboard_url=f"{url}/ (token in {home / 'client.json'})",
                docs_url=f"{url}/docs",
            )
        )
        return 0 if outcome.status == "COMPLETED" else 1
    except KeyboardInterrupt:
        console.print("Interrupted: stopping the platform.")
        return INTERRUPTED_EXIT_CODE
    finally:
        stop_server(server, stop_grace_s)


def demo_command(
    port: Annotated[int, typer.Option(help="Port for the platform; 0 picks a free one.")] = 0,
    home: Annotated[Path, typer.Option(help="Platform home for the demo.")] = DEFAULT_HOME,
    example: Annotated[
        Path, typer.Option(help="Example directory with manifest.yml and code.")
    ] = DEFAULT_EXAMPLE,
) -> None:
    """Start a local platform, train an example on it, show the result, stop the platform."""
    exit_code = run_demo(port=port, home=home, example=example, console=Console(highlight=False))
    if exit_code:
        raise typer.Exit(exit_code)
