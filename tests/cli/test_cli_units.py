"""The ``ffdl`` CLI against a fake API (in-process transport) and the demo against a fake server.

The fake server of the demo tests is a real subprocess serving HTTP on 127.0.0.1, so the demo's
process handling (start, readiness, SIGTERM/SIGKILL) runs for real.
"""

from __future__ import annotations

import copy
import io
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console
from typer.testing import CliRunner, Result

from ffdl.cli.demo import (
    DemoError,
    accuracy_from_log_line,
    epochs_from_manifest,
    free_port,
    run_demo,
    short_number,
    stop_server,
)
from ffdl.cli.main import CliContext, app
from ffdl.client.config import ClientConfig
from ffdl.client.http import Client
from tests.integration.live import interruptible

MODEL_ID = "training-abc12345"
MODEL: dict[str, Any] = {
    "model_id": MODEL_ID,
    "name": "digits",
    "description": "digit classifier",
    "version": "1.0",
    "tenant": "default",
    "user": "admin",
    "priority": 5,
    "framework": {"name": "pytorch", "version": "2", "command": "python train.py --epochs 3"},
    "training": {
        "learners": 2,
        "gpus": 1,
        "cpus": 2,
        "memory": 4096,
        "memory_unit": "MiB",
        "training_status": {
            "status": "QUEUED",
            "status_description": "waiting for 2 free GPUs",
            "error_code": None,
            "exit_code": None,
            "submitted": "2024-05-01T10:00:00+00:00",
            "started": None,
            "completed": None,
        },
    },
    "data_stores": [],
    "placement": [{"learner": 1, "node": "node-a", "gpu_ids": [3]}],
    "learners": [
        {"learner": 1, "status": "PENDING", "node": "node-a", "gpu_ids": [3], "exit_code": None}
    ],
    "queue": {"position": 3, "eta": "2024-05-01T10:30:00+00:00", "reason": "cluster full"},
    "events": [
        {"time": "2024-05-01T10:00:00Z", "from": None, "to": "QUEUED", "reason": "submitted"}
    ],
    "results": {"location": "/data/results/abc12345", "download": "/v1/models/x/trained_model"},
    "location": f"/v1/models/{MODEL_ID}",
}
MANIFEST_ERROR = {
    "error": "invalid manifest: framework.command: is required",
    "code": "C101",
    "detail": {"field": "framework.command", "reason": "is required"},
}


def sse(*events: tuple[str, dict[str, Any]]) -> bytes:
    return "".join(f"event: {k}\ndata: {json.dumps(d)}\n\n" for k, d in events).encode()


def log_line(rindex: int) -> dict[str, Any]:
    return {"meta": {"training_id": MODEL_ID, "rindex": rindex, "learner": 1}, "line": f"l{rindex}"}


class FakeApi:
    """The API contract's shapes, served through ``httpx.MockTransport``."""

    def __init__(self) -> None:
        self.configs: list[ClientConfig] = []
        self.requests: list[httpx.Request] = []
        self.submit_error: dict[str, Any] | None = None
        self.final_status = "COMPLETED"
        self.log_count = 3
        self.models = [MODEL]
        self.node_type = "v100"

    def factory(self, config: ClientConfig) -> Client:
        self.configs.append(config)
        return Client(config.url, config.token, transport=httpx.MockTransport(self.handle))

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        method, path, params = request.method, request.url.path, request.url.params
        model_path = f"/v1/models/{MODEL_ID}"
        if path == "/health":
            return httpx.Response(200, json={"status": "ok", "version": "9.9"})
        if (method, path) == ("POST", "/v1/models"):
            if self.submit_error:
                return httpx.Response(400, json=self.submit_error)
            body = {"model_id": MODEL_ID, "location": model_path, "status": "QUEUED"}
            return httpx.Response(201, json={**body, "warnings": ["gpus: rounded"]})
        if path == "/v1/models":
            return httpx.Response(200, json={"models": self.models, "total": len(self.models)})
        if path == f"{model_path}/events/stream":
            status = {"status": "PROCESSING", "reason": "learners running", "time": "t"}
            events = [("status", status), ("log", log_line(1)), ("log", log_line(2))]
            events += [("end", {"status": self.final_status})]
            return httpx.Response(200, content=sse(*events))
        if path == f"{model_path}/trained_model":
            return httpx.Response(200, content=b"PK-trained")
        if path == model_path and method == "PATCH":
            changed = copy.deepcopy(MODEL)
            change = json.loads(request.content)
            changed["priority"] = change.get("priority", MODEL["priority"])
            new_status = {"halt": "HALTING", "resume": "QUEUED"}.get(change.get("status"))
            changed["training"]["training_status"]["status"] = new_status or "RESCALING"
            return httpx.Response(202, json=changed)
        if path == model_path and method == "DELETE":
            return httpx.Response(
                200, json={"model_id": MODEL_ID, "status": "CANCELLED", "deleted": False}
            )
        if path == model_path:
            return httpx.Response(200, json=MODEL)
        if path == "/v1/nodes":
            return httpx.Response(
                200, json={"nodes": [{"name": "node-a", "gpu_type": self.node_type}]}
            )
        if path == f"/v1/logs/{MODEL_ID}/loglines":
            start, size = int(params.get("pos", 0)), int(params.get("pagesize", 100))
            rindexes = range(start + 1, min(start + size, self.log_count) + 1)
            return httpx.Response(200, json={"lines": [log_line(i) for i in rindexes]})
        if path == f"/v1/logs/{MODEL_ID}/emetrics":
            record = {"meta": {"rindex": 1}, "grouplabel": "test", "etimes": {}, "values": {}}
            return httpx.Response(200, json={"records": [record]})
        return httpx.Response(404, json={"error": f"{path} not found", "code": "C404"})


