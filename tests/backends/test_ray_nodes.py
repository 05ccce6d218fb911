"""How a Ray node's description becomes an ffdl node: GPUs or CPU slots, GPU type from a
label or an ``accelerator_type:`` resource, and labels from Ray's labels and custom resources."""

from __future__ import annotations

from typing import Any

from ffdl.backends.ray_driver import describe_node

MIB = 1024 * 1024


def raw(resources: dict[str, float], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "NodeID": "f" * 56,
        "NodeManagerAddress": "127.0.0.1",
        "Resources": resources,
        "Labels": labels or {},
    }


def test_a_gpu_node_with_custom_resources_and_labels() -> None:
    node = describe_node(
        raw(
            {
                "CPU": 16.0,
                "GPU": 8.0,
                "memory": 64.0 * 1024 * MIB,
                "object_store_memory": 1.0,
                "node:127.0.0.1": 1.0,
                "accelerator_type:A100": 1.0,
                "rack:r2": 1.0,
                "nvlink": 2.0,
            },
            {"ffdl.node": "gpu-3", "zone": "eu-1", "ray.io/node-id": "x"},
        )
    )
    assert node["name"] == "gpu-3"
    assert (node["gpus"], node["cpus"], node["memory_mb"]) == (8, 16.0, 64 * 1024)
    assert node["gpu_type"] == "A100"
    assert node["labels"] == {
        "zone": "eu-1",
        "rack": "r2",
        "nvlink": "2",
        "ray_node_id": "f" * 56,
        "address": "127.0.0.1",
    }


def test_the_accelerator_label_wins_over_the_resource() -> None:
    node = describe_node(
        raw({"GPU": 4.0, "accelerator_type:V100": 1.0}, {"ray.io/accelerator-type": "H100"})
    )
    assert node["gpu_type"] == "H100"


def test_a_node_without_gpus_offers_its_cpus_as_slots_and_is_named_by_its_id() -> None:
    node = describe_node(raw({"CPU": 6.0, "memory": 8.0 * 1024 * MIB}))
    assert node["name"] == "ray-ffffffffffff"
    assert (node["gpus"], node["gpu_type"], node["cpus"]) == (6, "cpu", 6.0)
