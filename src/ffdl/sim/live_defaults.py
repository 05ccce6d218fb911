"""The live autoscaler's settings, as the simulators' elastic policies take them by default.

A simulated ``elastic`` policy is meant to measure what the platform runs, so its knobs
start from ``Settings``' own defaults (read here, once) rather than from copies that drift.
"""

from __future__ import annotations

from ffdl.elastic.optimizer import Objective
from ffdl.server.settings import Settings


def live_default(name: str) -> float:
    """The default of the numeric setting ``name`` (``restart_penalty``, ...)."""
    return float(Settings.model_fields[name].default)


LIVE_OBJECTIVE: Objective = Settings.model_fields["elastic_objective"].default
