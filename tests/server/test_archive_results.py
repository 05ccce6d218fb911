"""Zipping results for download never follows a link out of the job's directory: links,
FIFOs and other special files are left out and listed in SKIPPED_LINKS.txt."""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

from ffdl.core.archive import SKIPPED_NAME, zip_directory

HOST_SECRET = "host-only-content-5f1c"


def unzip(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def plant(tmp_path: Path) -> Path:
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret.txt").write_text(HOST_SECRET)
    results = tmp_path / "results"
    (results / "nested").mkdir(parents=True)
    (results / "model.pt").write_bytes(b"weights")
    (results / "nested" / "metrics.json").write_text('{"accuracy": 0.9}')
    (results / "leak").symlink_to(host / "secret.txt")
    (results / "nested" / "etc").symlink_to(host)
    (results / "dangling").symlink_to(tmp_path / "missing")
    (results / "relative").symlink_to("../host/secret.txt")
    os.mkfifo(results / "pipe")
    return results


def test_links_and_special_files_are_skipped_and_listed(tmp_path: Path) -> None:
    members = unzip(zip_directory(plant(tmp_path)))
    assert set(members) == {"model.pt", "nested/metrics.json", SKIPPED_NAME}
    assert members["model.pt"] == b"weights"
    assert all(HOST_SECRET.encode() not in content for content in members.values())
    listing = members[SKIPPED_NAME].decode()
    for line in (
        f"leak (symbolic link to {tmp_path / 'host' / 'secret.txt'})",
        f"nested/etc (symbolic link to {tmp_path / 'host'})",
        "relative (symbolic link to ../host/secret.txt)",
        "pipe (named pipe)",
        "dangling (symbolic link to",
    ):
        assert line in listing


def test_a_results_directory_that_is_itself_a_link_yields_nothing(tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret.txt").write_text(HOST_SECRET)
    (tmp_path / "results").symlink_to(host)
    members = unzip(zip_directory(tmp_path / "results"))
    assert list(members) == [SKIPPED_NAME]
    assert f". (symbolic link to {host})" in members[SKIPPED_NAME].decode()


def test_clean_results_have_no_listing_and_a_missing_directory_zips_empty(
    tmp_path: Path,
) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / "a.txt").write_text("a")
    assert set(unzip(zip_directory(results))) == {"a.txt"}
    assert unzip(zip_directory(tmp_path / "absent")) == {}


def test_a_results_file_named_like_the_listing_is_kept(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / SKIPPED_NAME).write_text("mine")
    (results / "link").symlink_to("/etc/hostname")
    members = unzip(zip_directory(results))
    assert members[SKIPPED_NAME] == b"mine"
    assert b"link (symbolic link to /etc/hostname)" in members["SKIPPED_LINKS-1.txt"]
