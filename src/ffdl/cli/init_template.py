"""``ffdl init NAME``: a new project directory with an FfDL manifest and a starter script.

As FfDL's ``init``, it creates the directory ``NAME`` holding ``manifest.yml`` (framework from
``--type``, default ``tensorflow``, and ``--version``, default ``1.0``) and refuses when
``NAME`` exists, so nothing is ever overwritten. The manifest is parsed before anything is
written: what ``init`` writes is always a manifest this platform accepts. A starter
``train.py`` makes ``ffdl train NAME/manifest.yml NAME`` run as it is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ffdl.core.errors import FfdlError
from ffdl.core.manifest import parse_manifest

MANIFEST_FILE = "manifest.yml"
CODE_FILE = "train.py"
DEFAULT_FRAMEWORK = "tensorflow"
DEFAULT_FRAMEWORK_VERSION = "1.0"


class InitError(FfdlError):
    """The project cannot be created where asked."""

    default_code = "INIT"


def _quoted(value: str) -> str:
    # A JSON string is a valid YAML scalar: any name or version stays one string value.
    return json.dumps(value, ensure_ascii=False)


def manifest_text(directory: str, name: str, framework: str, version: str) -> str:
    """The manifest template of project ``name`` (in ``directory``), in FfDL's format."""
    return f"""\
# FfDL manifest of the project {name}. Submit it with:
#   ffdl train {directory}/{MANIFEST_FILE} {directory}
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
  version: {_quoted(version)}
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


CODE_TEXT = f'''\
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
    for file_name, text in ((MANIFEST_FILE, manifest), (CODE_FILE, CODE_TEXT)):
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
        typer.Option("--type", help="Deep learning framework (e.g. tensorflow, pytorch)."),
    ] = DEFAULT_FRAMEWORK,
    version: Annotated[
        str, typer.Option("--version", help="Deep learning framework version.")
    ] = DEFAULT_FRAMEWORK_VERSION,
) -> None:
    """Create a new deep learning project with a manifest (never overwrites anything)."""
    written = create_project(Path(name), framework, version)
    typer.echo(f"Creating project '{name}'...")
    for path in written:
        typer.echo(f"  adding: {path.name}")
    typer.echo("OK")
