"""The faithful engine against what Pollux's simulator shipped, and its parts on their own."""

from __future__ import annotations

import numpy as np
import pytest

from ffdl.elastic.accumulation import layout
from ffdl.sim.faithful.engine import Cluster, WorkloadJob
from ffdl.sim.faithful.ffdl_policy import FfdlElastic, pack
from ffdl.sim.faithful.goodput import GoodputFunction, PerfParams, fit_perf_params
from ffdl.sim.faithful.pollux import Pollux
from ffdl.sim.faithful.traces import applications
from ffdl.sim.faithful.validate import main, run_one, shipped_results

PARAMS = PerfParams(0.05, 0.004, 0.08, 0.002, 0.02, 0.001, 2.0)


@pytest.mark.parametrize("policy", ["tiresias", "optimus"])
@pytest.mark.parametrize("load", ["0.5", "2.0"])
def test_fixed_batch_policies_reproduce_the_shipped_results(policy: str, load: str) -> None:
    shipped = shipped_results()[policy, load, "workload-1"]
    result = run_one(policy, load, "workload-1")
    assert result.average_jct == pytest.approx(shipped.average, rel=0.01)
    assert result.p99_jct == pytest.approx(shipped.p99, rel=0.01)


def test_measured_placements_are_read_and_others_interpolated() -> None:
    cifar = applications()["cifar10"]
    step, sync = cifar.throughput((1,), 32)
    assert (step, sync) == pytest.approx((0.0427886962890625, 0.0004995360016822816))
    # A rotation of a placement is the same placement.
    assert cifar.throughput((2, 4), 64) == cifar.throughput((4, 2), 64)
    # Twelve nodes of four were never measured at this batch: interpolated, and slower per
    # step than one GPU alone.
    spread = cifar.throughput((4,) * 12, 100)
    assert spread[0] > cifar.throughput((1,), 100)[0]
    with pytest.raises(ValueError, match="batch 10 outside"):
        cifar.grad_stats(10, 0)


def test_past_the_per_gpu_cap_the_goodput_model_accumulates() -> None:
    model = GoodputFunction(PARAMS, grad_sqr=1.0, grad_var=200.0, init_batch=64)
    goodput, micro, steps = model.optimize(1, 2, max_batch=1024, micro_range=(4, 8))
    assert micro <= 8 and steps >= 1, "2 GPUs of 8 reach past 16 only by accumulating"
    assert 2 * micro * (steps + 1) > 16
    no_accumulation = model.optimize(1, 2, 1024, (4, 8), accumulation=False)
    assert no_accumulation[0] == 0.0, "the initial batch of 64 is out of reach of 2 × 8"
    assert goodput > 0


def test_the_fit_recovers_the_step_times_it_was_given() -> None:
    nodes = np.array([1, 1, 1, 2, 4, 1, 2], dtype=np.float64)
    replicas = np.array([1, 2, 4, 8, 16, 1, 8], dtype=np.float64)
    micro = np.array([32, 32, 32, 32, 32, 64, 64], dtype=np.float64)
    model = GoodputFunction(PARAMS, 1.0, 1.0, 32)
    steps = np.zeros(len(nodes), dtype=np.int64)
    optim = (
        micro
        * replicas
        / model.throughput(
            nodes.astype(np.int64), replicas.astype(np.int64), micro.astype(np.int64), steps
        )
    )
    accum = PARAMS.alpha_c + PARAMS.beta_c * micro
    fitted = fit_perf_params(nodes, replicas, micro, accum, optim)
    again = GoodputFunction(fitted, 1.0, 1.0, 32).throughput(
        nodes.astype(np.int64), replicas.astype(np.int64), micro.astype(np.int64), steps
    )
    assert again == pytest.approx(micro * replicas / optim, rel=0.05)