@pytest.fixture(autouse=True)
def platform_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("FFDL_URL", "FFDL_TOKEN", "FFDL_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("FFDL_HOME", str(home))
    monkeypatch.setenv("COLUMNS", "200")
    return home


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    monkeypatch.setenv("FFDL_URL", "http://ffdl.test")
    monkeypatch.setenv("FFDL_TOKEN", "env-token")
    return FakeApi()


def invoke(args: list[str], api: FakeApi | None = None) -> Result:
    context = CliContext(client_factory=api.factory) if api else None
    return CliRunner().invoke(app, args, obj=context)


# -- configuration and errors -------------------------------------------------------------


def test_options_beat_environment(api: FakeApi) -> None:
    result = invoke(["--url", "http://other.test", "--token", "opt", "list"], api)
    assert result.exit_code == 0, result.output
    assert api.configs == [ClientConfig("http://other.test", "opt")]
    assert api.requests[0].headers["authorization"] == "Bearer opt"


def test_home_client_file_is_used_without_environment(platform_home: Path) -> None:
    config = {"url": "http://home.test", "token": "home-token"}
    (platform_home / "client.json").write_text(json.dumps(config))
    fake = FakeApi()
    assert invoke(["list"], fake).exit_code == 0
    assert fake.configs == [ClientConfig("http://home.test", "home-token")]


def test_missing_configuration_is_one_red_line() -> None:
    result = invoke(["list"], FakeApi())
    assert result.exit_code == 1
    assert result.stderr == (
        "Error (CONFIG): no ffdl server configured: start one with `ffdl up` "
        "or set FFDL_URL and FFDL_TOKEN\n"
    )
    assert result.stdout == ""


def test_api_error_is_one_line_without_traceback(api: FakeApi, tmp_path: Path) -> None:
    api.submit_error = MANIFEST_ERROR
    manifest = tmp_path / "manifest.yml"
    manifest.write_text("name: x\n")
    result = invoke(["train", str(manifest), str(tmp_path)], api)
    assert result.exit_code == 1
    assert result.stderr == "Error (C101): invalid manifest: framework.command: is required\n"
    assert "Traceback" not in result.output


def test_unreachable_server_names_its_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = invoke(["--url", url, "--token", "t", "show", MODEL_ID])
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error (UNREACHABLE): the ffdl server at {url} is unreachable")
    assert len(result.stderr.splitlines()) == 1


def test_local_archive_error_is_reported_like_api_errors(api: FakeApi, tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.yml"
    manifest.write_text("name: x\n")
    result = invoke(["train", str(manifest), str(tmp_path / "missing")], api)
    assert result.exit_code == 1
    assert result.stderr.startswith("Error (C102): model definition")
    assert api.requests == []


# -- verbs --------------------------------------------------------------------------------


def test_train_prints_model_id_and_warnings(api: FakeApi, tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.yml"
    manifest.write_text("name: x\n")
    result = invoke(["train", str(manifest), str(tmp_path)], api)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[1:] == [f"Model ID: {MODEL_ID}", "OK"]
    assert "Warning: gpus: rounded" in result.stderr


@pytest.mark.parametrize(("final", "exit_code"), [("COMPLETED", 0), ("FAILED", 1)])
def test_train_follow_streams_and_fails_with_the_job(
    api: FakeApi, tmp_path: Path, final: str, exit_code: int
) -> None:
    api.final_status = final
    manifest = tmp_path / "manifest.yml"
    manifest.write_text("name: x\n")
    result = invoke(["train", "-f", str(manifest), str(tmp_path)], api)
    assert result.exit_code == exit_code, result.output
    lines = result.stdout.splitlines()
    assert lines[1:3] == [f"Model ID: {MODEL_ID}", "OK"]
    assert lines[3] == "── status PROCESSING (learners running)"
    assert lines[4:6] == ["l1", "l2"]
    assert lines[-1].startswith(f"── status {final}")


def test_list_shows_a_row_per_model(api: FakeApi) -> None:
    result = invoke(["list", "--status", "QUEUED"], api)
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if MODEL_ID in line)
    # Submitted long ago: month and day; its queue position in the progress column.
    for cell in ("digits", "QUEUED", "05-01", "#3", "2\N{MULTIPLICATION SIGN}1"):
        assert cell in row
    assert api.requests[0].url.params["status"] == "QUEUED"


def test_list_without_models(api: FakeApi) -> None:
    api.models = []
    result = invoke(["list"], api)
    assert (result.exit_code, result.stdout) == (0, "No models.\n")


def test_show_panel_explains_the_job(api: FakeApi) -> None:
    result = invoke(["show", MODEL_ID], api)
    assert result.exit_code == 0, result.output
    for fact in (
        MODEL_ID,
        "QUEUED",
        "waiting for 2 free GPUs",
        "position 3, ETA 2024-05-01 10:30:00, cluster full",
        "learner 1 → node-a GPU 3",
        "submitted",
        "/data/results/abc12345",
        f"ffdl download {MODEL_ID} --trained-model",
    ):
        assert fact in result.stdout
    assert "exit code" not in result.stdout


def test_show_says_cpu_slots_where_the_host_has_no_gpus(api: FakeApi) -> None:
    api.node_type = "cpu"
    shown = invoke(["show", MODEL_ID], api).stdout
    assert "learner 1 → node-a CPU slot 3" in shown and "× 1 CPU slot" in shown, shown


def test_show_json_is_the_model(api: FakeApi) -> None:
    result = invoke(["show", "--json", MODEL_ID], api)
    assert json.loads(result.stdout) == MODEL


def test_logs_pages_through_all_lines(api: FakeApi) -> None:
    api.log_count = 1203
    result = invoke(["logs", MODEL_ID], api)
    assert result.stdout.splitlines() == [f"l{i}" for i in range(1, 1204)]
    assert [r.url.params["pos"] for r in api.requests] == ["0", "500", "1000"]


def test_logs_follow_prints_only_lines(api: FakeApi) -> None:
    result = invoke(["logs", "-f", MODEL_ID], api)
    assert result.stdout == "l1\nl2\n"
    assert "COMPLETED" in result.stderr


def test_loglines_and_emetrics_print_json_records(api: FakeApi) -> None:
    result = invoke(["loglines", MODEL_ID, "--pagesize", "2", "--pos", "1", "--json"], api)
    assert [json.loads(line) for line in result.stdout.splitlines()] == [
        log_line(2),
        log_line(3),
    ]
    result = invoke(["emetrics", MODEL_ID, "--since-time", "1700000000000", "--json"], api)
    assert json.loads(result.stdout)["grouplabel"] == "test"
    assert api.requests[-1].url.params["since_time"] == "1700000000000"


def test_lifecycle_verbs(api: FakeApi) -> None:
    assert invoke(["halt", MODEL_ID], api).stdout == f"{MODEL_ID}: HALTING\n"
    assert invoke(["resume", MODEL_ID], api).stdout == f"{MODEL_ID}: QUEUED\n"
    assert invoke(["priority", MODEL_ID, "9"], api).stdout == f"{MODEL_ID}: priority 9\n"
    assert invoke(["delete", MODEL_ID], api).stdout.startswith(f"Cancelled {MODEL_ID}")
    bodies = [json.loads(r.content) for r in api.requests if r.method == "PATCH"]
    assert bodies == [{"status": "halt"}, {"status": "resume"}, {"priority": 9}]


def test_download_default_name_and_option_check(
    api: FakeApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke(["download", MODEL_ID, "--trained-model"], api)
    assert result.exit_code == 0, result.output
    assert (tmp_path / f"{MODEL_ID}-trained-model.zip").read_bytes() == b"PK-trained"
    assert invoke(["download", MODEL_ID], api).exit_code == 2
    both = ["download", MODEL_ID, "--trained-model", "--definition"]
    assert invoke(both, api).exit_code == 2


def test_version_with_and_without_a_server(api: FakeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = invoke(["version"], api).stdout.splitlines()
    assert lines[0].startswith("ffdl ")
    assert lines[1] == "server 9.9 at http://ffdl.test"
    monkeypatch.delenv("FFDL_URL")
    monkeypatch.delenv("FFDL_TOKEN")
    result = invoke(["version"], FakeApi())
    assert result.exit_code == 0
    assert len(result.stdout.splitlines()) == 1


# -- demo ---------------------------------------------------------------------------------

FAKE_PLATFORM = r"""
import argparse, json, os, pathlib, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

parser = argparse.ArgumentParser()
parser.add_argument("--outcome", default="COMPLETED")
parser.add_argument("--home", type=pathlib.Path)
parser.add_argument("--port", type=int)
args = parser.parse_args()
MODEL_ID = "training-demo0001"
url = f"http://127.0.0.1:{args.port}"
args.home.mkdir(parents=True, exist_ok=True)
(args.home / "client.json").write_text(json.dumps({"url": url, "token": "demo-token"}))

def record(group, step, **values):
    return {"meta": {"training_id": MODEL_ID}, "grouplabel": group,
            "etimes": {"epoch": {"type": "INT", "value": str(step)}},
            "values": {k: {"type": "FLOAT", "value": str(v)} for k, v in values.items()}}

class Handler(BaseHTTPRequestHandler):
    def send(self, code, body, kind="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Authorization") != "Bearer demo-token":
            return self.send(401, {"error": "bad token", "code": "C103", "detail": None})
        self.send(201, {"model_id": MODEL_ID, "status": "QUEUED", "warnings": []})

    def do_GET(self):
        if self.path == "/health":
            return self.send(200, {"status": "ok", "version": "test"})
        if self.path == f"/v1/models/{MODEL_ID}":
            status = {"status": args.outcome}
            return self.send(200, {"model_id": MODEL_ID, "training": {"training_status": status},
                                   "results": {"location": "/results/demo0001"}})
        if self.path.startswith(f"/v1/models/{MODEL_ID}/events/stream"):
            events = [("status", {"status": "PROCESSING", "reason": "running"})]
            if args.outcome == "HANG":
                return self.hang(events)
            events += [
                ("emetric", record("train", e, loss=1 / e, epoch=e, total_epochs=3))
                for e in (1, 2, 3)
            ]
            events += [("log", {"meta": {"rindex": 1}, "line": "test accuracy: 0.5"})]
            events += [("emetric", record("test", 3, accuracy=0.97))]
            events += [("end", {"status": args.outcome})]
            body = "".join(f": ka\n\nevent: {k}\ndata: {json.dumps(d)}\n\n" for k, d in events)
            return self.send(200, body.encode(), "text/event-stream")
        self.send(404, {"error": "not found", "code": "C404", "detail": None})

    def hang(self, events):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for kind, data in events:
            self.wfile.write(f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode())
        while True:
            self.wfile.write(b": ka\n\n")
            self.wfile.flush()
            time.sleep(0.2)

(args.home / "platform.pid").write_text(str(os.getpid()))
print("fake platform listening", flush=True)
ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()
"""


@pytest.fixture
def example(tmp_path: Path) -> Path:
    directory = tmp_path / "digits"
    directory.mkdir()
    manifest = "name: digits\nframework:\n  name: pytorch\n  command: python train.py --epochs 3\n"
    (directory / "manifest.yml").write_text(manifest)
    (directory / "train.py").write_text("print('train')\n")
    return directory


def fake_platform(tmp_path: Path, outcome: str) -> list[str]:
    script = tmp_path / "fake_platform.py"
    script.write_text(FAKE_PLATFORM)
    return [sys.executable, str(script), "--outcome", outcome]


def port_is_closed(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.parametrize(("outcome", "exit_code"), [("COMPLETED", 0), ("FAILED", 1)])
def test_demo_runs_the_example_and_stops_the_platform(
    tmp_path: Path, example: Path, outcome: str, exit_code: int
) -> None:
    out, port = io.StringIO(), free_port()
    code = run_demo(
        port=port,
        home=tmp_path / "demo-home",
        example=example,
        console=Console(file=out, width=160),
        server_argv=fake_platform(tmp_path, outcome),
        health_deadline_s=20,
    )
    text = out.getvalue()
    assert code == exit_code, text
    assert "Model ID: training-demo0001" in text
    assert "status PROCESSING (running)" in text
    if outcome == "COMPLETED":
        assert "3/3 epochs" in text
        # The live line shows the metrics; the epoch counts are the bar's.
        assert "loss 0.333" in text and "total_epochs" not in text, text
    for fact in (outcome, "0.97", "/results/demo0001", f"http://127.0.0.1:{port}/docs"):
        assert fact in text
    assert "fake platform listening" in (tmp_path / "demo-home" / "server.log").read_text()
    assert port_is_closed(port)


def test_demo_reports_a_platform_that_dies_at_start(tmp_path: Path, example: Path) -> None:
    out = io.StringIO()
    dying = [sys.executable, "-c", "import sys; print('cannot open database'); sys.exit(3)"]
    with pytest.raises(DemoError, match="exited with code 3"):
        run_demo(
            port=0,
            home=tmp_path / "h",
            example=example,
            console=Console(file=out),
            server_argv=dying,
        )
    assert "cannot open database" in out.getvalue()


def test_demo_without_example_is_a_clean_error(tmp_path: Path) -> None:
    result = invoke(["demo", "--example", str(tmp_path / "nothing"), "--home", str(tmp_path)])
    assert result.exit_code == 1
    assert result.stderr.startswith("Error (DEMO): no manifest.yml in")


def test_demo_reads_epochs_and_accuracy(example: Path) -> None:
    assert epochs_from_manifest(example / "manifest.yml") == 3
    assert epochs_from_manifest(example / "train.py") is None
    assert accuracy_from_log_line("epoch 3: Test Accuracy: 0.9812") == "0.9812"
    assert accuracy_from_log_line("train accuracy 0.5") is None
    assert short_number("0.9861111044883728") == "0.9861"
    assert (short_number("15"), short_number("n/a")) == ("15", "n/a")


def test_ctrl_c_during_the_demo_stops_the_platform(tmp_path: Path, example: Path) -> None:
    home = tmp_path / "demo-home"
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from rich.console import Console\n"
        "from ffdl.cli.demo import run_demo\n"
        "sys.exit(run_demo(port=0, home=Path(sys.argv[1]), example=Path(sys.argv[2]),"
        " console=Console(), server_argv=sys.argv[3:]))\n"
    )
    argv = [sys.executable, "-c", script, str(home), str(example)]
    demo = subprocess.Popen(
        [*argv, *fake_platform(tmp_path, "HANG")],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible,
    )
    try:
        assert demo.stdout is not None
        seen = [demo.stdout.readline()]
        while not seen[-1].startswith("Model ID:"):
            assert seen[-1], f"demo ended early: {seen}"
            seen.append(demo.stdout.readline())
        platform_pid = int((home / "platform.pid").read_text())
        demo.send_signal(signal.SIGINT)
        assert demo.wait(timeout=30) == 130
        assert "Interrupted: stopping the platform." in demo.stdout.read()
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    with pytest.raises(ProcessLookupError):
        os.kill(platform_pid, 0)


@pytest.fixture
def stubborn_process() -> Iterator[subprocess.Popen[str]]:
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    yield process
    if process.poll() is None:
        process.kill()
        process.wait()


def test_stop_server_kills_a_platform_that_ignores_sigterm(
    stubborn_process: subprocess.Popen[str],
) -> None:
    assert stubborn_process.stdout is not None
    assert stubborn_process.stdout.readline() == "ready\n"
    stop_server(stubborn_process, grace=0.3)
    assert stubborn_process.returncode == -signal.SIGKILL


def test_the_replicas_table_marks_a_replica_that_serves_the_api_only() -> None:
    from ffdl.cli.cluster_render import replicas_table

    seen = "2026-01-02T03:04:05Z"
    body = {
        "this_replica": "r-api",
        "replicas": [
            {"id": "r-loops", "url": "http://a", "alive": True, "runs_loops": True},
            {"id": "r-api", "url": "http://b", "alive": True, "runs_loops": False},
            {"id": "r-old", "url": "http://c", "alive": False, "runs_loops": False},
        ],
    }
    for replica in body["replicas"]:
        replica["seen_at"] = seen
    out = io.StringIO()
    Console(file=out, width=160).print(replicas_table(body, 160))
    lines = out.getvalue().splitlines()
    rows = {
        name: next(line for line in lines if name in line) for name in ("r-loops", "r-api", "r-old")
    }
    assert "API only" not in rows["r-loops"]
    assert "up, API only" in rows["r-api"]
    assert "gone, API only" in rows["r-old"]
