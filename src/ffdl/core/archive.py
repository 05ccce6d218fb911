"""Zip archives the platform takes in or hands out, and what makes one safe.

Model definitions are validated at submit and unpacked at deploy (on the control plane,
or on a Ray node); a learner's results upload is checked and unpacked the same way. A zip
is refused when it is not a zip, holds absolute or parent-escaping paths or links, or
exceeds the configured entry count or unpacked size (``check_members``). Results are zipped
for download without following links (``zip_directory``).
"""

from __future__ import annotations

import errno
import io
import os
import shutil
import stat
import time
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from ffdl.core.errors import ArchiveError

# Lists what a results download left out, and why.
SKIPPED_NAME = "SKIPPED_LINKS.txt"
VERIFY_CHUNK_BYTES = 1024 * 1024


def validate_archive(data: bytes, *, max_files: int, max_unpacked_bytes: int) -> int:
    """Check ``data`` is a safe zip; return its number of file entries."""
    if not data:
        raise ArchiveError("model_definition is empty: send a zip of your training code")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        raise ArchiveError(f"model_definition is not a valid zip archive: {exc}") from exc
    with archive:
        infos = check_members(
            archive,
            what="model_definition",
            max_files=max_files,
            max_unpacked_bytes=max_unpacked_bytes,
        )
        for info in infos:
            _verify_member(archive, info)
        return sum(1 for i in infos if not i.is_dir())


def check_members(
    archive: zipfile.ZipFile, *, what: str, max_files: int, max_unpacked_bytes: int
) -> list[zipfile.ZipInfo]:
    """The entries of ``archive`` once checked: at most ``max_files``, no unsafe name, no
    symbolic link, at most ``max_unpacked_bytes`` declared in all. ``ArchiveError`` (400)
    names the first offending entry as ``what`` (the archive, for the user)."""
    infos = archive.infolist()
    if len(infos) > max_files:
        raise ArchiveError(f"{what} has {len(infos)} entries; the limit is {max_files}")
    total = 0
    for info in infos:
        _check_member_name(info.filename, what)
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            raise ArchiveError(f"{what} holds a symbolic link: {info.filename}")
        total += info.file_size
    if total > max_unpacked_bytes:
        raise ArchiveError(f"{what} unpacks to {total} bytes; the limit is {max_unpacked_bytes}")
    return infos


def _verify_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> None:
    """Read a member whole: its data must inflate, match its CRC and its declared size.

    Done at submit so that a corrupt archive is the submitter's 400, never a deploy that
    fails later (or a lifecycle pass that stumbles on it)."""
    read = 0
    try:
        with archive.open(info) as member:
            while chunk := member.read(VERIFY_CHUNK_BYTES):
                read += len(chunk)
                if read > info.file_size:
                    break
    except (
        zipfile.BadZipFile,
        zlib.error,
        EOFError,
        OSError,
        RuntimeError,
        NotImplementedError,
    ) as exc:
        raise ArchiveError(f"model_definition member {info.filename!r} is corrupt: {exc}") from exc
    if read != info.file_size:
        raise ArchiveError(
            f"model_definition member {info.filename!r} holds {read}"
            f"{'+' if read > info.file_size else ''} bytes but declares {info.file_size}"
        )


def _check_member_name(name: str, what: str = "model_definition") -> None:
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or name.startswith("/") or "\x00" in name:
        raise ArchiveError(f"{what} holds an unsafe path: {name!r}")


def unpack_archive(archive_path: Path, target: Path) -> None:
    """Unpack into ``target`` atomically (a partial unpack is never left at ``target``)."""
    if target.exists():
        return
    staging = target.with_name(target.name + ".partial")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    with zipfile.ZipFile(archive_path) as archive:
        extract_members(archive, archive.infolist(), staging, "model_definition")
    staging.rename(target)


def extract_members(
    archive: zipfile.ZipFile, infos: list[zipfile.ZipInfo], target: Path, what: str
) -> tuple[int, int]:
    """Write ``infos`` under the directory ``target`` (regular files and directories only,
    never a link); return (files, bytes) written. ``ArchiveError`` for an unsafe name."""
    root = target.resolve()
    files = size = 0
    for info in infos:
        _check_member_name(info.filename, what)
        dest = (root / info.filename).resolve()
        if not dest.is_relative_to(root):
            raise ArchiveError(f"{what} holds an unsafe path: {info.filename!r}")
        if info.is_dir():
            dest.mkdir(parents=True, exist_ok=True)
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        with archive.open(info) as src, open(dest, "wb") as out:
            shutil.copyfileobj(src, out)
        mode = (info.external_attr >> 16) & 0o777
        if mode:
            dest.chmod(mode | 0o600)
        files += 1
        size += info.file_size
    return files, size


