"""The simulators' elastic policies plan with the live autoscaler's settings as they are by
default, so that what they measure is what the platform runs."""

from __future__ import annotations

import pytest

from ffdl.server.settings import Settings
from ffdl.sim.compare.policies import FfdlElastic as CompareElastic
from ffdl.sim.faithful.ffdl_policy import FfdlElastic as FaithfulElastic
from ffdl.sim.policies import ElasticPolicy, make_policy

KNOBS = (
    "restart_penalty",
    "fairness_after_s",
    "fairness_turn_s",
    "restart_cost_s",
    "admit_after_s",
)


@pytest.mark.parametrize(
    "policy",
    [make_policy("elastic"), CompareElastic(), FaithfulElastic()],
    ids=["simulate", "compare", "faithful"],
)
def test_each_elastic_policy_starts_from_the_live_settings(
    policy: ElasticPolicy | CompareElastic | FaithfulElastic,
) -> None:
    live = Settings()
    for knob in KNOBS:
        assert getattr(policy, knob) == getattr(live, knob), knob
    assert policy.objective == live.elastic_objective
    if not isinstance(policy, CompareElastic):  # the compare engine has no hold rule
        assert policy.min_rescale_interval_s == live.min_rescale_interval_s
