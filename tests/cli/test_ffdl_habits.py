"""FfDL's command-line habits: its verbs, flags and printed lines, against an in-process API.

The API is served through ``httpx.MockTransport`` in the shapes of the HTTP contract (FfDL's
``models`` lists; the event stream of ``/events/stream``), so each test checks what a script
written for FfDL's CLI would read from ``ffdl``.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from typer.testing import CliRunner, Result

from ffdl.cli.init_template import DEFAULT_FRAMEWORK, default_version
from ffdl.cli.main import CliContext, app
from ffdl.cli.records import since_millis
from ffdl.cli.render import metric_data
from ffdl.client.config import ClientConfig
from ffdl.client.http import Client
from ffdl.core.manifest import parse_manifest
from ffdl.server.services.runtimes import platform_runtimes, resolve

MODEL_ID = "training-habit0001"
# What FfDL's own scripts do with `train` output: `grep "Model ID" | cut -d " " -f 3`.
MODEL_ID_LINE = re.compile(r"^Model ID: (training-[A-Za-z0-9_-]+)$", re.MULTILINE)
T0 = 1_700_000_000_000


def log_item(rindex: int) -> dict[str, Any]:
    meta = {"training_id": MODEL_ID, "user_id": "admin", "time": T0 + rindex, "rindex": rindex}
    return {"meta": meta, "line": f"line {rindex}"}


def metric_item(rindex: int, accuracy: float) -> dict[str, Any]:
    return {
        "meta": {"training_id": MODEL_ID, "time": T0 + rindex * 1000, "rindex": rindex},
        "grouplabel": "test",
        "etimes": {"iteration": {"type": "INT", "value": str(rindex * 10)}},
        "values": {
            "accuracy": {"type": "FLOAT", "value": repr(accuracy)},
            "loss": {"type": "FLOAT", "value": "0.5"},
        },
    }


def sse(events: list[tuple[str, dict[str, Any]]]) -> bytes:
    return "".join(f"event: {k}\ndata: {json.dumps(d)}\n\n" for k, d in events).encode()


class FakeApi:
    """Recorded log lines 1..3 and metrics 1..2; the stream replays them, adds more, ends."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.lines = [log_item(i) for i in (1, 2, 3)]
        self.metrics = [metric_item(1, 0.5), metric_item(2, 0.75)]
        self.streamed_lines = [log_item(i) for i in (2, 3, 4, 5)]
        self.streamed_metrics = [metric_item(1, 0.5), metric_item(2, 0.75), metric_item(3, 0.9)]
        self.warnings = ["framework tensorflow 1.0 runs on the default runtime"]

    def factory(self, config: ClientConfig) -> Client:
        return Client(config.url, config.token, transport=httpx.MockTransport(self.handle))

    @staticmethod
    def _page(items: list[dict[str, Any]], params: httpx.QueryParams) -> list[dict[str, Any]]:
        pos = int(params.get("pos", 0))
        size = int(params.get("pagesize", 100))
        start = max(len(items) + pos, 0) if pos < 0 else pos
        return items[start : start + size]

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path, params = request.url.path, request.url.params
        model_path = f"/v1/models/{MODEL_ID}"
        if (request.method, path) == ("POST", "/v1/models"):
            body = {"model_id": MODEL_ID, "location": model_path, "status": "QUEUED"}
            return httpx.Response(201, json={**body, "warnings": self.warnings})
        if path == f"{model_path}/events/stream":
            after = int(params.get("since_rindex", 0))
            events: list[tuple[str, dict[str, Any]]] = [
                ("status", {"status": "PROCESSING", "reason": "running", "time": "t"})
            ]
            events += [("log", i) for i in self.streamed_lines if i["meta"]["rindex"] > after]
            events += [("emetric", m) for m in self.streamed_metrics]
            events.append(("end", {"status": "COMPLETED"}))
            return httpx.Response(200, content=sse(events))
        if (request.method, path) == ("PATCH", model_path):
            wanted = json.loads(request.content)["status"]
            status = {"halt": "HALTING", "resume": "QUEUED", "cancel": "CANCELLED"}[wanted]
            return httpx.Response(
                202,
                json={"model_id": MODEL_ID, "training": {"training_status": {"status": status}}},
            )
        if path == f"{model_path}/trained_model":
            return httpx.Response(200, content=b"PK-trained")
        if path == f"{model_path}/definition":
            return httpx.Response(200, content=b"PK-definition")
        if path.endswith("/loglines"):
            # Both spellings of the list, so the test holds whichever the client reads.
            page = self._page(self.lines, params)
            return httpx.Response(200, json={"models": page, "lines": page})
        if path.endswith("/emetrics"):
            page = self._page(self.metrics, params)
            return httpx.Response(200, json={"models": page, "records": page})
        return httpx.Response(404, json={"code": 404, "error": "Not Found", "description": path})


