"""The systemd units shipped in deploy/systemd: they delegate a cgroup subtree (learners'
memory limits need it) and start commands whose every flag the tools still accept."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer.main

from ffdl.cli.main import app

UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"


def _service_section(unit: str) -> dict[str, str]:
    """The [Service] keys of a unit file, continuation lines joined."""
    text = (UNITS / unit).read_text().replace("\\\n", " ")
    section, found = "", {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            found[key] = value.strip()
    return found


def _flags(command: str) -> list[str]:
    return [word.split("=")[0] for word in command.split() if word.startswith("--")]


@pytest.mark.parametrize("unit", ["ffdl.service", "ffdl-ray-node.service"])
def test_a_unit_delegates_a_subtree_for_learner_cgroups(unit: str) -> None:
    service = _service_section(unit)
    assert service["Delegate"] == "yes"
    # The service's own processes in a child, so that its cgroup may enable controllers.
    assert service["DelegateSubgroup"] == "supervisor"
    assert service["Type"] == "exec"


def test_the_platform_unit_starts_ffdl_up_with_flags_it_accepts() -> None:
    service = _service_section("ffdl.service")
    words = service["ExecStart"].split()
    assert Path(words[0]).name == "ffdl" and words[1] == "up"
    up = typer.main.get_command(app).commands["up"]  # type: ignore[attr-defined]
    accepted = {opt for param in up.params for opt in param.opts}
    assert set(_flags(service["ExecStart"])) <= accepted
    # Learners outlive a restart of the control plane: only the server is signalled.
    assert service["KillMode"] == "process"


def test_the_ray_node_unit_starts_ray_with_flags_it_accepts() -> None:
    from ray.scripts.scripts import start  # the test environment has ffdl[ray]

    service = _service_section("ffdl-ray-node.service")
    words = service["ExecStart"].split()
    assert Path(words[0]).name == "ray" and words[1:3] == ["start", "--block"]
    # Some of these (--labels) are hidden from `ray start --help` but accepted.
    accepted = {opt for param in start.params for opt in param.opts}
    assert set(_flags(service["ExecStart"])) <= accepted
