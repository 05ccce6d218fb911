"""``ffdl simulate``: replay a synthetic or traced workload through the platform's scheduler.

Runs the discrete-event simulator (``ffdl.sim``) on a virtual cluster of identical nodes, or
one of the four reproductions with ``--experiment``, prints the summary table, and with
``--report DIR`` writes ``summary.md``, ``summary.csv`` and PNG plots there. Progress
(simulated time against the horizon, or against the expected end) goes to stderr.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from ffdl.core.errors import FfdlError
from ffdl.core.resources import Node
from ffdl.core.units import parse_size_mb

if TYPE_CHECKING:
    from ffdl.sim.metrics import SimResult
    from ffdl.sim.workload import SimJob

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

# The simulator (and numpy under it) is imported only when the command runs, so the rest of
# the CLI starts fast; tests check these names against ffdl.sim's own.
WORKLOADS = ("synthetic", "philly")
POLICY_NAMES = (
    "fifo",
    "priority-backfill",
    "elastic",
    "elastic-fixed-batch",
    "gang",
    "learner-at-a-time",
)
EXPERIMENT_NAMES = ("pack-spread", "gang", "elastic", "philly")


class SimulateError(FfdlError):
    default_code = "SIM"


def _choice(value: str, allowed: tuple[str, ...], what: str) -> str:
    if value not in allowed:
        raise typer.BadParameter(f"{what} must be one of {', '.join(allowed)}, not {value!r}")
    return value


def summary_table(results: list[SimResult], title: str) -> Table:
    """The numbers of one run as a list, or of several runs as rows of the headline ones."""
    from ffdl.sim.report import COLUMNS, cell, duration_text

    if len(results) == 1:
        (result,) = results
        summary = result.summary()
        table = Table(title=f"{title}: {result.label}", title_justify="left")
        table.add_column("metric", min_width=32)
        table.add_column("value", justify="right")
        for key, column, kind in COLUMNS:
            table.add_row(column, cell(summary[key], kind))
        return table
    table = Table(title=title)
    table.add_column("run", no_wrap=True)
    for column in ("done/jobs", "avg JCT", "p99 JCT", "avg wait", "makespan", "GPUs held"):
        table.add_column(column, justify="right")
    table.add_column("restarts", justify="right")
    for result in results:
        summary = result.summary()
        table.add_row(
            result.label,
            f"{summary['completed']:,.0f}/{summary['jobs']:,.0f}",
            duration_text(summary["avg_jct_s"]),
            duration_text(summary["p99_jct_s"]),
            duration_text(summary["avg_queueing_s"]),
            duration_text(summary["makespan_s"]),
            cell(summary["held_utilisation"], "percent"),
            cell(summary["restarts"], "count"),
        )
    return table


@contextmanager
def _progress(enabled: bool) -> Iterator[Callable[[str, float, float | None], None]]:
    """A callback drawing one bar per run label: virtual time against the total."""
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[virtual]}"),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=not enabled,
    )
    tasks: dict[str, TaskID] = {}

    def update(label: str, now: float, total: float | None) -> None:
        task = tasks.get(label)
        if task is None:
            task = tasks[label] = progress.add_task(label, total=total, virtual="")
        hours = now / 3600.0
        text = f"{hours:,.1f} h" if total is None else f"{hours:,.1f} / {total / 3600.0:,.1f} h"
        progress.update(task, completed=min(now, total) if total else now, virtual=text)

    with progress:
        yield update


def _nodes(count: int, gpus: int, cpus: float, memory: str) -> list[Node]:
    if count < 1 or gpus < 0 or cpus <= 0:
        raise typer.BadParameter("need --nodes >= 1, --gpus-per-node >= 0, --cpus-per-node > 0")
    memory_mb = parse_size_mb(memory, "memory-per-node")
    return [Node(f"node-{i:03d}", gpus, cpus, memory_mb) for i in range(count)]


def _philly_jobs(
    trace: Path | None,
    start: str | None,
    end: str | None,
    vc: str | None,
    sample: float,
    seed: int,
    gpus_per_node: int,
    cluster_gpus: int,
) -> list[SimJob]:
    from ffdl.sim.philly import TraceFilter, load_philly, parse_time

    where = TraceFilter(
        start=parse_time(start) if start else None,
        end=parse_time(end) if end else None,
        vc=vc,
        sample=sample,
        seed=seed,
    )
    return load_philly(trace, where, gpus_per_node=gpus_per_node, max_gpus=cluster_gpus)


def _expected_end(jobs: list[SimJob], gpus_per_node: int) -> float:
    if not jobs:
        return 0.0
    origin = min(j.submit_s for j in jobs)
    return max(j.submit_s - origin + j.run_time_s(gpus_per_node) for j in jobs)


def simulate_command(
    workload: Annotated[
        str, typer.Option(help=f"Workload: {' | '.join(WORKLOADS)}.")
    ] = "synthetic",
    policy: Annotated[str, typer.Option(help=f"Policy: {' | '.join(POLICY_NAMES)}.")] = "fifo",
    placement: Annotated[str, typer.Option(help="Default placement: pack | spread.")] = "pack",
    nodes: Annotated[int, typer.Option(help="Nodes in the virtual cluster.")] = 16,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node.")] = 4,
    cpus_per_node: Annotated[float, typer.Option(help="CPUs per node.")] = 32.0,
    memory_per_node: Annotated[str, typer.Option(help="Memory per node (FfDL units).")] = "128GiB",
    jobs: Annotated[int, typer.Option(help="Synthetic: number of jobs.")] = 200,
    load: Annotated[float, typer.Option(help="Synthetic: offered GPU load (1.0 = full).")] = 0.8,
    seed: Annotated[int, typer.Option(help="Seed of the workload (and trace sampling).")] = 1,
    horizon: Annotated[
        float | None, typer.Option(help="Stop at this virtual time (seconds).")
    ] = None,
    tick: Annotated[float, typer.Option(help="Seconds between timer passes.")] = 60.0,
    restart_cost: Annotated[
        float, typer.Option(help="Seconds without progress after a preemption or rescale.")
    ] = 30.0,
    checkpoint_interval: Annotated[
        float, typer.Option(help="Seconds between periodic checkpoints.")
    ] = 600.0,
    trace: Annotated[
        Path | None, typer.Option(help="Philly: trace CSV (default data/philly-jobs.csv).")
    ] = None,
    start: Annotated[str | None, typer.Option(help="Philly: first submission (date).")] = None,
    end: Annotated[str | None, typer.Option(help="Philly: submissions before (date).")] = None,
    vc: Annotated[str | None, typer.Option(help="Philly: one virtual cluster.")] = None,
    sample: Annotated[float, typer.Option(help="Philly: fraction of rows kept.")] = 1.0,
    full_snapshots: Annotated[
        bool, typer.Option(help="Give the scheduler the whole cluster and queue every pass.")
    ] = False,
    experiment: Annotated[
        str | None,
        typer.Option(help=f"Run a reproduction: {' | '.join(EXPERIMENT_NAMES)}."),
    ] = None,
    quick: Annotated[
        bool, typer.Option(help="With --experiment: a smaller, faster version.")
    ] = False,
    report: Annotated[
        Path | None, typer.Option(help="Write summary.md, summary.csv and plots here.")
    ] = None,
) -> None:
    """Simulate a cluster under a scheduling policy, on the platform's own decision code."""
    from ffdl.sim.engine import SimConfig, Simulator
    from ffdl.sim.experiments import run_experiment
    from ffdl.sim.policies import make_policy
    from ffdl.sim.report import write_report
    from ffdl.sim.workload import SyntheticSpec, synthetic

    show_progress = err_console.is_terminal
    try:
        if experiment is not None:
            _choice(experiment, EXPERIMENT_NAMES, "--experiment")
            with _progress(show_progress) as update:
                output = run_experiment(experiment, report, quick=quick, progress=update)
            console.print(summary_table(output.results, f"experiment {experiment}"))
            if output.notes:
                console.print(output.notes, soft_wrap=True)
            _print_written(output.files)
            return
        _choice(workload, WORKLOADS, "--workload")
        _choice(policy, POLICY_NAMES, "--policy")
        _choice(placement, ("pack", "spread"), "--placement")
        cluster = _nodes(nodes, gpus_per_node, cpus_per_node, memory_per_node)
        cluster_gpus = nodes * gpus_per_node
        if workload == "synthetic":
            spec = SyntheticSpec(jobs=jobs, load=load, seed=seed, elastic=True)
            sim_jobs = synthetic(spec, cluster_gpus=cluster_gpus, gpus_per_node=gpus_per_node)
        else:
            sim_jobs = _philly_jobs(
                trace, start, end, vc, sample, seed, gpus_per_node, cluster_gpus
            )
        if not sim_jobs:
            raise SimulateError("the workload has no jobs (check the trace filters)")
        config = SimConfig(
            tick_s=tick,
            horizon_s=horizon,
            restart_s=restart_cost,
            checkpoint_s=checkpoint_interval,
            reductions=not full_snapshots,
        )
        total = horizon if horizon is not None else _expected_end(sim_jobs, gpus_per_node)
        label = f"{policy} {placement}"
        with _progress(show_progress) as update:
            simulator = Simulator(
                cluster,
                sim_jobs,
                make_policy(policy, placement=placement),
                config,
                label=label,
                on_progress=lambda now: update(label, now, total),
            )
            result = simulator.run()
        console.print(summary_table([result], f"{len(sim_jobs)} jobs on {cluster_gpus} GPUs"))
        if report is not None:
            title = f"{workload} workload, {policy} ({placement}), {cluster_gpus} GPUs"
            _print_written(write_report([result], report, title=title))
    except ValueError as exc:  # includes the trace loader's TraceError
        raise SimulateError(str(exc)) from None


def _print_written(files: list[Path]) -> None:
    for path in files:
        console.print(f"wrote {path}")


__all__ = ["simulate_command", "summary_table"]
