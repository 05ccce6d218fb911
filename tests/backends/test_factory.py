"""Opening the configured backend (``ffdl.backends.factory``)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest

from ffdl.backends.base import BackendConfigError
from ffdl.backends.factory import RAY_MISSING, open_backend
from ffdl.backends.local import LocalBackend, LocalConfig
from ffdl.backends.ray_config import RayConfig
from ffdl.core.resources import Node


def test_a_local_config_opens_the_local_backend(tmp_path: Path) -> None:
    nodes = (Node(name="node-a", gpus=2, cpus=8, memory_mb=4096, gpu_type="cpu"),)
    backend = open_backend(LocalConfig(home=str(tmp_path), sandbox=False, nodes=nodes))
    assert isinstance(backend, LocalBackend)
    assert backend.nodes() == list(nodes)
    assert backend.problem() is None
    backend.close()


def test_without_declared_nodes_the_local_backend_is_this_host(tmp_path: Path) -> None:
    backend = open_backend(LocalConfig(home=str(tmp_path), sandbox=False, cpu_slots=3))
    [node] = backend.nodes()
    assert node.name == "local"
    if node.gpu_type == "cpu":  # a host without GPUs offers the CPU slots it was given
        assert node.gpus == 3


class _RayIsMissing(importlib.abc.MetaPathFinder):
    """Makes importing the Ray backend fail as it does where Ray is not installed."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "ffdl.backends.ray_backend":
            raise ModuleNotFoundError("No module named 'ray'", name="ray")
        return None


def test_a_ray_config_without_ray_installed_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "ffdl.backends.ray_backend", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_RayIsMissing(), *sys.meta_path])
    config = RayConfig(address="127.0.0.1:1", home="/tmp/h", api_url="http://127.0.0.1:1")
    with pytest.raises(BackendConfigError) as caught:
        open_backend(config)
    assert str(caught.value) == RAY_MISSING == "the Ray backend needs Ray: pip install 'ffdl[ray]'"
