"""Staging: tree copies that skip what is already there, progress lines, volume links."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ffdl.learner.staging import StagingError, StagingStopped, copy_tree, link_volume


def make_tree(root: Path) -> None:
    (root / "nested" / "deeper").mkdir(parents=True)
    (root / "one.txt").write_text("1")
    (root / "nested" / "two.bin").write_bytes(b"2" * 1_500_000)
    (root / "nested" / "deeper" / "three.txt").write_text("333")
    (root / "empty").mkdir()
    (root / "linked").symlink_to(root / "nested")
    (root / "host-file").symlink_to("/etc/hostname")


def test_copy_tree_copies_everything_and_reports_the_end(tmp_path: Path) -> None:
    source, target = tmp_path / "src", tmp_path / "dst"
    make_tree(source)
    lines: list[str] = []

    stats = copy_tree(str(source), str(target), label="staging data", progress=lines.append)

    assert (stats.files_total, stats.files_done, stats.files_skipped) == (3, 3, 0)
    # Links are never followed (a tree may be a job's own): each one left out is named.
    assert lines == [
        "[ffdl] staging data: left out host-file: a link or special file is not copied",
        "[ffdl] staging data: left out linked: a link or special file is not copied",
        "[ffdl] staging data: 3/3 files, 1.5/1.5 MB",
    ]
    assert (target / "nested" / "deeper" / "three.txt").read_text() == "333"
    assert (target / "empty").is_dir()
    assert not os.path.lexists(target / "linked")
    assert not os.path.lexists(target / "host-file")
    assert (target / "nested" / "two.bin").stat().st_mtime_ns == (
        (source / "nested" / "two.bin").stat().st_mtime_ns
    )


def test_a_file_swapped_for_a_link_after_planning_is_not_read(tmp_path: Path) -> None:
    source, target = tmp_path / "src", tmp_path / "dst"
    source.mkdir()
    (source / "model.txt").write_text("weights")
    secret = tmp_path / "secret"
    secret.write_text("host secret")
    swapped = False

    def swap(_line: str) -> None:
        nonlocal swapped
        if not swapped:
            swapped = True
            (source / "model.txt").unlink()
            (source / "model.txt").symlink_to(secret)

    (source / "a-link").symlink_to(secret)  # its progress line triggers the swap
    with pytest.raises(StagingError, match=r"model\.txt"):
        copy_tree(str(source), str(target), label="storing results", progress=swap)
    assert not (target / "model.txt").exists() or "host secret" not in (
        (target / "model.txt").read_text()
    )


def test_copy_tree_skips_identical_files_and_recopies_changed_ones(tmp_path: Path) -> None:
    source, target = tmp_path / "src", tmp_path / "dst"
    make_tree(source)
    copy_tree(str(source), str(target), label="x", progress=lambda _: None)
    (source / "one.txt").write_text("changed")

    stats = copy_tree(str(source), str(target), label="x", progress=lambda _: None)

    assert (stats.files_done, stats.files_skipped) == (3, 2)
    assert (target / "one.txt").read_text() == "changed"


def test_progress_is_reported_at_most_every_interval(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for index in range(6):
        (source / f"f{index}").write_text("x")
    ticks = iter(range(100))
    lines: list[str] = []

    copy_tree(
        str(source),
        str(tmp_path / "dst"),
        label="storing results",
        progress=lines.append,
        clock=lambda: next(ticks) * 0.3,
    )

    # The clock advances 0.3 s per file: a line every second file; the last one is final.
    assert [line.split(": ")[1].split(",")[0] for line in lines] == [
        "2/6 files",
        "4/6 files",
        "6/6 files",
    ]
    assert lines[-1].startswith("[ffdl] storing results: 6/6 files")


def test_copy_tree_of_a_single_file_and_of_a_missing_source(tmp_path: Path) -> None:
    (tmp_path / "model.pt").write_text("weights")
    copy_tree(str(tmp_path / "model.pt"), str(tmp_path / "a" / "b.pt"), label="x", progress=print)
    assert (tmp_path / "a" / "b.pt").read_text() == "weights"
    with pytest.raises(StagingError, match="no-such"):
        copy_tree(str(tmp_path / "no-such"), str(tmp_path / "c"), label="x", progress=print)


def test_copy_tree_stops_when_asked(tmp_path: Path) -> None:
    make_tree(tmp_path / "src")
    with pytest.raises(StagingStopped):
        copy_tree(
            str(tmp_path / "src"),
            str(tmp_path / "dst"),
            label="x",
            progress=print,
            should_stop=lambda: True,
        )


def test_link_volume_links_replaces_stale_links_and_refuses_real_content(tmp_path: Path) -> None:
    volume, other = tmp_path / "volume", tmp_path / "other"
    volume.mkdir()
    other.mkdir()
    target = tmp_path / "mnt" / "data"

    link_volume(str(volume), str(target))
    assert os.readlink(target) == str(volume)
    link_volume(str(volume), str(target))
    link_volume(str(other), str(target))
    assert os.readlink(target) == str(other)

    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "file").write_text("keep me")
    with pytest.raises(StagingError, match="already exists"):
        link_volume(str(volume), str(occupied))
    with pytest.raises(StagingError, match="does not exist"):
        link_volume(str(tmp_path / "missing"), str(tmp_path / "mnt" / "x"))
    empty = tmp_path / "empty"
    empty.mkdir()
    link_volume(str(volume), str(empty))
    assert empty.is_symlink()
