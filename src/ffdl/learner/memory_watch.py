"""A learner's memory kept within its limit by watching it, where no memory cgroup can be had.

The watchdog measures what the learner's whole process tree actually holds and the host
cannot take back: the sum of each process's proportional share of its anonymous and shared
memory pages (``Pss_Anon`` + ``Pss_Shmem`` in ``/proc/PID/smaps_rollup``). A page mapped
by several processes is shared among them, so a data loader forked from a large parent is
not counted twice. Pages of mapped files (libraries, CUDA's kernels, a memory-mapped data
set) are left out: the kernel drops them under pressure, as it does inside a memory
cgroup. Address space is never looked at: CUDA, JAX, the JVM and Go reserve tens of GiB
they never touch, and an address-space limit (``RLIMIT_AS``) makes them fail at start,
which is why no learner gets one. A tree over its limit is killed at once.

It samples, so a learner that grabs memory faster than one interval can briefly hold more
than its limit before it is killed; sandboxed learners are the kernel's first choice if
the host runs out meanwhile (``oom_score_adj``, see ``ffdl.learner.sandbox``). Each sample
reads the process table and each process's ``smaps_rollup``, whose cost grows with the
learner's resident memory: the interval stretches so that measuring takes no more than
1/``COST_RATIO`` of a core.

Standard library only: the controller imports it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from ffdl.learner.processes import descendants

MIN_INTERVAL_S = 0.1
MAX_INTERVAL_S = 2.0
COST_RATIO = 50
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def process_memory(pid: int) -> int:
    """Bytes ``pid`` holds that are not file pages, shared proportionally; 0 if it is gone.

    Kernels before 5.x show only the whole ``Pss``, used then; where ``smaps_rollup``
    cannot be read at all, the resident set less its file-backed pages (``statm``)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as handle:
            fields = dict(_kib_fields(handle))
    except OSError:
        fields = {}
    if b"Pss_Anon" in fields:
        return (fields[b"Pss_Anon"] + fields.get(b"Pss_Shmem", 0)) * 1024
    if b"Pss" in fields:
        return fields[b"Pss"] * 1024
    try:
        _size, resident, file_backed = Path(f"/proc/{pid}/statm").read_text().split()[:3]
        return max(0, int(resident) - int(file_backed)) * PAGE_SIZE
    except (OSError, ValueError):
        return 0


def _kib_fields(lines: Iterable[bytes]) -> Iterator[tuple[bytes, int]]:
    for line in lines:
        key, _, rest = line.partition(b":")
        words = rest.split()
        if len(words) == 2 and words[1] == b"kB" and words[0].isdigit():
            yield key, int(words[0])


def tree_memory(root: int) -> int:
    """Bytes held by ``root`` and every process below it."""
    return sum(process_memory(pid) for pid in {root, *descendants(root)})


class MemoryWatch:
    """Kills the process tree under ``root`` once it holds more than ``limit_bytes``.

    ``kill`` is called once, from the watchdog's thread, with the bytes measured; after it
    ``exceeded`` holds that figure. ``stop`` ends the watch (idempotent).
    """

    def __init__(self, root: int, limit_bytes: int, kill: Callable[[int], None]) -> None:
        self.root = root
        self.limit_bytes = limit_bytes
        self._kill = kill
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-watch", daemon=True)
        self.exceeded: int | None = None
        self.peak = 0
        self.samples = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            held = tree_memory(self.root)
            self.samples += 1
            self.peak = max(self.peak, held)
            if held > self.limit_bytes:
                self.exceeded = held
                self._kill(held)
                return
            cost = time.monotonic() - started
            self._stop.wait(min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, cost * COST_RATIO)))
