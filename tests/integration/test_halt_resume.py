"""Resume is refused for a job that runs (halt and resume themselves are tested on every
backend in ``test_backends_alike.py``)."""

from __future__ import annotations

from tests.integration.live import LiveServer, manifest_yaml


def test_resume_of_a_running_job_is_refused(server: LiveServer) -> None:
    job_id = server.submit_ok(manifest_yaml("python -c 'import time; time.sleep(20)'"))
    server.wait_status(job_id, {"PROCESSING"})
    response = server.client.patch(f"/v1/models/{job_id}", json={"status": "resume"})
    assert response.status_code == 409
    assert "only HALTED jobs resume" in response.json()["description"]
    server.client.delete(f"/v1/models/{job_id}")
