"""Where a pool keeps its run files, and how they are written.

``<home>/run/pool-<port>/`` holds one ``worker-<pid>.json`` per worker (its load counters,
rewritten by the worker every half second) and ``pool.json`` (the controller's view: size,
bounds, signals, recent changes), which every worker reads to answer ``/v1/cluster/pool``.
Each file is replaced whole (written aside, then renamed), so a reader never sees half of
one.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

STATE_FILE = "pool.json"


def run_dir(home: Path, port: int) -> Path:
    return home / "run" / f"pool-{port}"


def worker_file(directory: Path, pid: int) -> Path:
    return directory / f"worker-{pid}.json"


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Replace ``path`` with ``data`` at once (a rename), never leaving half a file."""
    aside = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    text = json.dumps(data, separators=(",", ":"))
    try:
        aside.write_text(text)
    except FileNotFoundError:  # someone removed the run directory: make it again
        path.parent.mkdir(parents=True, exist_ok=True)
        aside.write_text(text)
    os.replace(aside, path)


def read_json(path: Path) -> dict[str, Any] | None:
    """``path``'s object, or None when it is missing or not a JSON object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def clear(directory: Path) -> None:
    """Remove the files a previous pool on this port left behind."""
    if directory.is_dir():
        for leftover in directory.iterdir():
            if leftover.is_file():
                remove(leftover)
