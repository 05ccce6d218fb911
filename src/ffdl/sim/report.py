"""Reports of simulation runs: a summary table (markdown and CSV) and PNG plots.

``write_report`` puts ``summary.md``, ``summary.csv`` and the plots for a set of runs in a
directory: utilisation (GPUs held, and GPUs running whole gangs where they differ), fragmented
GPUs and queued jobs over time, and the distribution of job completion times. Plots use
matplotlib's Agg backend (no display needed) at a size and resolution that keeps each PNG
well under 200 KB; long series are thinned to at most ``MAX_POINTS`` samples.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ffdl.sim.metrics import SimResult

MAX_POINTS = 1200
FIGURE_SIZE = (8.0, 3.2)
DPI = 80

# (summary key, column title, kind) in table order; kind says how markdown shows it.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("jobs", "jobs", "count"),
    ("completed", "completed", "count"),
    ("rejected", "rejected", "count"),
    ("avg_jct_s", "avg JCT", "duration"),
    ("p99_jct_s", "p99 JCT", "duration"),
    ("avg_queueing_s", "avg queueing", "duration"),
    ("makespan_s", "makespan", "duration"),
    ("held_utilisation", "GPUs held", "percent"),
    ("running_utilisation", "GPUs running", "percent"),
    ("avg_fragmented_gpus", "fragmented GPUs", "number"),
    ("restarts", "restarts", "count"),
    ("wall_s", "wall time", "seconds"),
)


def duration_text(seconds: float) -> str:
    """A duration people read at a glance: 45 s, 12.5 min, 3.2 h, 4.1 d."""
    if math.isnan(seconds):
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def cell(value: float, kind: str) -> str:
    if math.isnan(value):
        return "-"
    if kind == "count":
        return f"{value:,.0f}"
    if kind == "duration":
        return duration_text(value)
    if kind == "percent":
        return f"{100 * value:.1f}%"
    if kind == "seconds":
        return f"{value:.1f} s"
    return f"{value:.2f}"


def table_rows(results: Sequence[SimResult]) -> list[list[str]]:
    """One row of display cells per run: its label, then ``COLUMNS``."""
    rows = []
    for result in results:
        summary = result.summary()
        rows.append([result.label, *(cell(summary[key], kind) for key, _t, kind in COLUMNS)])
    return rows


def markdown_table(results: Sequence[SimResult]) -> str:
    header = ["run", *(title for _k, title, _kind in COLUMNS)]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines.extend("| " + " | ".join(row) + " |" for row in table_rows(results))
    return "\n".join(lines) + "\n"


def write_csv(results: Sequence[SimResult], path: Path) -> None:
    keys = list(results[0].summary()) if results else []
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["run", "policy", "cluster_gpus", "nodes", *keys])
        for result in results:
            summary = result.summary()
            writer.writerow(
                [
                    result.label,
                    result.policy,
                    result.cluster_gpus,
                    result.nodes,
                    *(_csv_number(summary[key]) for key in keys),
                ]
            )


def _csv_number(value: float) -> str:
    if math.isnan(value):
        return ""
    return f"{value:.6g}" if not float(value).is_integer() else f"{value:.0f}"


def write_report(
    results: Sequence[SimResult],
    directory: Path,
    *,
    title: str,
    notes: str = "",
    plots: bool = True,
    plot_groups: Mapping[str, Sequence[SimResult]] | None = None,
) -> list[Path]:
    """Write the summary files (and plots) for ``results``; return the paths written.

    ``plot_groups`` plots subsets apart (file names prefixed with each key), e.g. runs on
    clusters of different sizes; by default every run is in one set of plots.
    """
    directory.mkdir(parents=True, exist_ok=True)
    written = [directory / "summary.md", directory / "summary.csv"]
    text = f"# {title}\n\n{markdown_table(results)}"
    if notes:
        text += f"\n{notes.strip()}\n"
    if plots and results:
        groups = plot_groups if plot_groups is not None else {"": results}
        for prefix, members in groups.items():
            images = plot_runs(members, directory, prefix=prefix)
            written.extend(images)
            text += "\n" + "\n".join(f"![{p.stem}]({p.name})" for p in images) + "\n"
    written[0].write_text(text, encoding="utf-8")
    write_csv(results, written[1])
    return written


# -- plots ---------------------------------------------------------------------------------


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _thin(values: Sequence[float], every: int) -> list[float]:
    return list(values[::every])


def _time_axis(results: Sequence[SimResult]) -> tuple[float, str]:
    span = max((r.end_s - r.start_s for r in results), default=0.0)
    if span > 4 * 86400:
        return 86400.0, "days"
    if span > 4 * 3600:
        return 3600.0, "hours"
    return 60.0, "minutes"


def plot_runs(results: Sequence[SimResult], directory: Path, *, prefix: str = "") -> list[Path]:
    """Time-series plots and the JCT distribution for ``results``."""
    plt = _pyplot()
    scale, unit = _time_axis(results)
    paths = []
    panels = (
        ("utilisation.png", "GPUs held (% of cluster)", "held_gpus", True),
        ("fragmentation.png", "fragmented GPUs", "fragmented_gpus", False),
        ("queue.png", "queued jobs", "queued_jobs", False),
    )
    for name, ylabel, attribute, percent in panels:
        figure, axes = plt.subplots(figsize=FIGURE_SIZE)
        for result in results:
            series = result.series
            every = max(1, math.ceil(len(series.times) / MAX_POINTS))
            times = [t / scale for t in _thin(series.times, every)]
            values = [float(v) for v in _thin(getattr(series, attribute), every)]
            if percent:
                values = [100.0 * v / max(result.cluster_gpus, 1) for v in values]
            (line,) = axes.step(times, values, where="post", label=result.label, linewidth=1.0)
            if percent and series.running_gpus != series.held_gpus:
                running = [
                    100.0 * v / max(result.cluster_gpus, 1)
                    for v in _thin(series.running_gpus, every)
                ]
                axes.step(
                    times,
                    running,
                    where="post",
                    linestyle="--",
                    color=line.get_color(),
                    linewidth=1.0,
                    label=f"{result.label} (running)",
                )
        axes.set_xlabel(f"virtual time ({unit})")
        axes.set_ylabel(ylabel)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7, loc="best")
        figure.tight_layout()
        path = directory / f"{prefix}{name}"
        figure.savefig(path, dpi=DPI)
        plt.close(figure)
        paths.append(path)
    paths.append(plot_jct(results, directory / f"{prefix}jct.png"))
    return paths


def plot_jct(results: Sequence[SimResult], path: Path) -> Path:
    """Cumulative distribution of job completion times, one line per run."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=FIGURE_SIZE)
    for result in results:
        jcts = sorted(o.jct_s for o in result.outcomes if o.jct_s is not None)
        if not jcts:
            continue
        every = max(1, math.ceil(len(jcts) / MAX_POINTS))
        xs = [max(v, 1.0) / 3600.0 for v in jcts[::every]]
        ys = [100.0 * (i * every + 1) / len(jcts) for i in range(len(xs))]
        axes.step(xs, ys, where="post", label=result.label, linewidth=1.0)
    axes.set_xscale("log")
    axes.set_xlabel("job completion time (hours, log scale)")
    axes.set_ylabel("jobs completed (%)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="best")
    figure.tight_layout()
    figure.savefig(path, dpi=DPI)
    plt.close(figure)
    return path


def bar_chart(
    path: Path,
    groups: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    ylabel: str,
    xlabel: str,
    log: bool = False,
) -> Path:
    """Grouped bars: one group per entry of ``groups``, one bar per key of ``series``."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=FIGURE_SIZE)
    width = 0.8 / max(len(series), 1)
    for index, (name, values) in enumerate(series.items()):
        xs = [g + (index - (len(series) - 1) / 2) * width for g in range(len(groups))]
        axes.bar(xs, [0.0 if math.isnan(v) else v for v in values], width, label=name)
    axes.set_xticks(range(len(groups)), list(groups))
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    if log:
        axes.set_yscale("log")
    axes.grid(alpha=0.3, axis="y")
    axes.legend(fontsize=7, loc="best")
    figure.tight_layout()
    figure.savefig(path, dpi=DPI)
    plt.close(figure)
    return path
