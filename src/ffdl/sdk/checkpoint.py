"""Crash-safe checkpoints: atomic saves, keep-last-K pruning, and loading the newest good one.

A checkpoint is ``ckpt-{step:09d}.pt`` in the job's checkpoint directory. It is written to a
hidden temporary file in the same directory, flushed and fsynced, then renamed into place,
so a learner killed mid-save (the platform's halt ends in SIGKILL) leaves the earlier
checkpoints intact and never a half file under a checkpoint name. Loading still verifies:
a file that fails to load (truncated or corrupted by other means) is skipped in favour of
the next older one.

States are written with ``torch.save`` when torch is importable, else with ``pickle``;
``bytes`` states always use ``pickle``. Loading tells the formats apart by content.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import pickle
import re
import secrets
import socket
from pathlib import Path
from typing import IO, Any

from ffdl.sdk.context import job_directory
from ffdl.sdk.output_drain import OUTPUT_READ_WAIT_S, wait_until_output_is_read

logger = logging.getLogger(__name__)

CHECKPOINT_PATTERN = re.compile(r"^ckpt-(\d{9,})\.pt$")
_TEMP_PREFIX = ".ckpt-"
_TEMP_SUFFIX = ".tmp"
# Host names are sanitised to exclude "-", so the fields split unambiguously.
_TEMP_PATTERN = re.compile(r"^\.ckpt-(?P<host>[A-Za-z0-9_.]+)-(?P<pid>\d+)-[0-9a-f]+\.tmp$")
_ZIP_MAGIC = b"PK\x03\x04"


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:09d}.pt"


def _directory_or_default(directory: Path | None) -> Path:
    return Path(directory) if directory is not None else job_directory("CHECKPOINT_DIR")


def _checkpoints_newest_first(directory: Path) -> list[tuple[int, Path]]:
    if not directory.is_dir():
        return []
    found: list[tuple[int, Path]] = []
    for entry in directory.iterdir():
        match = CHECKPOINT_PATTERN.match(entry.name)
        if match and entry.is_file():
            found.append((int(match.group(1)), entry))
    found.sort(key=lambda item: item[0], reverse=True)
    return found


def _host_tag() -> str:
    return re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname()) or "host"


def _temp_prefix() -> str:
    # Host and pid in the name let a later save recognise leftovers of a dead writer on this
    # host without touching a file another learner sharing the directory is still writing.
    return f"{_TEMP_PREFIX}{_host_tag()}-{os.getpid()}-"


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_dead_writers_temp_files(directory: Path) -> None:
    host = _host_tag()
    for entry in directory.iterdir():
        match = _TEMP_PATTERN.match(entry.name)
        if not match or match.group("host") != host:
            continue
        pid = int(match.group("pid"))
        if pid != os.getpid() and not _process_alive(pid):
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()


def _torch_module() -> Any | None:
    try:
        import torch
    except ImportError:
        return None
    return torch


def _write_state(state: Any, stream: IO[bytes]) -> None:
    torch = None if isinstance(state, bytes | bytearray | memoryview) else _torch_module()
    if torch is not None:
        torch.save(state, stream)
    else:
        pickle.dump(state, stream, protocol=pickle.HIGHEST_PROTOCOL)


def _fsync_directory(directory: Path) -> None:
    # Makes the rename itself durable; some filesystems refuse to open or sync directories.
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP):
            raise
    finally:
        os.close(descriptor)


def save_checkpoint(
    state: Any,
    step: int,
    *,
    keep: int = 3,
    directory: Path | None = None,
    output_wait_s: float = OUTPUT_READ_WAIT_S,
) -> Path:
    """Atomically write ``state`` as the checkpoint for ``step``; keep the newest ``keep``.

    Saving a step that already has a checkpoint replaces it. Returns the checkpoint's path.
    Before the checkpoint appears, waits up to ``output_wait_s`` until what the process
    printed has been read from its stdout and stderr pipes (see ``output_drain``), so that
    a job resumed from this checkpoint never skips a line its controller did not receive.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be a positive integer, got {keep!r}")
    if isinstance(output_wait_s, bool) or not isinstance(output_wait_s, int | float):
        raise ValueError(f"output_wait_s must be a number of seconds, got {output_wait_s!r}")
    if not output_wait_s >= 0:
        raise ValueError(f"output_wait_s must be 0 or more, got {output_wait_s!r}")
    target_directory = _directory_or_default(directory)
    target_directory.mkdir(parents=True, exist_ok=True)
    _remove_dead_writers_temp_files(target_directory)

    target = target_directory / checkpoint_name(step)
    temp_path = target_directory / f"{_temp_prefix()}{secrets.token_hex(8)}{_TEMP_SUFFIX}"
    # Not mkstemp: its 0600 mode would survive the rename, and checkpoints get the
    # permissions (umask) of any other file the job writes.
    descriptor = os.open(temp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(descriptor, "wb") as stream:
            _write_state(state, stream)
            stream.flush()
            os.fsync(stream.fileno())
        wait_until_output_is_read(output_wait_s)
        os.replace(temp_path, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_path)
        raise
    _fsync_directory(target_directory)

    for _, stale in _checkpoints_newest_first(target_directory)[keep:]:
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
    return target


def latest_checkpoint(directory: Path | None = None) -> Path | None:
    """The checkpoint with the highest step, or ``None`` when there is none.

    This looks at names only; :func:`load_checkpoint` also verifies the content.
    """
    found = _checkpoints_newest_first(_directory_or_default(directory))
    return found[0][1] if found else None


def _read_state(path: Path, map_location: str) -> Any:
    with path.open("rb") as stream:
        written_by_torch = stream.read(len(_ZIP_MAGIC)) == _ZIP_MAGIC
    if written_by_torch:
        torch = _torch_module()
        if torch is None:
            raise RuntimeError("checkpoint was written by torch.save but torch is not installed")
        # weights_only=False: these files are the job's own checkpoints in its own
        # directory, and states routinely hold objects the weights-only loader rejects.
        return torch.load(path, map_location=map_location, weights_only=False)
    with path.open("rb") as stream:
        return pickle.load(stream)


def load_checkpoint(
    directory: Path | None = None, map_location: str = "cpu"
) -> tuple[int, Any] | None:
    """``(step, state)`` of the newest checkpoint that loads, or ``None`` if none does.

    Unreadable checkpoints are logged and skipped, falling back to older ones.
    """
    for step, path in _checkpoints_newest_first(_directory_or_default(directory)):
        try:
            state = _read_state(path, map_location)
        except FileNotFoundError:
            continue
        except Exception as exc:
            logger.warning("skipping unreadable checkpoint %s: %s", path, exc)
            continue
        return step, state
    return None
