"""The local backend's launch is idempotent per attempt, even for a launcher that died
between starting a controller and recording its pid (a replica killed mid-deploy): the
next launcher adopts the running controller instead of starting a second one beside it."""

from __future__ import annotations

from pathlib import Path

from ffdl.backends.base import LaunchRequest, LearnerState
from ffdl.backends.local import LocalBackend, LocalConfig
from tests.learner.test_controller import make_spec
from tests.learner.test_recording_api import RecordingApi, api, wait_until

__all__ = ["api"]


def controllers_of(spec_path: str) -> list[int]:
    """Pids of live processes whose command line names ``spec_path``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
            except OSError:
                continue
            if spec_path.encode() in argv and state != "Z":
                found.append(int(entry.name))
    return found


def test_a_launch_whose_pid_was_never_recorded_adopts_the_running_controller(
    tmp_path: Path, api: RecordingApi
) -> None:
    backend = LocalBackend(LocalConfig(home=str(tmp_path), sandbox=False))
    spec = make_spec(tmp_path, api.url, "sleep 60")
    request = LaunchRequest("local", (), spec)
    first = backend.launch(request)
    try:
        wait_until(lambda: backend.poll(first).state == LearnerState.RUNNING, what="controller up")
        # The first launcher is killed after Popen, before it writes the pid file.
        (Path(spec.state_dir) / "launched.pid").unlink()
        again = backend.launch(request)
        assert again["pid"] == first["pid"]
        assert controllers_of(str(first["spec"])) == [first["pid"]], "one controller"
        assert (Path(spec.state_dir) / "launched.pid").read_text() == str(first["pid"])
    finally:
        backend.kill(first)
    wait_until(lambda: not controllers_of(str(first["spec"])), what="controller gone")
    # With none running, a launch starts one afresh.
    (Path(spec.state_dir) / "launched.pid").unlink()
    (Path(spec.state_dir) / "result.json").unlink(missing_ok=True)
    fresh = backend.launch(request)
    try:
        assert fresh["pid"] != first["pid"]
        assert controllers_of(str(fresh["spec"])) == [fresh["pid"]]
    finally:
        backend.kill(fresh)
