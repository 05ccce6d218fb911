"""The report pace: the gap a replica asks between a learner's posts grows with the learners
posting to it, within its bounds, and every report answer carries it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from ffdl.server.auth import JobTokens, load_or_create_secret
from ffdl.server.report_pace import ReportPace
from tests.integration import views
from tests.integration.live import FAST_CONFIG, LiveServer, manifest_yaml, serving, wait_for


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_pace_shares_the_posts_a_second_among_the_learners_posting() -> None:
    clock = Clock()
    pace = ReportPace(posts_per_s=10, longest_s=4, window_s=20, clock=clock)
    assert pace.observe("job/1/1") == pytest.approx(0.1)
    assert pace.observe("job/1/1") == pytest.approx(0.1), "a learner counts once"
    for learner in range(2, 31):
        pace.observe(f"job/{learner}/1")
    assert pace.observe("job/1/1") == pytest.approx(3.0)
    for learner in range(31, 100):
        pace.observe(f"job/{learner}/1")
    assert pace.observe("job/1/1") == 4, "never longer than longest_s"


def test_learners_gone_quiet_for_the_window_no_longer_count() -> None:
    clock = Clock()
    pace = ReportPace(posts_per_s=1, longest_s=60, window_s=20, clock=clock)
    for learner in range(1, 6):
        pace.observe(f"old/{learner}/1")
    clock.now += 10
    assert pace.observe("new/1/1") == 6
    clock.now += 15  # the old ones last posted 25 s ago, the new one 15 s ago
    assert pace.observe("new/2/1") == 2
    assert pace.learners == 2


def test_no_pace_is_asked_when_the_setting_is_zero() -> None:
    pace = ReportPace(posts_per_s=0, longest_s=10, window_s=20)
    assert [pace.observe(f"job/{n}/1") for n in range(50)] == [0.0] * 50


def test_the_pace_expected_elsewhere_shares_the_learners_among_the_addresses() -> None:
    pace = ReportPace(posts_per_s=5, longest_s=10, window_s=20)
    assert pace.expected(30, 2) == 3.0  # 15 learners a replica, 5 posts a second
    assert pace.expected(31, 2) == 3.2  # the busier replica's
    assert pace.expected(30, 0) == 6.0  # no replica registered yet: this one
    assert pace.expected(1000, 2) == 10.0  # capped
    assert ReportPace(posts_per_s=0, longest_s=10, window_s=20).expected(1000, 1) == 0.0


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    home = tmp_path_factory.mktemp("report-pace") / "home"
    config = {**FAST_CONFIG, "report_posts_per_s": 2.0}
    with serving(LiveServer(home=home, config=config)) as server:
        yield server


def test_every_report_answer_carries_the_pace_of_the_learners_posting(live: LiveServer) -> None:
    job_id = live.submit_ok(manifest_yaml("sleep 600", learners=2), {"train.py": ""})
    try:
        model = live.wait_status(job_id, {"PROCESSING"})
        attempt = int(model["learners"][0]["attempt"])
        token = JobTokens(load_or_create_secret(live.home)).issue(job_id)

        def heartbeat() -> float:
            response = httpx.post(
                f"{live.url}/v1/internal/jobs/{job_id}/learners/1/reports",
                json={"attempt": attempt, "items": []},
                headers={"Authorization": f"Bearer {token}"},
            )
            assert response.status_code == 200, response.text
            return float(response.json()["pace_s"])

        # Both learners' controllers post (each learner attempt counts once): 2 / 2 a second.
        assert wait_for(lambda: heartbeat() == 1.0, timeout=30, what="a pace of 1 s")
        wait_for(
            lambda: views.metric(live, "ffdl_reporting_learners") == 2,
            timeout=30,
            what="the reporting learners' gauge",
        )
        assert views.metric(live, "ffdl_report_pace_seconds") == 1.0
    finally:
        live.client.delete(f"/v1/models/{job_id}")
