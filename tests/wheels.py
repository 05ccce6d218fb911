"""Minimal pure-Python wheels made on the spot, for offline installs in tests and
benchmarks (a ``find_links`` directory with ``no_index``): nothing is downloaded."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def make_wheel(directory: Path, name: str, version: str) -> Path:
    """A minimal pure-Python wheel of ``name`` whose module reports ``version``."""
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\nBUILT_BY = 'ffdl-runtime-test'\n",
        f"{name}-{version}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        ),
        f"{name}-{version}.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: ffdl-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }

    def record_hash(data: bytes) -> str:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
        return f"sha256={digest.decode()}"

    record = "".join(
        f"{path},{record_hash(text.encode())},{len(text.encode())}\n"
        for path, text in files.items()
    )
    record += f"{name}-{version}.dist-info/RECORD,,\n"
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
        archive.writestr(f"{name}-{version}.dist-info/RECORD", record)
    return wheel
