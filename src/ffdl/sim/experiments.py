"""The four reproductions: PACK vs SPREAD, gang vs learner-at-a-time, elastic, and Philly.

Each experiment builds its cluster and workloads, runs the policies it compares, and writes a
report (``summary.md``, ``summary.csv``, PNGs) to a directory when one is given. ``quick``
shrinks every experiment (fewer jobs, a smaller trace sample) so tests can run them in
seconds; the checked-in results in ``docs/simulations`` are full runs.

1. ``pack-spread``: the talk's cluster, 100 machines of 32 cores, 4 GPUs and 128 GB, and
   4,000 jobs with 1-4 GPUs per learner (avg 2.5), 4-16 CPUs per learner (avg 5) and 1-8
   learners (avg 4.5), Poisson arrivals offering 90% of the GPUs; FIFO and the platform's
   default policy, each with PACK and with SPREAD placement; then FIFO again with run times
   that do not depend on placement, which leaves only the packing effect.
2. ``gang``: the talk's 8-GPU scenario (4 jobs of 4 one-GPU learners arriving together on 2
   nodes of 4 GPUs), then the same effect at scale (64 GPUs, multi-learner jobs at full
   load), gang scheduling against placing learners one at a time.
3. ``elastic``: static FIFO, the paper's baseline (GPUs scale, batch fixed) and ffdl's
   elastic policy (GPUs and batch) on 64 GPUs at offered loads 0.5, 0.8, 1.0 and 1.5; jobs
   arrive over 24 hours; reported: jobs completed within those 24 hours and average JCT.
4. ``philly``: the busiest two weeks of the Philly trace on a 64-GPU cluster (a 10% sample,
   which loads it) and on a 1,024-GPU cluster (a 60% sample, so that the elastic run stays
   under two minutes), under fifo, priority-backfill and elastic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from ffdl.core.resources import Node, Resources
from ffdl.sim.engine import SimConfig, Simulator
from ffdl.sim.metrics import SimResult
from ffdl.sim.philly import TraceFilter, load_philly
from ffdl.sim.policies import make_policy
from ffdl.sim.report import bar_chart, duration_text, write_report
from ffdl.sim.workload import (
    Discrete,
    SimJob,
    SyntheticSpec,
    fixed_duration_job,
    synthetic,
    talk_cpus_per_learner,
)

EXPERIMENT_NAMES = ("pack-spread", "gang", "elastic", "philly")
Progress = Callable[[str, float, float | None], None]  # (run label, virtual now, total)


@dataclass(frozen=True, slots=True)
class ExperimentOutput:
    name: str
    results: list[SimResult]
    files: list[Path]
    notes: str


def cluster(
    count: int, gpus: int, cpus: float, memory_gib: int, prefix: str = "node"
) -> list[Node]:
    return [Node(f"{prefix}-{i:03d}", gpus, cpus, memory_gib * 1024) for i in range(count)]


def simulate(
    nodes: Sequence[Node],
    jobs: Sequence[SimJob],
    policy: str,
    *,
    label: str,
    placement: str = "pack",
    config: SimConfig | None = None,
    progress: Progress | None = None,
) -> SimResult:
    total = config.horizon_s if config is not None else None

    def report(now: float) -> None:
        if progress is not None:
            progress(label, now, total)

    sim = Simulator(
        nodes,
        jobs,
        make_policy(policy, placement=placement),
        config,
        label=label,
        on_progress=report if progress is not None else None,
    )
    return sim.run()


def run_experiment(
    name: str,
    directory: Path | None = None,
    *,
    quick: bool = False,
    progress: Progress | None = None,
) -> ExperimentOutput:
    """Run the experiment called ``name`` and write its report to ``directory``."""
    runners = {
        "pack-spread": pack_spread,
        "gang": gang,
        "elastic": elastic,
        "philly": philly,
    }
    if name not in runners:
        raise ValueError(f"unknown experiment {name!r}; choose from {', '.join(EXPERIMENT_NAMES)}")
    return runners[name](directory, quick=quick, progress=progress)


def _finish(
    name: str,
    title: str,
    results: list[SimResult],
    directory: Path | None,
    notes: str,
    extra: Callable[[Path], list[Path]] | None = None,
    plot_groups: dict[str, list[SimResult]] | None = None,
) -> ExperimentOutput:
    files: list[Path] = []
    if directory is not None:
        files = write_report(results, directory, title=title, notes=notes, plot_groups=plot_groups)
        if extra is not None:
            images = extra(directory)
            files.extend(images)
            with (directory / "summary.md").open("a", encoding="utf-8") as handle:
                handle.write("".join(f"\n![{p.stem}]({p.name})\n" for p in images))
    return ExperimentOutput(name, results, files, notes)


# -- 1. PACK vs SPREAD ---------------------------------------------------------------------


def pack_spread(
    directory: Path | None, *, quick: bool = False, progress: Progress | None = None
) -> ExperimentOutput:
    nodes = cluster(25 if quick else 100, 4, 32.0, 128)
    spec = SyntheticSpec(
        jobs=200 if quick else 4000,
        load=0.9,
        seed=1,
        learners=Discrete(tuple(range(1, 9))),
        gpus_per_learner=Discrete((1, 2, 3, 4)),
        cpus_per_learner=talk_cpus_per_learner(),
        memory_per_learner_mb=Discrete((8192, 16384, 24576)),
        duration_s=(600.0, 4 * 3600.0),
    )
    jobs = synthetic(spec, cluster_gpus=sum(n.gpus for n in nodes), gpus_per_node=4)

    def every_policy_and_placement(workload: list[SimJob], suffix: str) -> list[SimResult]:
        return [
            simulate(
                nodes,
                workload,
                policy,
                label=f"{policy} {placement}{suffix}",
                placement=placement,
                progress=progress,
            )
            for policy in ("fifo", "priority-backfill")
            for placement in ("pack", "spread")
        ]

    results = every_policy_and_placement(jobs, "")
    # The same jobs with a speed that ignores placement: what is left is fragmentation.
    fixed_speed = [
        replace(j, family="fixed", work=j.run_time_s(4), elastic_gpus=None) for j in jobs
    ]
    results += every_policy_and_placement(fixed_speed, ", placement-blind speed")
    notes = (
        f"{len(nodes)} machines x (32 cores, 4 GPUs, 128 GB); {len(jobs)} jobs, learners 1-8 "
        "(avg 4.5), 1-4 GPUs per learner (avg 2.5), 4-16 CPUs per learner (avg 5), 8-24 GB "
        "per learner; Poisson arrivals offering 90% of the GPUs; run times 10 min - 4 h "
        "(log-uniform) at the requested size on the fewest nodes; families resnet-like, "
        "bert-like, small-cnn, whose steps slow down with every extra node a gang spans. The "
        "last four runs give every job the same run time wherever it is placed, so they show "
        "the effect of placement on packing alone."
    )
    return _finish("pack-spread", "PACK vs SPREAD", results, directory, notes)


# -- 2. gang vs learner-at-a-time ----------------------------------------------------------


def gang(
    directory: Path | None, *, quick: bool = False, progress: Progress | None = None
) -> ExperimentOutput:
    small = cluster(2, 4, 32.0, 128)
    jobs = [
        fixed_duration_job(f"job-{i}", 0.0, 3600.0, learners=4, per_learner=Resources(1, 4.0, 8192))
        for i in range(1, 5)
    ]
    config = SimConfig(horizon_s=4 * 3600.0)
    results = [
        simulate(small, jobs, policy, label=f"8 GPUs {policy}", config=config, progress=progress)
        for policy in ("gang", "learner-at-a-time")
    ]
    nodes = cluster(16, 4, 32.0, 128)
    spec = SyntheticSpec(
        jobs=120 if quick else 600,
        load=1.0,
        seed=2,
        learners=Discrete((2, 4, 4, 8)),
        gpus_per_learner=Discrete((1, 2)),
        cpus_per_learner=Discrete((4.0,)),
        memory_per_learner_mb=Discrete((8192,)),
        duration_s=(1800.0, 4 * 3600.0),
    )
    many = synthetic(spec, cluster_gpus=64, gpus_per_node=4)
    horizon = max(j.submit_s for j in many) + 24 * 3600.0
    at_scale = SimConfig(horizon_s=horizon)
    results += [
        simulate(nodes, many, policy, label=f"64 GPUs {policy}", config=at_scale, progress=progress)
        for policy in ("gang", "learner-at-a-time")
    ]
    lines = [
        "8-GPU scenario: 2 nodes x 4 GPUs, 4 jobs x 4 learners x 1 GPU arriving at once, "
        "1 h each, 4 h horizon.",
        "",
    ]
    for result in results:
        outcomes = [o for o in result.outcomes if not o.rejected]
        started = sum(1 for o in outcomes if o.first_start_s is not None)
        done = sum(1 for o in outcomes if o.finish_s is not None)
        final_held = result.series.held_gpus[-1] if result.series.held_gpus else 0
        final_running = result.series.running_gpus[-1] if result.series.running_gpus else 0
        lines.append(
            f"- {result.label}: {started} of {len(outcomes)} jobs started, {done} finished; "
            f"at the end {final_held} GPUs held, {final_running} running a whole gang"
        )
    lines += [
        "",
        f"At scale: 16 nodes x 4 GPUs, {len(many)} jobs of 2-8 learners x 1-2 GPUs, offered "
        "load 1.0, horizon 24 h after the last arrival.",
    ]
    groups = {
        "gpus8-": [r for r in results if r.label.startswith("8 GPUs")],
        "gpus64-": [r for r in results if r.label.startswith("64 GPUs")],
    }
    return _finish(
        "gang",
        "Gang scheduling vs learner-at-a-time",
        results,
        directory,
        "\n".join(lines),
        plot_groups=groups,
    )


# -- 3. elastic ----------------------------------------------------------------------------

ELASTIC_LOADS = (0.5, 0.8, 1.0, 1.5)
ELASTIC_POLICIES = ("fifo", "elastic-fixed-batch", "elastic")
ELASTIC_WINDOW_S = 24 * 3600.0


def elastic_spec(load: float, *, quick: bool) -> SyntheticSpec:
    # Enough draws for 24 h of arrivals (about 230 jobs per day at load 1.0 on 64 GPUs);
    # the arrivals after the window are dropped.
    per_day = 230 * load * (0.25 if quick else 1.0)
    return SyntheticSpec(
        jobs=round(2 * per_day) + 20,
        load=load,
        seed=3,
        learners=Discrete((1, 2, 4, 8)),
        gpus_per_learner=Discrete((1,)),
        cpus_per_learner=Discrete((4.0,)),
        memory_per_learner_mb=Discrete((16384,)),
        duration_s=(900.0, 6 * 3600.0),
        elastic=True,
        elastic_max_factor=4,
    )


def completed_within(result: SimResult, seconds: float) -> int:
    return sum(1 for o in result.outcomes if o.finish_s is not None and o.finish_s <= seconds)


def elastic(
    directory: Path | None, *, quick: bool = False, progress: Progress | None = None
) -> ExperimentOutput:
    nodes = cluster(4 if quick else 16, 4, 32.0, 128)
    gpus = sum(n.gpus for n in nodes)
    results: list[SimResult] = []
    table = [
        "| load | policy | jobs | completed in 24 h | avg JCT | p99 JCT | restarts |",
        "|---|---|---|---|---|---|---|",
    ]
    completed: dict[str, list[float]] = {p: [] for p in ELASTIC_POLICIES}
    average: dict[str, list[float]] = {p: [] for p in ELASTIC_POLICIES}
    for load in ELASTIC_LOADS:
        spec = elastic_spec(load, quick=quick)
        drawn = synthetic(spec, cluster_gpus=gpus, gpus_per_node=4)
        jobs = [j for j in drawn if j.submit_s < ELASTIC_WINDOW_S]
        for policy in ELASTIC_POLICIES:
            result = simulate(
                nodes, jobs, policy, label=f"load {load:g} {policy}", progress=progress
            )
            results.append(result)
            summary = result.summary()
            within = completed_within(result, ELASTIC_WINDOW_S)
            completed[policy].append(float(within))
            average[policy].append(summary["avg_jct_s"] / 3600.0)
            table.append(
                f"| {load:g} | {policy} | {len(jobs)} | {within} | "
                f"{duration_text(summary['avg_jct_s'])} | {duration_text(summary['p99_jct_s'])} | "
                f"{summary['restarts']:.0f} |"
            )
    notes = (
        f"{len(nodes)} nodes x 4 GPUs ({gpus} GPUs). Jobs of 1-8 one-GPU learners (elastic "
        "range 1 GPU .. 4 x requested), run times 15 min - 6 h log-uniform at the requested "
        "size, families resnet-like, bert-like, small-cnn; arrivals (Poisson, offering the "
        "load) spread over 24 h; restart cost 30 s, checkpoints every 10 min.\n\n"
        + "\n".join(table)
    )
    groups = [f"{load:g}" for load in ELASTIC_LOADS]

    def charts(target: Path) -> list[Path]:
        return [
            bar_chart(
                target / "completed_24h.png",
                groups,
                completed,
                ylabel="jobs completed within 24 h",
                xlabel="offered load",
            ),
            bar_chart(
                target / "avg_jct.png",
                groups,
                average,
                ylabel="average JCT (hours, log)",
                xlabel="offered load",
                log=True,
            ),
        ]

    # Every load's time series in one plot is unreadable; the highest load shows the most.
    top = f"load {ELASTIC_LOADS[-1]:g} "
    busiest = {f"load{ELASTIC_LOADS[-1]:g}-": [r for r in results if r.label.startswith(top)]}
    return _finish(
        "elastic",
        "Elastic scaling (GPUs and batch size)",
        results,
        directory,
        notes,
        charts,
        plot_groups=busiest,
    )


# -- 4. Philly -----------------------------------------------------------------------------

PHILLY_POLICIES = ("fifo", "priority-backfill", "elastic")
# The two busiest weeks of the trace (about 500-700 GPUs busy on average).
PHILLY_WINDOW = (datetime(2017, 10, 16), datetime(2017, 10, 30))
PHILLY_64_SAMPLE = 0.1  # about 50-70 busy GPUs: a loaded 64-GPU cluster
PHILLY_1024_SAMPLE = 0.6  # the elastic run stays under 2 minutes


def philly(
    directory: Path | None,
    *,
    quick: bool = False,
    progress: Progress | None = None,
    trace: Path | None = None,
) -> ExperimentOutput:
    start, end = PHILLY_WINDOW
    if quick:
        end = datetime(2017, 10, 18)
    results: list[SimResult] = []
    sizes = ((8, PHILLY_64_SAMPLE), (128, 0.05 if quick else PHILLY_1024_SAMPLE))
    counts = []
    for nodes_count, sample in sizes:
        nodes = cluster(nodes_count, 8, 64.0, 512, prefix=f"p{nodes_count * 8}")
        gpus = nodes_count * 8
        jobs = load_philly(
            trace,
            TraceFilter(start=start, end=end, sample=sample),
            gpus_per_node=8,
            max_gpus=gpus,
        )
        counts.append(len(jobs))
        results += [
            simulate(nodes, jobs, policy, label=f"{gpus} GPUs {policy}", progress=progress)
            for policy in PHILLY_POLICIES
        ]
    notes = (
        f"Submissions from {start:%Y-%m-%d} to {end:%Y-%m-%d} (all virtual clusters). "
        f"64 GPUs (8 nodes x 8 GPUs): sample {sizes[0][1]:g}, {counts[0]} jobs. 1,024 GPUs "
        f"(128 nodes x 8 GPUs): sample {sizes[1][1]:g}, {counts[1]} jobs. One learner per GPU, "
        "4 CPUs and 16 GiB per learner; families by hash of the row; work = trace duration x "
        "throughput at the requested GPUs (so FIFO on a packed placement reproduces the trace "
        "duration); expected durations (for backfill) are the trace durations; elastic range "
        "1 .. 2 x requested GPUs. Jobs larger than the cluster are rejected."
    )
    groups = {
        "gpus64-": [r for r in results if r.label.startswith("64 GPUs")],
        "gpus1024-": [r for r in results if r.label.startswith("1024 GPUs")],
    }
    return _finish("philly", "Philly trace", results, directory, notes, plot_groups=groups)
