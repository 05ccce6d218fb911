"""Tests for checkpoints: formats, keep-last-K, and surviving a writer killed mid-save."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ffdl.sdk import checkpoint
from ffdl.sdk.api import latest_checkpoint, load_checkpoint, save_checkpoint

ZIP_MAGIC = b"PK\x03\x04"
LARGE_PAYLOAD_BYTES = 16 * 1024 * 1024

# Saves a large state with the pickle writer (torch hidden), which streams the big payload
# to the temporary file before it reaches an object that blocks, so the writer can be
# killed with a half-written file on disk.
KILLED_WRITER_SCRIPT = """
import sys
sys.modules["torch"] = None
from pathlib import Path
from ffdl.sdk.api import save_checkpoint

directory, marker, payload_size = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])

class BlocksWhileBeingWritten:
    def __reduce__(self):
        marker.touch()
        sys.stdin.read()
        return (BlocksWhileBeingWritten, ())

save_checkpoint({"payload": bytes(payload_size), "tail": BlocksWhileBeingWritten()}, 3,
                directory=directory)
"""


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def checkpoint_names(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.glob("ckpt-*.pt"))


def temp_files(directory: Path) -> list[Path]:
    return sorted(directory.glob(".ckpt-*.tmp"))


def test_bytes_state_round_trips_through_pickle(tmp_path: Path) -> None:
    state = b"\x00\x01model bytes" * 100

    path = save_checkpoint(state, 12, directory=tmp_path)

    assert path == tmp_path / "ckpt-000000012.pt"
    assert not path.read_bytes().startswith(ZIP_MAGIC)
    assert load_checkpoint(tmp_path) == (12, state)


def test_torch_state_round_trips_through_torch_save(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(4, 2)
    state = {"model": model.state_dict(), "epoch": 5, "history": [0.9, 0.5]}

    path = save_checkpoint(state, 5, directory=tmp_path)
    loaded = load_checkpoint(tmp_path)

    assert path.read_bytes().startswith(ZIP_MAGIC)
    assert loaded is not None
    step, loaded_state = loaded
    assert step == 5
    assert loaded_state["epoch"] == 5
    assert loaded_state["history"] == [0.9, 0.5]
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded_state["model"][name], tensor)


def test_only_the_newest_k_checkpoints_are_kept(tmp_path: Path) -> None:
    for step in range(1, 7):
        save_checkpoint(f"state {step}".encode(), step, keep=3, directory=tmp_path)

    assert checkpoint_names(tmp_path) == [
        "ckpt-000000004.pt",
        "ckpt-000000005.pt",
        "ckpt-000000006.pt",
    ]
    assert latest_checkpoint(tmp_path) == tmp_path / "ckpt-000000006.pt"

    save_checkpoint(b"state 7", 7, keep=1, directory=tmp_path)

    assert checkpoint_names(tmp_path) == ["ckpt-000000007.pt"]
    assert load_checkpoint(tmp_path) == (7, b"state 7")


def test_newest_is_decided_by_step_not_by_write_order(tmp_path: Path) -> None:
    save_checkpoint(b"late step", 100, directory=tmp_path)
    save_checkpoint(b"early step", 9, directory=tmp_path)

    assert load_checkpoint(tmp_path) == (100, b"late step")


def test_saving_a_step_again_replaces_it(tmp_path: Path) -> None:
    save_checkpoint(b"first", 2, directory=tmp_path)
    save_checkpoint(b"second", 2, directory=tmp_path)

    assert checkpoint_names(tmp_path) == ["ckpt-000000002.pt"]
    assert load_checkpoint(tmp_path) == (2, b"second")
    assert temp_files(tmp_path) == []


def test_default_directory_is_checkpoint_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    directory = tmp_path / "job" / "checkpoints"
    monkeypatch.setenv("CHECKPOINT_DIR", str(directory))

    path = save_checkpoint(b"state", 1)

    assert path == directory / "ckpt-000000001.pt"
    assert latest_checkpoint() == path
    assert load_checkpoint() == (1, b"state")


def test_checkpoints_get_the_usual_file_permissions(tmp_path: Path) -> None:
    previous_umask = os.umask(0o022)
    try:
        path = save_checkpoint(b"state", 1, directory=tmp_path)
    finally:
        os.umask(previous_umask)

    assert path.stat().st_mode & 0o777 == 0o644


def test_empty_or_missing_directory_has_no_checkpoint(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path) is None
    assert load_checkpoint(tmp_path) is None
    assert latest_checkpoint(tmp_path / "missing") is None
    assert load_checkpoint(tmp_path / "missing") is None


@pytest.mark.parametrize(("step", "keep"), [(-1, 3), (True, 3), (1, 0), (1, -2)])
def test_invalid_step_or_keep_is_rejected(tmp_path: Path, step: int, keep: int) -> None:
    with pytest.raises(ValueError):
        save_checkpoint(b"state", step, keep=keep, directory=tmp_path)
    assert checkpoint_names(tmp_path) == []


def test_truncated_newest_and_stray_temp_file_fall_back_to_previous_good(
    tmp_path: Path,
) -> None:
    torch = pytest.importorskip("torch")
    save_checkpoint({"weights": torch.zeros(1000)}, 1, directory=tmp_path)
    save_checkpoint({"weights": torch.ones(1000)}, 2, directory=tmp_path)
    newest = save_checkpoint({"weights": torch.full((1000,), 3.0)}, 3, directory=tmp_path)
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    (tmp_path / ".ckpt-otherhost-12345-0123abcd.tmp").write_bytes(b"half a checkpoint")

    loaded = load_checkpoint(tmp_path)

    assert loaded is not None
    step, state = loaded
    assert step == 2
    assert torch.equal(state["weights"], torch.ones(1000))


def test_every_checkpoint_unreadable_loads_nothing(tmp_path: Path) -> None:
    (tmp_path / "ckpt-000000001.pt").write_bytes(b"not a pickle")
    (tmp_path / "ckpt-000000002.pt").write_bytes(ZIP_MAGIC + b"truncated zip")

    assert load_checkpoint(tmp_path) is None


def test_writer_killed_mid_save_leaves_previous_checkpoints_intact(tmp_path: Path) -> None:
    directory = tmp_path / "checkpoints"
    save_checkpoint(b"good state 1", 1, directory=directory)
    save_checkpoint(b"good state 2", 2, directory=directory)
    marker = tmp_path / "writing"
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            KILLED_WRITER_SCRIPT,
            str(directory),
            str(marker),
            str(LARGE_PAYLOAD_BYTES),
        ],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: marker.exists() or writer.poll() is not None, 30, "the writer to block")
        assert writer.poll() is None, writer.communicate()[1].decode()
        (partial,) = temp_files(directory)
        assert partial.stat().st_size >= LARGE_PAYLOAD_BYTES, "payload is already on disk"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.communicate(timeout=30)
    assert writer.returncode == -signal.SIGKILL

    assert checkpoint_names(directory) == ["ckpt-000000001.pt", "ckpt-000000002.pt"]
    assert latest_checkpoint(directory) == directory / "ckpt-000000002.pt"
    assert load_checkpoint(directory) == (2, b"good state 2")

    # The next save on this host cleans up what the dead writer left behind.
    save_checkpoint(b"good state 4", 4, directory=directory)
    assert temp_files(directory) == []
    assert load_checkpoint(directory) == (4, b"good state 4")


def test_temp_files_of_live_writers_and_other_hosts_are_left_alone(tmp_path: Path) -> None:
    live_writer = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        host = checkpoint._host_tag()
        live = tmp_path / f".ckpt-{host}-{live_writer.pid}-00ff.tmp"
        other_host = tmp_path / f".ckpt-{host}x-{live_writer.pid + 1}-00ff.tmp"
        live.write_bytes(b"in progress")
        other_host.write_bytes(b"in progress elsewhere")

        save_checkpoint(b"state", 1, directory=tmp_path)

        assert temp_files(tmp_path) == sorted([live, other_host])
    finally:
        live_writer.communicate(timeout=30)


# Prints a line to its stdout pipe, then saves; the parent decides when the line is read.
PRINT_THEN_SAVE_SCRIPT = """
import sys
from pathlib import Path
from ffdl.sdk.api import save_checkpoint

