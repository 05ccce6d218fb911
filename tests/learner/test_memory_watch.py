"""The memory watchdog on real processes: it counts what a process tree holds (shared pages
once), kills a tree over its limit, and ignores address space that is only reserved."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Iterator

import pytest

from ffdl.learner.memory_watch import MemoryWatch, process_memory, tree_memory
from tests.integration.live import wait_for

MIB = 1024 * 1024

# Touches SIZE MiB, forks CHILDREN children that keep it (copy-on-write, never written), then
# says so and waits; with RESERVE it first reserves 64 GiB of address space, as CUDA does.
HOLDER = """
import mmap, os, sys, time
size, children, reserve = (int(a) for a in sys.argv[1:4])
if reserve:
    # Linux's values: Python 3.11's mmap module names neither.
    MAP_NORESERVE, PROT_NONE = 0x4000, 0
    hole = mmap.mmap(-1, 64 << 30, flags=mmap.MAP_PRIVATE | MAP_NORESERVE, prot=PROT_NONE)
block = bytes([1]) * (size << 20)
for _ in range(children):
    if os.fork() == 0:
        time.sleep(120)
        os._exit(0)
print("ready", flush=True)
time.sleep(120)
"""


Holder = Callable[..., "subprocess.Popen[str]"]


@pytest.fixture
def holder() -> Iterator[Holder]:
    started: list[subprocess.Popen[str]] = []

    def start(size_mib: int, children: int = 0, reserve: bool = False) -> subprocess.Popen[str]:
        args = [str(size_mib), str(children), str(int(reserve))]
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, *args],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        started.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return proc

    yield start
    for proc in started:
        subprocess.run(["pkill", "-KILL", "-s", str(proc.pid)], check=False)
        proc.wait(timeout=10)


def test_a_tree_is_measured_by_what_it_holds_not_what_it_reserves(holder: Holder) -> None:
    proc = holder(100, reserve=True)
    held = process_memory(proc.pid)
    assert 100 * MIB <= held < 200 * MIB, held / MIB


def test_pages_shared_with_forked_children_count_once(holder: Holder) -> None:
    proc = holder(150, children=3)
    # Each child maps the parent's 150 MiB, so its resident set says 150 MiB too: four
    # processes would sum to 600 MiB. Proportionally they hold about 150 MiB together.
    wait_for(lambda: len(_children(proc.pid)) == 3, what="three children")
    assert 150 * MIB <= tree_memory(proc.pid) < 260 * MIB
    held = threading.Event()
    watch = MemoryWatch(proc.pid, 300 * MIB, lambda _: held.set())
    watch.start()
    try:
        wait_for(lambda: watch.samples >= 3, what="three samples")
    finally:
        watch.stop()
    assert not held.is_set() and watch.exceeded is None
    assert 150 * MIB <= watch.peak < 260 * MIB


def test_a_tree_over_its_limit_is_reported_once_with_what_it_held(holder: Holder) -> None:
    proc = holder(120, children=1)
    calls: list[int] = []

    def kill(measured: int) -> None:
        calls.append(measured)
        subprocess.run(["pkill", "-KILL", "-s", str(proc.pid)], check=False)

    watch = MemoryWatch(proc.pid, 64 * MIB, kill)
    watch.start()
    assert proc.wait(timeout=10) == -9
    watch.stop()
    assert len(calls) == 1 and watch.exceeded == calls[0] > 64 * MIB


def _children(pid: int) -> list[str]:
    done = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    return done.stdout.split()
