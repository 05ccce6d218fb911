"""The pool as ``/v1/cluster/pool`` shows it, read by whichever worker answers.

The controller rewrites ``pool.json`` every ``pool_interval_s``; a worker serves it as it
is, with its own pid and the file's age added. Served by a process that is not in a pool
(``ffdl up`` without ``--workers``), the view says so: one process, no pool.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

from ffdl.server.pool.config import pool_bounds
from ffdl.server.pool.files import STATE_FILE, read_json, run_dir
from ffdl.server.settings import Settings


def pool_view(settings: Settings) -> dict[str, Any]:
    answered_by = os.getpid()
    if pool_bounds(settings) is None:
        return {
            "enabled": False,
            "size": 1,
            "min": 1,
            "max": 1,
            "workers": [{"pid": answered_by, "state": "serving"}],
            "signals": None,
            "changes_total": {"grow": 0, "shrink": 0},
            "changes": [],
            "answered_by": answered_by,
        }
    state = read_json(run_dir(settings.home, settings.port) / STATE_FILE)
    # Only our own master's file: one left by an earlier pool on this port is stale.
    if state is None or state.get("master_pid") != os.getppid():
        return {"enabled": True, "available": False, "answered_by": answered_by}
    updated = state.get("updated_at")
    if isinstance(updated, str):
        age = datetime.now(UTC) - datetime.fromisoformat(updated)
        state["age_s"] = round(age.total_seconds(), 3)
    state["answered_by"] = answered_by
    return state
