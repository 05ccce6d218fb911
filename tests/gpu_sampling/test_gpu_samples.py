"""GPU samples: the sampler reading NVML (a stand-in library on machines without GPUs),
and the store keeping a bounded series, the job's average, and its idleness flagged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from ffdl.server.services.gpu_samples import gpu_item_problem, gpu_series, record_gpu_samples
from ffdl.server.settings import Settings
from ffdl.server.store.db import Store
from ffdl.server.store.models import Event, GpuSample, Job, Learner
from tests.gpu_sampling.standin import Gpu, build, set_figures
from tests.server.factories import make_job, make_store, start_learner

GPU = {"index": 0, "util": 50.0, "memory_mb": 1000.0, "memory_total_mb": 80000.0, "power_w": 200.0}


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("nvml"))


def test_the_sampler_reads_exactly_what_nvml_reports_for_the_learners_gpus(
    standin: Path,
) -> None:
    set_figures(standin, [Gpu(10, 100), Gpu(87, 30_000, 81_920, 312_500), Gpu(55, 7)])
    # In a process of its own: NVML, once loaded, stays loaded in a process.
    program = (
        "import json, sys\n"
        "from ffdl.learner.gpu_sampler import GpuSampler, visible_indexes\n"
        "sampler = GpuSampler(visible_indexes(sys.argv[2]), 1.0, print, library=sys.argv[1])\n"
        "assert sampler.start()\n"
        "print(json.dumps(sampler.sample()))\n"
        "sampler.stop()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program, str(standin), "1,2,GPU-uuid,9"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    figures = json.loads(done.stdout.splitlines()[-1])
    assert figures == [
        {
            "index": 1,
            "util": 87.0,
            "memory_mb": 30000.0,
            "memory_total_mb": 81920.0,
            "power_w": 312.5,
        },
        {"index": 2, "util": 55.0, "memory_mb": 7.0, "memory_total_mb": 81920.0, "power_w": 300.0},
    ]


def test_without_nvml_or_gpus_nothing_is_sampled(tmp_path: Path) -> None:
    from ffdl.learner.gpu_sampler import GpuSampler

    assert not GpuSampler([], 1.0, print).start()
    assert not GpuSampler([0], 1.0, print, library=str(tmp_path / "missing.so")).start()


def test_gpu_readings_out_of_range_are_refused_by_name() -> None:
    assert gpu_item_problem([GPU]) is None
    assert gpu_item_problem([]) == "no GPUs"
    assert gpu_item_problem([{**GPU, "util": 101}]) == "GPU util out of range"
    assert gpu_item_problem([{**GPU, "memory_mb": float("nan")}]) == "GPU memory_mb out of range"
    assert gpu_item_problem([{**GPU, "power_w": -1}]) == "GPU power_w out of range"
    assert gpu_item_problem([GPU] * 65) == "more than 64 GPUs"


def _running(tmp_path: Path) -> Store:
    store = make_store(tmp_path)
    make_job(store, gpus=2)
    start_learner(store, "training-test", gpu_ids=[0, 1])
    return store


def _record(store: Store, settings: Settings, readings: list[tuple[float, float]]) -> None:
    with store.write() as session:
        job = session.get(Job, "training-test")
        learner = session.scalars(select(Learner)).one()
        assert job is not None
        gpus = [
            [{**GPU, "index": 0, "util": util}, {**GPU, "index": 1, "util": util}]
            for _, util in readings
        ]
        record_gpu_samples(
            session,
            job,
            learner,
            [(at, g) for (at, _), g in zip(readings, gpus, strict=True)],
            settings,
        )


def test_the_average_is_weighted_by_time_and_the_series_stays_bounded(tmp_path: Path) -> None:
    store = _running(tmp_path)
    settings = Settings(home=tmp_path / "home", gpu_sample_s=5.0, gpu_samples_kept=16)
    # 40 readings 5 s apart: 20 at 80 %, then 20 at 20 %.
    _record(store, settings, [(1000.0 + 5 * i, 80.0 if i < 20 else 20.0) for i in range(40)])
    with store.read() as session:
        job = session.get(Job, "training-test")
        assert job is not None
        assert job.gpu_util_avg == pytest.approx(50.0) and job.gpu_util_span_s == 200.0
        rows = session.scalars(select(GpuSample).order_by(GpuSample.time)).all()
        assert len(rows) <= 16
        # Merged rows cover the same time and keep the same mean.
        assert sum(r.span_s for r in rows) == pytest.approx(200.0)
        assert sum(r.util * r.span_s for r in rows) / 200.0 == pytest.approx(50.0)
        assert rows[0].span_s > rows[-1].span_s == 5.0
        assert rows[-1].memory_mb == 2000.0 and rows[-1].power_w == 400.0
        series = gpu_series(session, job, since=1000.0 + 5 * 37)
        assert [s["time"] for s in series["samples"]] == [1190.0, 1195.0]
        learner = session.scalars(select(Learner)).one()
        assert learner.gpu_util == 20.0 and learner.gpu_sampled_at == 1195.0


def test_idle_gpus_are_flagged_once_and_cleared_when_busy(tmp_path: Path) -> None:
    store = _running(tmp_path)
    settings = Settings(home=tmp_path / "home", gpu_sample_s=5.0, gpu_idle_after_s=60.0)
    _record(store, settings, [(1000.0 + 5 * i, 1.0) for i in range(12)])  # 55 s idle
    with store.read() as session:
        job = session.get(Job, "training-test")
        assert job is not None and job.gpu_idle_since == 1000.0
        assert job.gpu_idle_flagged_at is None
    _record(store, settings, [(1060.0 + 5 * i, 2.0) for i in range(4)])  # past 60 s
    _record(store, settings, [(1080.0, 90.0)])
    with store.read() as session:
        job = session.get(Job, "training-test")
        assert job is not None and job.gpu_idle_flagged_at is None and job.gpu_idle_since is None
        notes = [
            e.reason
            for e in session.scalars(select(Event).order_by(Event.id)).all()
            if e.from_status == e.to_status
        ]
    assert notes == [
        "GPUs idle: 2 GPU(s) held under 5% utilisation for 60 s (node-a GPUs 0, 1)",
        "GPUs busy again after being flagged idle",
    ]
