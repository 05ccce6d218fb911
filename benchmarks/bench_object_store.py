"""Staging throughput from an object store: ffdl's storage download against plain s3fs.

A data set (1 GiB by default, ``--mib`` for another size, in ``--files`` equal files) is put
into moto's S3 server, run as its own process on 127.0.0.1, then downloaded into an empty
directory in ``ROUNDS`` alternating pairs: through ``ffdl.storage`` (what a learner's
controller runs to stage DATA_DIR, progress and skip checks included) and through plain
``s3fs.S3FileSystem.get(recursive=True)``. Prints the median MB/s of both and their ratio
(goal: at least 0.9).

    python benchmarks/bench_object_store.py            # 1 GiB
    python benchmarks/bench_object_store.py --mib 64   # a quick run
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import s3fs

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _server import moto_process  # noqa: E402  # isort: skip

from ffdl.storage.base import TransferStats  # noqa: E402
from ffdl.storage.connection import S3Connection  # noqa: E402
from ffdl.storage.s3 import s3_store  # noqa: E402

ROUNDS = 3
BUCKET = "bench-data"
KEY, SECRET = "bench-access-key", "bench-secret-key"
MB = 1_000_000


def _plain_fs(endpoint: str) -> s3fs.S3FileSystem:
    return s3fs.S3FileSystem(
        key=KEY, secret=SECRET, endpoint_url=endpoint, skip_instance_cache=True
    )


def fill(endpoint: str, mib: int, files: int, scratch: Path) -> int:
    """Put ``mib`` MiB of random bytes into the bucket as ``files`` files; the bytes put."""
    source = scratch / "source"
    source.mkdir()
    size = mib * 1024 * 1024 // files
    block = os.urandom(min(size, 4 * 1024 * 1024))
    for index in range(files):
        with open(source / f"part-{index:04d}.bin", "wb") as out:
            left = size
            while left > 0:
                out.write(block[: min(left, len(block))])
                left -= len(block)
    fs = _plain_fs(endpoint)
    fs.mkdir(BUCKET)
    fs.put(str(source) + "/", f"{BUCKET}/", recursive=True)
    shutil.rmtree(source)
    return size * files


def through_ffdl(endpoint: str, target: Path) -> int:
    connection = S3Connection(access_key=KEY, secret_key=SECRET, endpoint=endpoint)
    seen: list[TransferStats] = []
    stats = s3_store(connection, BUCKET).download("", str(target), progress=seen.append)
    return stats.bytes_done


def through_s3fs(endpoint: str, target: Path) -> int:
    _plain_fs(endpoint).get(f"{BUCKET}/", str(target) + "/", recursive=True)
    return sum(path.stat().st_size for path in target.rglob("*") if path.is_file())


def _timed(run: object, endpoint: str, scratch: Path, expected: int) -> float:
    target = scratch / "target"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir()
    started = time.perf_counter()
    copied = run(endpoint, target)  # type: ignore[operator]
    elapsed = time.perf_counter() - started
    if copied != expected:
        raise RuntimeError(f"copied {copied} bytes, expected {expected}")
    shutil.rmtree(target)
    return expected / MB / elapsed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=1024, help="data set size in MiB")
    parser.add_argument("--files", type=int, default=64, help="number of files")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args(argv if argv is not None else [])
    with tempfile.TemporaryDirectory(prefix="ffdl-bench-s3-") as tmp, moto_process() as endpoint:
        scratch = Path(tmp)
        expected = fill(endpoint, args.mib, args.files, scratch)
        print(f"data set: {expected / MB:.0f} MB in {args.files} files, moto S3 on {endpoint}")
        ffdl_rates: list[float] = []
        plain_rates: list[float] = []
        for _ in range(args.rounds):
            ffdl_rates.append(_timed(through_ffdl, endpoint, scratch, expected))
            plain_rates.append(_timed(through_s3fs, endpoint, scratch, expected))
        ffdl_mbs, plain_mbs = statistics.median(ffdl_rates), statistics.median(plain_rates)
        print(f"ffdl storage download: {ffdl_mbs:8.1f} MB/s  (rounds: {_rates(ffdl_rates)})")
        print(f"plain s3fs get:        {plain_mbs:8.1f} MB/s  (rounds: {_rates(plain_rates)})")
        print(f"ratio ffdl / s3fs:     {ffdl_mbs / plain_mbs:8.2f}  (goal >= 0.9)")


def _rates(values: list[float]) -> str:
    return ", ".join(f"{value:.1f}" for value in values)


if __name__ == "__main__":
    main(sys.argv[1:])