def zip_directory(source: Path) -> bytes:
    """Zip the regular files of a directory tree (trained models and results).

    The tree is written by user code, and the server reads it with its own rights, so it is
    walked without following a single symbolic link: directories through ``os.fwalk`` with
    ``follow_symlinks=False``, files opened relative to their directory's descriptor with
    ``O_NOFOLLOW``. Links, FIFOs, sockets and devices are left out and listed in
    ``SKIPPED_LINKS.txt`` inside the zip, so the user sees what is missing and why.
    """
    buffer = io.BytesIO()
    skipped: list[str] = []
    names: set[str] = set()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        top = str(source)
        try:
            top_status = os.lstat(top)
        except FileNotFoundError:
            top_status = None
        if top_status is not None and not stat.S_ISDIR(top_status.st_mode):
            skipped.append(f". ({_kind(top_status.st_mode, _link_target(top, None))})")
        elif top_status is not None:
            for dirpath, dirnames, filenames, dirfd in os.fwalk(top, follow_symlinks=False):
                relative = os.path.relpath(dirpath, top)
                prefix = "" if relative == "." else _zip_name(relative) + "/"
                for name in list(dirnames):
                    try:
                        mode = os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode
                    except OSError:
                        mode = 0  # gone meanwhile: nothing to include
                    if not stat.S_ISDIR(mode):
                        dirnames.remove(name)
                        if mode:
                            skipped.append(_skip_line(prefix, name, mode, dirfd))
                for name in sorted(filenames):
                    arcname = prefix + _zip_name(name)
                    problem = _add_file(archive, dirfd, name, arcname)
                    if problem is None:
                        names.add(arcname)
                    else:
                        skipped.append(f"{arcname} ({problem})")
                dirnames.sort()
        if skipped:
            archive.writestr(_free_name(names), _skipped_text(skipped))
    return buffer.getvalue()


def _add_file(archive: zipfile.ZipFile, dirfd: int, name: str, arcname: str) -> str | None:
    """Copy one regular file into ``archive``; otherwise say why it was left out."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dirfd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return _kind(stat.S_IFLNK, _link_target(name, dirfd))
        return f"unreadable: {exc.strerror}"
    with os.fdopen(fd, "rb") as handle:
        status = os.fstat(handle.fileno())
        if not stat.S_ISREG(status.st_mode):
            return _kind(status.st_mode, "")
        info = zipfile.ZipInfo(arcname, _zip_time(status.st_mtime))
        info.compress_type = zipfile.ZIP_DEFLATED
        info.external_attr = (stat.S_IFREG | stat.S_IMODE(status.st_mode)) << 16
        with archive.open(info, "w") as out:
            shutil.copyfileobj(handle, out, 1 << 20)
    return None


def _skip_line(prefix: str, name: str, mode: int, dirfd: int) -> str:
    target = _link_target(name, dirfd) if stat.S_ISLNK(mode) else ""
    return f"{prefix}{_zip_name(name)} ({_kind(mode, target)})"


def _kind(mode: int, link_target: str) -> str:
    if stat.S_ISLNK(mode):
        return f"symbolic link to {link_target}" if link_target else "symbolic link"
    if stat.S_ISFIFO(mode):
        return "named pipe"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "not a regular file"


def _link_target(name: str, dirfd: int | None) -> str:
    try:
        return _zip_name(os.readlink(name, dir_fd=dirfd))
    except OSError:
        return ""


def _zip_name(name: str) -> str:
    # Names that are not UTF-8 reach Python as surrogate escapes, which zip cannot encode.
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _zip_time(mtime: float) -> tuple[int, int, int, int, int, int]:
    # Zip dates run from 1980 to 2107; files from outside that range get the nearest end.
    parts = time.localtime(min(max(mtime, 315_532_800.0), 4_354_819_199.0))[:6]
    year, month, day, hour, minute, second = parts
    return (max(1980, min(year, 2107)), month, day, hour, minute, second)


def _free_name(taken: set[str]) -> str:
    name, number = SKIPPED_NAME, 1
    while name in taken:
        name = f"SKIPPED_LINKS-{number}.txt"
        number += 1
    return name


def _skipped_text(skipped: list[str]) -> str:
    header = (
        "These entries of the results were not included: the download holds only regular\n"
        "files, and never follows symbolic links.\n\n"
    )
    return header + "".join(f"{line}\n" for line in skipped)
