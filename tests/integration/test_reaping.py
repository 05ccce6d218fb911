"""The server reaps every learner controller it started once it ends: no zombies pile up
while the server runs."""

from __future__ import annotations

from pathlib import Path

from tests.integration.live import LiveServer, manifest_yaml, wait_for


def children(pid: int) -> dict[int, str]:
    """Every child process of ``pid`` with its state letter (``Z``: a zombie)."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields follow its last ')'.
        state, ppid = stat[stat.rfind(")") + 2 :].split()[:2]
        if int(ppid) == pid:
            found[int(entry.name)] = state
    return found


def test_finished_controllers_leave_no_zombies(server: LiveServer) -> None:
    assert server.proc is not None
    server_pid = server.proc.pid
    jobs = [server.submit_ok(manifest_yaml(f"echo job {n}", gpus=0)) for n in range(3)]
    for job_id in jobs:
        server.wait_status(job_id, {"COMPLETED"})
    controllers = {
        int(path.read_text())
        for job_id in jobs
        for path in (server.home / "jobs" / job_id / "learners").glob("*/*/launched.pid")
    }
    assert len(controllers) == 3

    def reaped() -> bool:
        # A controller reports COMPLETED before it exits: wait for it to be gone.
        return not (set(children(server_pid)) & controllers)

    wait_for(reaped, timeout=15, what="the finished controllers to be reaped")
    assert [pid for pid, state in children(server_pid).items() if state == "Z"] == []