@pytest.fixture(autouse=True)
def client_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FFDL_CONFIG", "DLAAS_URL", "DLAAS_USERNAME", "DLAAS_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FFDL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FFDL_URL", "http://ffdl.test")
    monkeypatch.setenv("FFDL_TOKEN", "t")
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def api() -> FakeApi:
    return FakeApi()


def invoke(args: list[str], api: FakeApi | None = None) -> Result:
    context = CliContext(client_factory=api.factory) if api else None
    return CliRunner().invoke(app, args, obj=context)


# -- help and version ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["train"],
        ["download"],
        ["loglines"],
        ["emetrics"],
        ["logs"],
        ["init"],
        ["tenant"],
        ["tenant", "create"],
        ["token"],
    ],
)
def test_dash_h_is_help_everywhere(command: list[str]) -> None:
    short = invoke([*command, "-h"])
    assert short.exit_code == 0, short.output
    assert "Usage: " in short.stdout
    assert short.stdout == invoke([*command, "--help"]).stdout


def test_download_help_names_the_original_flags() -> None:
    text = invoke(["download", "-h"]).stdout
    for flag in ("--trainedmodel", "--definition", "--filename"):
        assert flag in text


def test_root_version_flag() -> None:
    result = invoke(["--version"])
    assert result.exit_code == 0
    assert re.fullmatch(r"ffdl \S+\n", result.stdout)


# -- init ---------------------------------------------------------------------------------