print("chaos line 5", flush=True)
save_checkpoint(b"5", 5, directory=Path(sys.argv[1]), output_wait_s=float(sys.argv[2]))
"""


def start_print_then_save(directory: Path, output_wait_s: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", PRINT_THEN_SAVE_SCRIPT, str(directory), str(output_wait_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def finish(saver: subprocess.Popen[bytes]) -> tuple[bytes, bytes]:
    """The saver's output, once it has ended (killed if it has not)."""
    if saver.poll() is None:
        saver.kill()
    return saver.communicate(timeout=30)


def stays_false(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return False
        time.sleep(0.01)
    return True


def test_a_checkpoint_appears_only_once_the_lines_printed_before_it_are_read(
    tmp_path: Path,
) -> None:
    # A controller killed with the line still in the pipe would lose it, and a job resumed
    # from this checkpoint would never print it again.
    directory = tmp_path / "checkpoints"
    saver = start_print_then_save(directory, output_wait_s=60)
    try:
        wait_for(
            lambda: bool(temp_files(directory)) or saver.poll() is not None,
            30,
            "the state to be written",
        )
        assert stays_false(lambda: bool(checkpoint_names(directory)), 1.5), "saved unread"
        assert saver.poll() is None
        assert saver.stdout is not None
        assert saver.stdout.readline() == b"chaos line 5\n"
        wait_for(lambda: saver.poll() is not None, 30, "the save to finish")
    finally:
        _, stderr = finish(saver)
    assert saver.returncode == 0, stderr.decode()
    assert load_checkpoint(directory) == (5, b"5")


def test_a_reader_that_never_reads_delays_a_save_only_until_its_deadline(tmp_path: Path) -> None:
    directory = tmp_path / "checkpoints"
    saver = start_print_then_save(directory, output_wait_s=0.3)
    try:
        wait_for(lambda: saver.poll() is not None, 30, "the save to give up waiting")
    finally:
        stdout, stderr = finish(saver)
    assert saver.returncode == 0, stderr.decode()
    assert stdout == b"chaos line 5\n"
    assert load_checkpoint(directory) == (5, b"5")


@pytest.mark.parametrize("output_wait_s", [-1, True, "5", float("nan")])
def test_an_invalid_output_wait_is_rejected(tmp_path: Path, output_wait_s: object) -> None:
    with pytest.raises(ValueError, match="output_wait_s"):
        save_checkpoint(b"state", 1, directory=tmp_path, output_wait_s=output_wait_s)  # type: ignore[arg-type]
    assert checkpoint_names(tmp_path) == []
