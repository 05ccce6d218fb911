"""A job's directories keep working when its home moves: the links FfDL's paths are made of
are relative, and links or copies a move left behind are made again."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ffdl.core.jobdirs import JobDirs


def test_a_jobs_links_follow_its_directory_to_another_home(tmp_path: Path) -> None:
    old = JobDirs.of(tmp_path / "old" / "jobs", "training-a")
    old.create(1)
    (old.results / "model.json").write_text("{}")
    new = JobDirs.of(tmp_path / "new" / "jobs", "training-a")
    new.root.parent.mkdir(parents=True)
    os.rename(old.root, new.root)

    new.create(1)
    bucket_link = new.result_bucket / "training-a"
    assert bucket_link.resolve() == new.results.resolve()
    assert (bucket_link / "model.json").read_text() == "{}"
    assert new.state_logs.resolve() == new.logs(1).resolve()


def test_links_an_older_home_or_a_link_following_copy_left_are_made_again(
    tmp_path: Path,
) -> None:
    dirs = JobDirs.of(tmp_path / "jobs", "training-b")
    dirs.create(1)
    bucket_link = dirs.result_bucket / "training-b"
    # Absolute links into a home that is no longer this one.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    bucket_link.unlink()
    bucket_link.symlink_to(elsewhere)
    dirs.state_logs.unlink()
    dirs.state_logs.symlink_to(elsewhere)
    dirs.create(1)
    assert bucket_link.resolve() == dirs.results.resolve()
    assert dirs.state_logs.resolve() == dirs.logs(1).resolve()

    # A copy that followed the link left the results' contents in its place.
    bucket_link.unlink()
    shutil.copytree(dirs.results, bucket_link)
    dirs.create(1)
    assert bucket_link.is_symlink() and bucket_link.resolve() == dirs.results.resolve()
    assert elsewhere.is_dir(), "what the old links pointed to is left alone"
