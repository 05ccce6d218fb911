"""Model definition archives: validated at submit, unpacked safely at deploy.

A zip is refused when it is not a zip, holds absolute or parent-escaping paths or links,
or exceeds the configured entry count or unpacked size.
"""

from __future__ import annotations

import io
import shutil
import stat
import zipfile
from pathlib import Path, PurePosixPath

from ffdl.core.errors import ArchiveError


def validate_archive(data: bytes, *, max_files: int, max_unpacked_bytes: int) -> int:
    """Check ``data`` is a safe zip; return its number of file entries."""
    if not data:
        raise ArchiveError("model_definition is empty: send a zip of your training code")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        raise ArchiveError(f"model_definition is not a valid zip archive: {exc}") from exc
    with archive:
        infos = archive.infolist()
        if len(infos) > max_files:
            raise ArchiveError(
                f"model_definition has {len(infos)} entries; the limit is {max_files}"
            )
        total = 0
        for info in infos:
            _check_member_name(info.filename)
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                raise ArchiveError(f"model_definition holds a symbolic link: {info.filename}")
            total += info.file_size
        if total > max_unpacked_bytes:
            raise ArchiveError(
                f"model_definition unpacks to {total} bytes; the limit is {max_unpacked_bytes}"
            )
        return sum(1 for i in infos if not i.is_dir())


def _check_member_name(name: str) -> None:
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or name.startswith("/"):
        raise ArchiveError(f"model_definition holds an unsafe path: {name!r}")


def unpack_archive(archive_path: Path, target: Path) -> None:
    """Unpack into ``target`` atomically (a partial unpack is never left at ``target``)."""
    if target.exists():
        return
    staging = target.with_name(target.name + ".partial")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    with zipfile.ZipFile(archive_path) as archive:
        for info in archive.infolist():
            _check_member_name(info.filename)
            dest = (staging / info.filename).resolve()
            if not dest.is_relative_to(staging.resolve()):
                raise ArchiveError(f"model_definition holds an unsafe path: {info.filename!r}")
            if info.is_dir():
                dest.mkdir(parents=True, exist_ok=True)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(info) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                dest.chmod(mode | 0o600)
    staging.rename(target)


def zip_directory(source: Path) -> bytes:
    """Zip a directory tree (used to serve trained models and results)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        if source.exists():
            for path in sorted(source.rglob("*")):
                if path.is_file():
                    archive.write(path, path.relative_to(source).as_posix())
    return buffer.getvalue()