def test_pollux_fills_a_small_cluster_within_every_limit_and_finishes_every_job() -> None:
    jobs = [
        WorkloadJob(f"{app}-{i}", 60 * i, app, 1, 0)
        for i, app in enumerate(["cifar10", "ncf", "cifar10", "deepspeech2"])
    ]
    cluster = Cluster(jobs, applications(), Pollux(population=20, generations=10), nodes=2)
    seen_gpus = []

    def check(_round: int) -> None:
        per_node = np.zeros(2, dtype=np.int64)
        for name, allocation in cluster.allocations.items():
            for node in allocation:
                per_node[node] += 1
            if name.startswith("ncf"):
                assert len(allocation) <= 1, "ncf runs on one GPU"
        assert per_node.max(initial=0) <= 4
        seen_gpus.append(int(per_node.sum()))

    result = cluster.run(on_round=check)
    assert sorted(result.jcts) == sorted(j.name for j in jobs)
    assert max(seen_gpus) == 8, "the whole cluster was used while jobs waited"
    assert all(wait >= 0 for wait in result.waits.values())


def test_bad_arguments_are_refused_naming_them(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--policies", "fifo"])
    assert "unknown policies ['fifo']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--loads", "3.0"])
    assert "unknown loads ['3.0']" in capsys.readouterr().err


def test_packing_fills_the_fullest_node_that_fits_then_whole_nodes() -> None:
    free = [4, 1, 2, 4]
    assert pack(2, free, 4) == [2, 2], "the fullest node with room for both"
    assert pack(4, free, 4) == [0, 0, 0, 0]
    assert pack(5, free, 4) == [1, 3, 3, 3, 3], "a whole node, then the fullest that fits"
    assert free == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="no room for 1 GPUs"):
        pack(1, free, 4)


@pytest.mark.parametrize("accumulate", [True, False])
def test_ffdls_policy_runs_the_live_candidates_and_holds_restarted_jobs(accumulate: bool) -> None:
    jobs = [
        WorkloadJob(f"{app}-{i}", 60 * i, app, 1, 0)
        for i, app in enumerate(["cifar10", "ncf", "cifar10", "bert"])
    ]
    policy = FfdlElastic(accumulate=accumulate)
    cluster = Cluster(jobs, applications(), policy, nodes=2)
    limits = {app.name: app for app in applications().values()}
    last_change: dict[str, int] = {}
    previous: dict[str, list[int]] = {}
    rescales: list[str] = []
    accumulated: set[str] = set()

    def check(_round: int) -> None:
        assert sum(len(a) for a in cluster.allocations.values()) <= 8
        for job in cluster.jobs:
            allocation = cluster.allocations.get(job.name, [])
            if allocation and job.completed is None and job.application.name != "ncf":
                app = limits[job.application.name]
                assert job.target_batch is not None
                assert app.min_local_bsz <= job.micro + 1 and job.micro <= app.max_local_bsz
                # The engine runs the layout the platform would tell the learners.
                planned = layout(
                    job.target_batch, len(allocation), app.max_local_bsz, accumulate=accumulate
                )
                assert job.accum_steps + 1 == planned.steps, (job.name, planned)
                if job.accum_steps:
                    accumulated.add(job.name)
            if allocation != previous.get(job.name, []):
                if previous.get(job.name) and allocation and job.name in last_change:
                    held = cluster.now - last_change[job.name]
                    assert held >= policy.min_rescale_interval_s, (job.name, held)
                    rescales.append(job.name)
                last_change[job.name] = cluster.now
            previous[job.name] = allocation

    result = cluster.run(on_round=check)
    assert sorted(result.jcts) == sorted(j.name for j in jobs)
    assert rescales, "running jobs were resized"
    # bert holds 12 samples per GPU: its larger batches on few GPUs are reached by accumulating.
    assert bool(accumulated) == accumulate, accumulated


def test_jobs_beyond_the_clusters_gpus_take_turns_instead_of_waiting_for_an_end() -> None:
    # Eight long jobs on four GPUs: half of them wait, but no longer than about two turns.
    jobs = [WorkloadJob(f"cifar10-{i}", 0, "cifar10", 1, 0) for i in range(8)]
    policy = FfdlElastic()
    result = Cluster(jobs, applications(), policy, nodes=1).run()
    assert sorted(result.waits.values())[4:] != [60] * 4, "half of them had to wait"
    assert max(result.waits.values()) <= 2 * policy.fairness_turn_s, result.waits
    # Without the turns, they would wait for the first jobs to end.
    shortest = min(result.jcts.values())
    assert max(result.waits.values()) < shortest, (result.waits, shortest)
