"""``ffdl init NAME``: a new project directory with an FfDL manifest and a starter script.

As FfDL's ``init``, it creates the directory ``NAME`` holding ``manifest.yml`` and refuses
when ``NAME`` exists, so nothing is ever overwritten. Unlike FfDL's, what it writes runs on
this platform as written: the framework defaults to ``pytorch`` (``--type``) at the version
of the PyTorch installed beside the CLI (``--version``; left out when there is none, which
selects the platform's default PyTorch runtime), and the starter ``train.py`` trains a small
network on scikit-learn's bundled digits (no download), reporting its progress, saving
checkpoints and its model. Another ``--type`` gets a plain Python starter. The manifest is
parsed before anything is written: what ``init`` writes is always a manifest this platform
accepts.
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Annotated

import typer

from ffdl.core.errors import FfdlError
from ffdl.core.manifest import parse_manifest

MANIFEST_FILE = "manifest.yml"
CODE_FILE = "train.py"
DEFAULT_FRAMEWORK = "pytorch"
EPOCHS = 20


def default_version(framework: str) -> str:
    """The version ``init`` writes for ``framework``: the installed PyTorch's major.minor for
    pytorch (what the platform's own PyTorch runtime serves), else nothing."""
    if framework != "pytorch":
        return ""
    try:
        installed = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return ""
    return ".".join(installed.split("+", 1)[0].split(".")[:2])


class InitError(FfdlError):
    """The project cannot be created where asked."""

    default_code = "INIT"


def _quoted(value: str) -> str:
    # A JSON string is a valid YAML scalar: any name or version stays one string value.
    return json.dumps(value, ensure_ascii=False)


def manifest_text(directory: str, name: str, framework: str, version: str) -> str:
    """The manifest template of project ``name`` (in ``directory``), in FfDL's format."""
    version_line = (
        f"  version: {_quoted(version)}"
        if version
        else "  # version: left out, so the job runs on the platform's default for it"
    )
    return f"""\
# FfDL manifest of the project {name}. Train it and follow it to the end with:
#   ffdl train --follow {directory}/{MANIFEST_FILE} {directory}
name: {_quoted(name)}
description: Your first deep learning model
version: "1.0.0"

# What each learner gets; learners > 1 runs a distributed job. gpus: 0 runs on CPUs only.
gpus: 0
cpus: 1
memory: 2GB
learners: 1

framework:
  name: {_quoted(framework)}
{version_line}
  # Runs in the model directory. $DATA_DIR holds the training data and $RESULT_DIR keeps
  # what the job writes (the trained model).
  command: python3 {CODE_FILE}

# Training data and results in an S3-compatible object store (FfDL's mount_cos or
# s3_datastore): the data bucket is copied into $DATA_DIR before the command starts and
# $RESULT_DIR is uploaded to <results bucket>/<training id>/ when it ends.
# data_stores:
#   - id: sl-internal-os
#     type: mount_cos
#     training_data:
#       container: my-training-data
#     training_results:
#       container: my-training-results
#     connection:
#       auth_url: http://s3.example.com:9000
#       user_name: ACCESS_KEY_ID
#       password: SECRET_ACCESS_KEY

# Evaluation metrics from the TensorBoard event files the job writes under $LOG_DIR/tb:
# evaluation_metrics:
#   type: tensorboard
#   in: "$JOB_STATE_DIR/logs/tb"
"""


PYTORCH_CODE = f'''\
"""Starter training script: a small network on scikit-learn's bundled digits (no download).
Replace the model and data with yours; keep the calls to ffdl.sdk.api, which let the
platform show your progress and time left, halt and resume the job, and keep its model."""

import torch
from sklearn.datasets import load_digits
from torch import nn

from ffdl.sdk.api import context, install_stop_handler, load_checkpoint, report
from ffdl.sdk.api import save_checkpoint, should_stop

EPOCHS = {EPOCHS}

install_stop_handler()  # a halt lets the current epoch end, then the job checkpoints
job = context()
digits = load_digits()
images = torch.tensor(digits.data, dtype=torch.float32) / 16.0
labels = torch.tensor(digits.target)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
print(f"training on {{torch.cuda.get_device_name(0) if device.type == 'cuda' else 'cpu'}}")
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
images, labels = images.to(device), labels.to(device)

first = 1
resumed = load_checkpoint(job.checkpoint_dir, map_location=str(device))
if resumed is not None:
    model.load_state_dict(resumed[1]["model"])
    first = resumed[1]["epoch"] + 1
    print(f"resumed from epoch {{first - 1}}")

for epoch in range(first, EPOCHS + 1):
    if should_stop():
        break
    for batch in torch.randperm(len(images), device=device).split(64):
        loss = nn.functional.cross_entropy(model(images[batch]), labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    accuracy = (model(images).argmax(1) == labels).float().mean().item()
    print(f"epoch {{epoch}}/{{EPOCHS}} loss {{loss.item():.4f}} accuracy {{accuracy:.4f}}")
    # Declaring the total lets ffdl show how far the job has come and its time left.
    report(step=epoch, epoch=epoch, total_epochs=EPOCHS, loss=loss.item(), accuracy=accuracy)
    save_checkpoint({{"model": model.state_dict(), "epoch": epoch}}, epoch)

if not should_stop():
    job.result_dir.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), job.result_dir / "model.pt")
    print(f"model saved to {{job.result_dir / 'model.pt'}}")
'''

PLAIN_CODE = f'''\
"""Starter training script: replace it with your model. Submitted with {MANIFEST_FILE}."""

import os
import pathlib

data_dir = os.environ.get("DATA_DIR", ".")
result_dir = pathlib.Path(os.environ.get("RESULT_DIR", "results"))
print(f"training with data from {{data_dir}}")
result_dir.mkdir(parents=True, exist_ok=True)
(result_dir / "model.txt").write_text("trained\\n")
print(f"model saved to {{result_dir / 'model.txt'}}")
'''


def starter_code(framework: str) -> str:
    return PYTORCH_CODE if framework.strip().lower() == "pytorch" else PLAIN_CODE


def create_project(directory: Path, framework: str, version: str) -> list[Path]:
    """Create ``directory`` with the manifest and starter code; the files written."""
    name = directory.name
    if not name or name in (".", "..") or not str(directory).isprintable():
        raise InitError(f"project name {str(directory)!r} does not name a directory to create")
    if directory.exists() or directory.is_symlink():
        raise InitError(f"project directory '{directory}' already exists")
    manifest = manifest_text(str(directory), name, framework, version)
    parse_manifest(manifest)  # a bad --type/--version is refused before anything is written
    try:
        directory.mkdir()
    except FileExistsError as exc:
        raise InitError(f"project directory '{directory}' already exists") from exc
    except OSError as exc:
        raise InitError(f"cannot create project directory '{directory}': {exc.strerror}") from exc
    written = []
    for file_name, text in ((MANIFEST_FILE, manifest), (CODE_FILE, starter_code(framework))):
        path = directory / file_name
        # "x": never replace a file, even one that appeared since the directory was made.
        with path.open("x", encoding="utf-8") as out:
            out.write(text)
        written.append(path)
    return written


def init_command(
    name: Annotated[str, typer.Argument(metavar="NAME", help="Project directory to create.")],
    framework: Annotated[
        str,
        typer.Option("--type", help="Deep learning framework (default: pytorch)."),
    ] = DEFAULT_FRAMEWORK,
    version: Annotated[
        str | None,
        typer.Option(
            "--version",
            help="Framework version (default: for pytorch the installed PyTorch's, else none: "
            "the platform's default runtime for the framework).",
        ),
    ] = None,
) -> None:
    """Create a new deep learning project that trains on this platform as written: a
    manifest and a starter train.py (never overwrites anything)."""
    chosen = default_version(framework.strip().lower()) if version is None else version
    written = create_project(Path(name), framework, chosen)
    typer.echo(f"Creating project '{name}'...")
    for path in written:
        typer.echo(f"  adding: {path.name}")
    typer.echo("OK")
