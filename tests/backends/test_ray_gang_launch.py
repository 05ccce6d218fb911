"""The Ray driver's record of a gang being launched, which keeps its placement group from
the reaper between two launch tries (a short learner 1 may end before the last learner is
launched, leaving the group without a live actor for a while)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray", reason="the Ray driver needs Ray: pip install 'ffdl[ray]'")

from ffdl.backends.ray_driver import LAUNCH_GRACE_S, GangLaunch


def test_a_gang_with_learners_left_to_launch_is_kept_while_the_platform_tries() -> None:
    gang = GangLaunch(size=3, last_try=100.0)
    gang.launched.update({1, 2})
    assert gang.waits_for_more(100.0 + LAUNCH_GRACE_S - 1)
    # The platform gave up on it (deploy timeout, cancel without a kill): reaped as usual.
    assert not gang.waits_for_more(100.0 + LAUNCH_GRACE_S + 1)


def test_a_wholly_launched_gang_is_reaped_as_soon_as_its_learners_end() -> None:
    gang = GangLaunch(size=2, last_try=100.0)
    gang.launched.update({1, 2})
    assert not gang.waits_for_more(100.5)
