"""Packing model code: what goes into the zip, what stays out, and what is refused."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from ffdl.client.archive import model_definition_bytes, zip_directory
from ffdl.core.errors import ArchiveError


def names(archive_bytes: bytes) -> list[str]:
    with zipfile.ZipFile(io.BytesIO(archive_bytes)) as archive:
        return sorted(archive.namelist())


def test_zip_keeps_relative_paths_and_skips_tool_directories(tmp_path: Path) -> None:
    (tmp_path / "src" / "__pycache__").mkdir(parents=True)
    (tmp_path / "src" / "net.py").write_text("net")
    (tmp_path / "src" / "__pycache__" / "net.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / ".git" / "objects").mkdir(parents=True)
    (tmp_path / ".git" / "objects" / "ab").write_text("blob")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "pyvenv.cfg").write_text("home")
    (tmp_path / "train.py").write_text("train")
    (tmp_path / ".env.example").write_text("kept: only directories are skipped")
    assert names(zip_directory(tmp_path)) == [".env.example", "src/net.py", "train.py"]


def test_file_over_the_limit_is_refused_with_its_name(tmp_path: Path) -> None:
    (tmp_path / "small.py").write_bytes(b"x" * 10)
    (tmp_path / "data.bin").write_bytes(b"x" * 11)
    with pytest.raises(ArchiveError, match=r"data\.bin is 11 bytes") as caught:
        zip_directory(tmp_path, max_file_bytes=10)
    assert caught.value.code == "C102"
    assert caught.value.detail == {"file": "data.bin", "size": 11, "limit": 10}


def test_existing_zip_is_used_byte_for_byte(tmp_path: Path) -> None:
    code_zip = tmp_path / "code.zip"
    with zipfile.ZipFile(code_zip, "w") as archive:
        archive.writestr("train.py", "train")
    assert model_definition_bytes(code_zip) == code_zip.read_bytes()


def test_missing_or_unusable_code_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ArchiveError, match="does not exist"):
        model_definition_bytes(tmp_path / "nowhere")
    text_file = tmp_path / "readme.txt"
    text_file.write_text("hello")
    with pytest.raises(ArchiveError, match="neither a directory nor a zip"):
        model_definition_bytes(text_file)
