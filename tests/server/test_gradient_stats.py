"""Gradient statistics from user code reach the optimizer as a job's noise scale."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ffdl.sdk.api import report_gradient_stats
from ffdl.server.loops.autoscaler import gradient_stats
from ffdl.server.store.models import Metric
from tests.server.factories import make_job, make_store, on_both_databases


def test_sdk_reports_gradient_stats_in_their_own_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOG_DIR", str(tmp_path))
    report_gradient_stats(4.0, 400.0, step=7)
    line = json.loads((tmp_path / "emetrics.jsonl").read_text())
    assert line["group"] == "gradient" and line["iteration"] == 7
    assert line["values"] == {"sq_norm": 4.0, "variance": 400.0}
    with pytest.raises(ValueError):
        report_gradient_stats(0.0, 1.0)


@on_both_databases
def test_autoscaler_averages_the_latest_reports_per_job(tmp_path: Path, database: str) -> None:
    store = make_store(tmp_path, database)
    job = make_job(store, "training-a", elastic=True)
    other = make_job(store, "training-b", elastic=True)
    with store.write() as session:
        for seq, (sq_norm, variance) in enumerate([(1.0, 100.0), (3.0, 300.0)], start=1):
            session.add(
                Metric(
                    job_id=job,
                    learner=1,
                    attempt=1,
                    seq=seq,
                    number=seq,
                    group="gradient",
                    iteration=seq,
                    values={"sq_norm": sq_norm, "variance": variance},
                    time=float(seq),
                )
            )
        session.add(
            Metric(
                job_id=other,
                learner=1,
                attempt=1,
                seq=1,
                number=1,
                group="train",
                iteration=1,
                values={"loss": 0.5},
                time=1.0,
            )
        )
    with store.read() as session:
        stats = gradient_stats(session, [job, other])
    assert set(stats) == {job}
    assert stats[job].sq_norm == pytest.approx(2.0)
    assert stats[job].variance == pytest.approx(200.0)
