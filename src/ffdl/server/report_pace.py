"""The pace a replica asks of the learners that report to it.

A learner posts again as soon as its last post is answered and its short batching wait is
over, so the more learners, the more posts, until the replicas are saturated and their
answers slow down: the learners then pace themselves, but through queues that every other
request (submits, lists, the loops' work) waits in too. Each replica therefore counts the
learners that posted to it within the last ``window_s`` and answers every post with
``pace_s``: the gap each of them should leave before its next post, so that together they
post about ``posts_per_s`` times a second. A learner keeps queueing meanwhile and sends
more per post; a status change goes out at once whatever the pace, so that starts and ends
are never held back. With no more learners than ``posts_per_s`` the pace is at most a
second and changes nothing; it never exceeds ``longest_s``, which stays well inside the
time after which a silent learner is taken for lost.

In a pool of worker processes each worker counts the learners that posted to it; their
connections are closed every few seconds and land on other workers, so each worker sees
nearly all of the replica's learners, and ``posts_per_s`` is in effect the replica's.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from ffdl.server.telemetry.instruments import REPORT_PACE, REPORTING_LEARNERS

# How often the count of recent learners forgets the ones gone quiet.
PRUNE_EVERY_S = 1.0


class ReportPace:
    """Counts the learners posting lately and gives each post's ``pace_s``."""

    def __init__(
        self,
        posts_per_s: float,
        longest_s: float,
        window_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.posts_per_s = posts_per_s
        self.longest_s = longest_s
        self.window_s = window_s
        self._clock = clock
        self._last_post: dict[str, float] = {}
        self._pruned_at = clock()
        self._lock = threading.Lock()

    def observe(self, learner_key: str) -> float:
        """Record a post from ``learner_key``; the gap it should leave before its next."""
        now = self._clock()
        with self._lock:
            self._last_post[learner_key] = now
            if now - self._pruned_at >= PRUNE_EVERY_S:
                self._prune(now)
            return self._pace(len(self._last_post))

    def expected(self, learners: int, addresses: int) -> float:
        """The pace a replica asks when ``learners`` report to ``addresses`` replica
        addresses, spread evenly (``loops/lcm.report_addresses``): what the job monitor
        allows a learner between two posts, wherever it reports."""
        return self._pace(math.ceil(learners / max(1, addresses)))

    @property
    def learners(self) -> int:
        """The learners that posted within the window (as of the last prune)."""
        with self._lock:
            return len(self._last_post)

    def _pace(self, learners: int) -> float:
        if self.posts_per_s <= 0:
            return 0.0
        return min(learners / self.posts_per_s, self.longest_s)

    def _prune(self, now: float) -> None:
        oldest = now - self.window_s
        self._last_post = {key: at for key, at in self._last_post.items() if at >= oldest}
        self._pruned_at = now
        REPORTING_LEARNERS.set(len(self._last_post))
        REPORT_PACE.set(self._pace(len(self._last_post)))
