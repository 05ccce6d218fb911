"""Packing a model's code for upload: a directory is zipped in memory, a ``.zip`` goes as is."""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

from ffdl.core.errors import ArchiveError

MAX_FILE_BYTES = 100 * 1024 * 1024
# Directories that never belong to a model definition and can be huge.
SKIPPED_DIRS = frozenset({"__pycache__", ".git", ".venv"})


def zip_directory(root: Path, *, max_file_bytes: int = MAX_FILE_BYTES) -> bytes:
    """A zip of every file under ``root`` (paths relative to it), minus ``SKIPPED_DIRS``."""
    if not root.is_dir():
        raise ArchiveError(f"model code directory {root} does not exist")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for dirpath, dirnames, filenames in os.walk(root):
            # Pruning in place stops os.walk from descending into skipped directories.
            dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
            for filename in sorted(filenames):
                path = Path(dirpath) / filename
                if not path.is_file():
                    continue
                size = path.stat().st_size
                relative = path.relative_to(root).as_posix()
                if size > max_file_bytes:
                    limit_mib = max_file_bytes // (1024 * 1024)
                    raise ArchiveError(
                        f"{relative} is {size} bytes, over the {limit_mib} MiB limit per file:"
                        " keep data sets out of the model definition",
                        detail={"file": relative, "size": size, "limit": max_file_bytes},
                    )
                archive.write(path, relative)
    return buffer.getvalue()


def model_definition_bytes(code: Path) -> bytes:
    """The upload body for ``code``: a directory (zipped) or an existing ``.zip`` file."""
    if code.is_dir():
        return zip_directory(code)
    if code.is_file():
        if not zipfile.is_zipfile(code):
            raise ArchiveError(f"{code} is neither a directory nor a zip archive")
        return code.read_bytes()
    raise ArchiveError(f"model definition {code} does not exist")
