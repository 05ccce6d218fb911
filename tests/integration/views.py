"""What tests read off a live server about jobs and nodes, in the shapes they compare."""

from __future__ import annotations

import io
import json
import re
import zipfile
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.integration.live import LiveServer


def status(model: dict[str, Any]) -> str:
    return str(model["training"]["training_status"]["status"])


def nodes(server: LiveServer) -> dict[str, dict[str, Any]]:
    return {n["name"]: n for n in server.client.get("/v1/nodes").json()["nodes"]}


def drain(server: LiveServer, name: str, drained: bool) -> None:
    verb = "drain" if drained else "undrain"
    response = server.client.post(f"/v1/nodes/{name}/{verb}", json={"reason": "test"})
    assert response.status_code == 200, response.text


def lines(server: LiveServer, job_id: str) -> list[str]:
    return [str(item["line"]) for item in server.loglines(job_id)]


def steps(printed: list[str]) -> list[int]:
    """The numbers of the ``step N`` lines, in order."""
    return [int(m.group(1)) for line in printed if (m := re.fullmatch(r"step (\d+)", line))]


def trained_model(server: LiveServer, job_id: str) -> dict[str, Any]:
    """The ``model.json`` in the job's trained model download."""
    response = server.client.get(f"/v1/models/{job_id}/trained_model")
    assert response.status_code == 200, response.text
    with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
        name = next(n for n in archive.namelist() if n.endswith("model.json"))
        result: dict[str, Any] = json.loads(archive.read(name))
    return result


def metric(server: LiveServer, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples in the server's ``/metrics`` (scraped as the platform
    admin) whose labels include ``labels``; 0 when there is none."""
    response = server.client.get("/metrics")
    assert response.status_code == 200, response.text
    wanted = set(labels.items())
    return sum(
        sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
        if sample.name == name and wanted <= set(sample.labels.items())
    )