def test_init_writes_a_manifest_this_platform_parses(tmp_path: Path) -> None:
    result = invoke(["init", "mnist", "--type", "pytorch", "--version", "2.1"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "Creating project 'mnist'...",
        "  adding: manifest.yml",
        "  adding: train.py",
        "OK",
    ]
    text = (tmp_path / "mnist" / "manifest.yml").read_text()
    manifest = parse_manifest(text)
    assert (manifest.name, manifest.framework.name, manifest.framework.version) == (
        "mnist",
        "pytorch",
        "2.1",
    )
    assert manifest.unknown_fields == []
    assert manifest.memory_mb >= 1024
    # FfDL's top-level shape: these keys, as FfDL's manifests spell them.
    document = yaml.safe_load(text)
    assert {"name", "description", "version", "gpus", "memory", "learners", "framework"} <= set(
        document
    )
    assert "python3 train.py" in manifest.framework.command
    compiled = subprocess.run(
        ["python3", "-m", "py_compile", str(tmp_path / "mnist" / "train.py")], check=False
    )
    assert compiled.returncode == 0


def test_init_defaults_to_a_framework_and_version_this_platform_runs(tmp_path: Path) -> None:
    assert invoke(["init", "proj"]).exit_code == 0
    manifest = parse_manifest((tmp_path / "proj" / "manifest.yml").read_text())
    framework = manifest.framework
    assert (framework.name, framework.version) == (DEFAULT_FRAMEWORK, default_version("pytorch"))
    # The platform's own runtimes serve it exactly: no fallback, no warning.
    resolution = resolve(list(platform_runtimes()), framework.name, framework.version)
    assert resolution.warning is None
    assert resolution.runtime.label == f"pytorch-{framework.version}"
    # Its starter trains with the SDK and declares its total, so progress shows.
    code = (tmp_path / "proj" / "train.py").read_text()
    assert "total_epochs=EPOCHS" in code and "save_checkpoint(" in code


def test_init_of_another_framework_writes_no_version_and_a_plain_starter(
    tmp_path: Path,
) -> None:
    assert invoke(["init", "proj", "--type", "custom"]).exit_code == 0
    manifest = parse_manifest((tmp_path / "proj" / "manifest.yml").read_text())
    assert (manifest.framework.name, manifest.framework.version) == ("custom", "")
    assert "import torch" not in (tmp_path / "proj" / "train.py").read_text()


def test_init_quotes_odd_names(tmp_path: Path) -> None:
    result = invoke(["init", "my: model #1", "--version", "1.10"])
    assert result.exit_code == 0, result.output
    manifest = parse_manifest((tmp_path / "my: model #1" / "manifest.yml").read_text())
    assert (manifest.name, manifest.framework.version) == ("my: model #1", "1.10")


@pytest.mark.parametrize("existing", ["directory", "file"])
def test_init_never_overwrites(tmp_path: Path, existing: str) -> None:
    target = tmp_path / "proj"
    if existing == "directory":
        target.mkdir()
        (target / "manifest.yml").write_text("mine\n")
    else:
        target.write_text("mine\n")
    result = invoke(["init", "proj"])
    assert result.exit_code == 1
    assert "'proj' already exists" in result.stderr
    assert result.stdout == ""
    kept = target / "manifest.yml" if existing == "directory" else target
    assert kept.read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["proj"]


def test_init_refuses_a_bad_framework_before_writing(tmp_path: Path) -> None:
    result = invoke(["init", "proj", "--type", ""])
    assert result.exit_code == 1
    assert "framework.name" in result.stderr
    assert not (tmp_path / "proj").exists()


# -- train --------------------------------------------------------------------------------


def test_train_prints_the_original_lines_and_keeps_extras_off_them(
    api: FakeApi, tmp_path: Path
) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "manifest.yml").write_text("name: x\n")
    result = invoke(["train", "manifest.yml", "code"], api)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "Deploying model with manifest 'manifest.yml' and model files in 'code'...",
        f"Model ID: {MODEL_ID}",
        "OK",
    ]
    # FfDL's scripts: `grep "Model ID" | cut -d " " -f 3` and a notebook's out[1].split()[-1].
    grepped = [line for line in result.output.splitlines() if "Model ID" in line]
    assert [line.split(" ")[2] for line in grepped] == [MODEL_ID]
    match = MODEL_ID_LINE.search(result.stdout)
    assert match is not None and match.group(1) == MODEL_ID
    assert result.stdout.splitlines()[1].split()[-1] == MODEL_ID
    assert "runs on the default runtime" in result.stderr
    assert "Model ID" not in result.stderr


def test_train_names_a_zip_as_the_original_did(api: FakeApi, tmp_path: Path) -> None:
    import zipfile

    with zipfile.ZipFile(tmp_path / "model.zip", "w") as archive:
        archive.writestr("train.py", "print('x')\n")
    (tmp_path / "manifest.yml").write_text("name: x\n")
    result = invoke(["train", "manifest.yml", "model.zip"], api)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == (
        "Deploying model with manifest 'manifest.yml' and model file 'model.zip'..."
    )


# -- lifecycle ----------------------------------------------------------------------------


def test_halt_resume_cancel(api: FakeApi) -> None:
    for verb, status in (("halt", "HALTING"), ("resume", "QUEUED"), ("cancel", "CANCELLED")):
        result = invoke([verb, MODEL_ID], api)
        assert (result.exit_code, result.stdout) == (0, f"{MODEL_ID}: {status}\n")
        assert json.loads(api.requests[-1].content) == {"status": verb}


# -- download -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "default_name", "content"),
    [
        ("--trainedmodel", f"{MODEL_ID}-trainedmodel.zip", b"PK-trained"),
        ("--trained-model", f"{MODEL_ID}-trained-model.zip", b"PK-trained"),
        ("--definition", f"{MODEL_ID}-definition.zip", b"PK-definition"),
    ],
)
def test_download_default_names(
    api: FakeApi, tmp_path: Path, flag: str, default_name: str, content: bytes
) -> None:
    result = invoke(["download", MODEL_ID, flag], api)
    assert result.exit_code == 0, result.output
    assert (tmp_path / default_name).read_bytes() == content
    assert result.stdout.splitlines()[1:] == [f"Downloaded file: {default_name}", "OK"]


def test_download_filename(api: FakeApi, tmp_path: Path) -> None:
    result = invoke(["download", MODEL_ID, "--trainedmodel", "--filename", "out.zip"], api)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out.zip").read_bytes() == b"PK-trained"
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".zip"] == ["out.zip"]


