"""What ``ffdl up`` prints for the person who started it, read from a real ``ffdl up``: how
to point the ``ffdl`` command at it from another shell (which then works) and the
dashboard's sign-in link, whose token only a terminal is shown."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.live import free_port

UP = [sys.executable, "-m", "ffdl.cli.main", "up"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FFDL_", "DLAAS_"))}
    env.update(extra)
    return env


class Up:
    """``ffdl up`` in the background, its output read as it comes (from a pty or a pipe)."""

    def __init__(self, args: list[str], env: dict[str, str], *, terminal: bool) -> None:
        if terminal:
            self._reader, writer = pty.openpty()
        else:
            self._reader, writer = os.pipe()
        self.proc = subprocess.Popen(
            [*UP, *args], stdout=writer, stderr=subprocess.STDOUT, env=env, close_fds=True
        )
        os.close(writer)
        self.output = ""

    def wait_for(self, text: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            left = deadline - time.monotonic()
            assert left > 0 and self.proc.poll() is None, f"no {text!r} in:\n{self.output}"
            ready, _, _ = select.select([self._reader], [], [], min(left, 0.5))
            # A pty's reads fail once the process has ended; the loop's assertion says so.
            if ready:
                with contextlib.suppress(OSError):
                    self.output += os.read(self._reader, 65536).decode(errors="replace")
        return self.output

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        os.close(self._reader)


@pytest.fixture
def started() -> Iterator[list[Up]]:
    running: list[Up] = []
    yield running
    for up in running:
        up.stop()


def _ffdl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ffdl.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_up_in_a_terminal_says_how_to_reach_it_and_links_the_dashboard(
    tmp_path: Path, started: list[Up]
) -> None:
    home, port = tmp_path / "home", free_port()
    up = Up(["--home", str(home), "--port", str(port)], _env(), terminal=True)
    started.append(up)
    output = up.wait_for("API docs:")
    client = home / "client.json"
    token = json.loads(client.read_text())["token"]
    assert f"ffdl is up at http://127.0.0.1:{port} (home {home})" in output
    assert f"export FFDL_CONFIG={client}" in output
    assert f"dashboard: http://127.0.0.1:{port}/#token={token}" in output

    # Another shell, told only what ffdl up said.
    assert "no ffdl server configured" in _ffdl("list", env=_env()).stderr
    listed = _ffdl("list", env=_env(FFDL_CONFIG=str(client)))
    assert listed.returncode == 0, listed.stderr
    assert "No models." in listed.stdout


def test_up_as_a_service_keeps_the_token_out_of_its_output(
    tmp_path: Path, started: list[Up]
) -> None:
    # Its default home (FFDL_HOME), output to a pipe, as under a service manager.
    home, port = tmp_path / "home", free_port()
    up = Up(["--port", str(port)], _env(FFDL_HOME=str(home)), terminal=False)
    started.append(up)
    output = up.wait_for("API docs:")
    token = json.loads((home / "client.json").read_text())["token"]
    assert token not in output
    assert f"sign in with the token in {home / 'client.json'}" in output
    assert "the ffdl command finds it (this is its default home)" in output
    listed = _ffdl("list", env=_env(FFDL_HOME=str(home)))
    assert listed.returncode == 0, listed.stderr
