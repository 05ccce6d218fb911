"""Which replica a learner reports to first (``ffdl.server.loops.lcm.report_addresses``)."""

from __future__ import annotations

from collections import Counter

from ffdl.server.loops.lcm import report_addresses

OWN = "http://127.0.0.1:8080"
OTHERS = ["http://127.0.0.1:8081", "http://127.0.0.1:8082"]


def test_alone_a_replica_takes_every_report() -> None:
    assert report_addresses(OWN, [], "training-a/1") == [OWN]
    # Replicas behind one advertised address (a load balancer) have nothing to spread.
    assert report_addresses(OWN, [OWN], "training-a/1") == [OWN]


def test_learners_are_spread_over_every_replica_and_fail_over_to_the_rest_in_turn() -> None:
    orders = [report_addresses(OWN, OTHERS, f"training-{n}/1") for n in range(300)]
    firsts = Counter(order[0] for order in orders)
    assert set(firsts) == {OWN, *OTHERS}
    assert min(firsts.values()) >= 70  # about 100 each
    everyone = [OWN, *OTHERS]
    for order in orders:
        start = everyone.index(order[0])
        assert order == everyone[start:] + everyone[:start]
    # The same learner is given the same order every time (a restarted deploy agrees).
    assert report_addresses(OWN, OTHERS, "training-7/2") == report_addresses(
        OWN, OTHERS, "training-7/2"
    )


def test_replicas_serving_the_api_only_take_the_reports_and_the_others_are_fail_overs() -> None:
    api_only = OTHERS  # OWN runs the loops
    orders = [report_addresses(OWN, OTHERS, f"training-{n}/1", api_only) for n in range(300)]
    firsts = Counter(order[0] for order in orders)
    assert set(firsts) == set(api_only)
    assert min(firsts.values()) >= 100  # about 150 each
    for order in orders:
        assert sorted(order[:2]) == sorted(api_only)
        assert order[2] == OWN