def test_download_needs_exactly_one_kind(api: FakeApi) -> None:
    assert invoke(["download", MODEL_ID, "--trainedmodel", "--definition"], api).exit_code == 2
    assert invoke(["download", MODEL_ID, "--filename", "x.zip"], api).exit_code == 2
    assert api.requests == []


# -- loglines and emetrics ----------------------------------------------------------------


def test_loglines_text_and_json(api: FakeApi) -> None:
    text = invoke(["loglines", MODEL_ID], api)
    assert text.exit_code == 0, text.output
    assert text.stdout.splitlines() == [f"{i} {T0 + i} line {i}" for i in (1, 2, 3)]
    as_json = invoke(["loglines", MODEL_ID, "--json", "--pagesize", "2", "--pos", "1"], api)
    assert [json.loads(line) for line in as_json.stdout.splitlines()] == [
        log_item(2),
        log_item(3),
    ]
    params = api.requests[-1].url.params
    assert (params["pagesize"], params["pos"]) == ("2", "1")


def test_loglines_since_is_sent_as_since_time(api: FakeApi) -> None:
    assert invoke(["loglines", MODEL_ID, "--since", str(T0)], api).exit_code == 0
    assert api.requests[-1].url.params["since_time"] == str(T0)


def test_loglines_follow_continues_after_the_page_until_the_end(api: FakeApi) -> None:
    result = invoke(["loglines", MODEL_ID, "--follow", "--json"], api)
    assert result.exit_code == 0, result.output
    rindexes = [json.loads(line)["meta"]["rindex"] for line in result.stdout.splitlines()]
    assert rindexes == [1, 2, 3, 4, 5]
    stream = next(r for r in api.requests if r.url.path.endswith("/events/stream"))
    assert stream.url.params["since_rindex"] == "3"


def test_emetrics_text_json_and_follow(api: FakeApi) -> None:
    text = invoke(["emetrics", MODEL_ID], api)
    assert text.stdout.splitlines()[:3] == [
        f"time: {T0 + 1000}, group-label: test, training-id: {MODEL_ID}",
        "    etimes: iteration: 10",
        "    values: accuracy: 0.5, loss: 0.5",
    ]
    followed = invoke(["emetrics", MODEL_ID, "-f", "--json"], api)
    assert followed.exit_code == 0, followed.output
    records = [json.loads(line) for line in followed.stdout.splitlines()]
    assert [r["meta"]["rindex"] for r in records] == [1, 2, 3]
    assert records[2]["values"]["accuracy"] == {"type": "FLOAT", "value": "0.9"}


# -- logs ---------------------------------------------------------------------------------


def test_logs_metrics_json_is_metric_data(api: FakeApi) -> None:
    result = invoke(["logs", MODEL_ID, "--metrics", "--json", "--follow"], api)
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert records == [
        {
            "type": "test",
            "timestamp": f"2023-11-14T22:13:{20 + i}.000Z",
            "iteration": i * 10,
            "Values": {"accuracy": accuracy, "loss": 0.5},
        }
        for i, accuracy in ((1, 0.5), (2, 0.75), (3, 0.9))
    ]


def test_logs_metrics_text(api: FakeApi) -> None:
    result = invoke(["logs", MODEL_ID, "--metrics"], api)
    first = result.stdout.splitlines()[0]
    assert first.startswith("Timestamp: 2023-11-14T22:13:21.000Z Type: test     Iteration: 10")
    assert "accuracy: 0.5" in first and "loss: 0.5" in first


def test_metric_data_tolerates_string_numbers() -> None:
    record = metric_item(1, 0.25)
    record["meta"]["time"] = str(T0 + 7)
    data = metric_data(record)
    assert data["timestamp"] == "2023-11-14T22:13:20.007Z"
    assert data["Values"]["accuracy"] == 0.25


def test_since_is_read_as_milliseconds_or_iso() -> None:
    assert since_millis(str(T0)) == T0
    assert since_millis("2023-11-14T22:13:20Z") == T0
    assert since_millis("2023-11-14T22:13:20") == T0
    assert since_millis(None) is None
    assert since_millis("yesterday") is None
    assert since_millis("inf") is None
