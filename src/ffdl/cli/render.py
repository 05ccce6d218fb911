"""How the CLI shows things: rich tables, panels and the one-line texts of statuses and logs,
and the plain-text and JSON-line forms FfDL's CLI printed records in (``loglines``,
``emetrics``, ``logs --metrics``), which scripts read.

Every function takes the API's JSON shapes and tolerates missing keys (and FfDL's int64
fields sent as strings), so a server that sends less than the contract still renders.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ffdl.core.resources import slot_noun

_STATUS_STYLES = {
    "QUEUED": "yellow",
    "PENDING": "yellow",
    "DOWNLOADING": "cyan",
    "PROCESSING": "cyan",
    "STORING": "cyan",
    "RESCALING": "magenta",
    "HALTING": "magenta",
    "HALTED": "magenta",
    "COMPLETED": "bold green",
    "FAILED": "bold red",
    "CANCELLED": "dim",
}
MAX_EVENTS_SHOWN = 10
TIMES = "\N{MULTIPLICATION SIGN}"


def _dig(data: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _text(value: Any, empty: str = "-") -> str:
    return empty if value is None or value == "" else str(value)


def status_style(status: str | None) -> str:
    return _STATUS_STYLES.get(status or "", "")


def status_cell(status: str | None) -> Text:
    return Text(_text(status), style=status_style(status))


def format_time(value: Any) -> str:
    """An ISO 8601 stamp as ``YYYY-MM-DD HH:MM:SS`` in its own offset; ``-`` when absent."""
    if not value:
        return "-"
    try:
        stamp = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return str(value)
    return stamp.strftime("%Y-%m-%d %H:%M:%S")


def error_text(code: str, message: str) -> Text:
    return Text(f"Error ({code}): {message}", style="red")


def models_table(models: Sequence[dict[str, Any]], total: int | None = None) -> Table:
    """Most telling columns first, fitting 80 columns: no vertical rules, short headers and
    times; only the id never wraps, and the rest fold rather than end in an ellipsis."""
    table = Table(
        title=None if total is None else f"{len(models)} of {total} models",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("ID", no_wrap=True)
    for name, justify in (
        ("Status", "left"),
        ("Progress", "left"),
        (f"L{TIMES}G", "right"),
        ("Submitted", "left"),
        ("Name", "left"),
    ):
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for model in models:
        training = model.get("training") or {}
        status = _dig(training, "training_status", "status")
        table.add_row(
            _text(model.get("model_id")),
            status_cell(status),
            progress_text(model) or "-",
            f"{_text(training.get('learners'))}{TIMES}{_text(training.get('gpus'))}",
            short_time(
                _dig(training, "training_status", "submitted_at")
                or _dig(training, "training_status", "submitted")
            ),
            _text(model.get("name")),
        )
    return table


def short_time(value: Any) -> str:
    """An ISO 8601 stamp in local time: ``HH:MM:SS`` today, else ``MM-DD HH:MM``."""
    if not value:
        return "-"
    try:
        stamp = datetime.fromisoformat(str(value).replace("Z", "+00:00")).astimezone()
    except ValueError:
        return str(value)
    if stamp.date() == datetime.now().astimezone().date():
        return stamp.strftime("%H:%M:%S")
    return stamp.strftime("%m-%d %H:%M")


def duration_text(seconds: Any) -> str:
    """``45s``, ``12m 05s``, ``3h 20m``, ``2d 04h``; ``-`` when unknown."""
    if not isinstance(seconds, int | float) or seconds < 0:
        return "-"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h {whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d {whole % 86400 // 3600:02d}h"


def progress_text(model: dict[str, Any]) -> str | None:
    """A running job's ``42% 3m 10s left``; a queued job's ``#2 ETA 5m``."""
    queue = model.get("queue")
    if isinstance(queue, dict):
        eta = queue.get("eta_s")
        when = f" ETA {duration_text(eta)}" if eta is not None else ""
        return f"#{_text(queue.get('position'))}{when}"
    progress = model.get("progress")
    if not isinstance(progress, dict):
        return None
    parts = []
    if isinstance(progress.get("fraction"), int | float):
        parts.append(f"{progress['fraction']:.0%}")
    elif progress.get("step") is not None:
        parts.append(f"step {progress['step']}")
    if progress.get("remaining_s") is not None:
        parts.append(f"{duration_text(progress['remaining_s'])} left")
    return " ".join(parts) or None


def _queue_text(queue: Any) -> str | None:
    if not isinstance(queue, dict):
        return None
    parts = [f"position {_text(queue.get('position'))}"]
    if queue.get("eta"):
        parts.append(f"ETA {format_time(queue['eta'])}")
    if queue.get("reason"):
        parts.append(str(queue["reason"]))
    return ", ".join(parts)


def _progress_fact(progress: Any) -> str | None:
    if not isinstance(progress, dict):
        return None
    parts = []
    for count, total, unit in (
        ("step", "total_steps", "steps"),
        ("samples", "total_samples", "samples"),
        ("epoch", "total_epochs", "epochs"),
    ):
        if progress.get(count) is not None:
            of = f" of {progress[total]}" if progress.get(total) else ""
            parts.append(f"{progress[count]}{of} {unit}")
    if isinstance(progress.get("fraction"), int | float):
        parts.append(f"{progress['fraction']:.0%}")
    if isinstance(progress.get("samples_per_s"), int | float):
        parts.append(f"{progress['samples_per_s']:.1f} samples/s")
    if progress.get("remaining_s") is not None:
        end = format_time(progress.get("estimated_end_at"))
        parts.append(f"{duration_text(progress['remaining_s'])} left (ends about {end})")
    return ", ".join(parts) or None


def _gpu_use_text(use: Any) -> str | None:
    if not isinstance(use, dict) or not isinstance(use.get("average"), int | float):
        return None
    text = f"{use['average']:.0f}% average over {duration_text(use.get('measured_s'))}"
    if isinstance(use.get("latest"), int | float):
        text += f", {use['latest']:.0f}% now"
    if isinstance(use.get("memory_mb"), int | float):
        text += f", {use['memory_mb']:.0f} MiB"
    if use.get("idle_flagged"):
        text += " (flagged: GPUs idle)"
    return text


def _start_estimate_text(estimate: Any) -> str | None:
    if not isinstance(estimate, dict) or not isinstance(estimate.get("error_s"), int | float):
        return None
    error = float(estimate["error_s"])
    side = "later" if error > 0 else "earlier"
    return (
        f"started {duration_text(abs(error))} {side} than first estimated "
        f"({format_time(estimate.get('first_eta_at'))})"
    )


def _placement_text(placement: Any, node_types: Mapping[str, str]) -> str | None:
    if not isinstance(placement, list) or not placement:
        return None
    rows = []
    for item in placement:
        gpu_ids = item.get("gpu_ids") or []
        noun = slot_noun(node_types.get(str(item.get("node"))), len(gpu_ids))
        gpus = f" {noun} {','.join(str(g) for g in gpu_ids)}" if gpu_ids else ""
        rows.append(f"learner {_text(item.get('learner'))} → {_text(item.get('node'))}{gpus}")
    return "\n".join(rows)


def _learners_text(learners: Any) -> str | None:
    if not isinstance(learners, list) or not learners:
        return None
    rows = []
    for item in learners:
        row = f"learner {_text(item.get('learner'))}: {_text(item.get('status'))}"
        if item.get("exit_code") is not None:
            row += f" (exit {item['exit_code']})"
        if item.get("attempt"):
            row += f", attempt {item['attempt']}"
        rows.append(row)
    return "\n".join(rows)


def _events_table(events: Any) -> Table | None:
    if not isinstance(events, list) or not events:
        return None
    shown = events[-MAX_EVENTS_SHOWN:]
    title = "Events" if len(shown) == len(events) else f"Last {len(shown)} of {len(events)} events"
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    # Times, statuses and learner numbers never wrap; the reason, free text, does.
    for column in ("Time", "From", "To", "Learner"):
        table.add_column(column, no_wrap=True)
    table.add_column("Reason", ratio=1)
    for event in shown:
        table.add_row(
            short_time(event.get("time")),
            _text(event.get("from")),
            status_cell(event.get("to")),
            _text(event.get("learner")),
            _text(event.get("reason")),
        )
    return table


def _attempts_table(attempts: Any, restarts: Any) -> Table | None:
    """One row per attempt (each placement of the job), how it ended and why."""
    if not isinstance(attempts, list) or not attempts:
        return None
    title = "Attempts"
    if isinstance(restarts, dict) and restarts.get("max"):
        title += f" (automatic restarts {_text(restarts.get('taken'), '0')} of {restarts['max']})"
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("#", "Started", "Ended", "Status"):
        table.add_column(column, no_wrap=True)
    table.add_column("Reason", ratio=1)
    for attempt in attempts:
        if not isinstance(attempt, dict):
            continue
        table.add_row(
            _text(attempt.get("attempt")),
            short_time(attempt.get("started")),
            short_time(attempt.get("ended")),
            status_cell(attempt.get("status")),
            _text(attempt.get("reason")),
        )
    return table


def model_panel(model: dict[str, Any], node_types: Mapping[str, str] | None = None) -> Panel:
    """Everything a user asks about one job: status, why, where it runs, where results go.

    ``node_types``: each node's ``gpu_type``, so that a job placed on hosts without GPUs is
    said to hold CPU slots."""
    types = node_types or {}
    kinds = {types.get(str(item.get("node"))) for item in model.get("placement") or []}
    unit = slot_noun(kinds.pop() if len(kinds) == 1 else None)
    training = model.get("training") or {}
    status_info = training.get("training_status") or {}
    status = status_info.get("status")
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold", no_wrap=True)
    facts.add_column()

    def fact(label: str, value: str | Text | None) -> None:
        if value is not None and value != "":
            facts.add_row(label, value)

    fact("Name", _text(model.get("name")))
    fact("Status", status_cell(status))
    fact("Reason", status_info.get("status_message") or status_info.get("status_description"))
    if status_info.get("error_code") or status_info.get("exit_code") not in (None, 0):
        fact(
            "Error",
            f"code {_text(status_info.get('error_code'))}, "
            f"exit code {_text(status_info.get('exit_code'))}",
        )
    framework = model.get("framework") or {}
    asked = f"{_text(framework.get('name'))} {_text(framework.get('version'), '')}".strip()
    runtime = framework.get("runtime")
    fact("Framework", f"{asked}, runs on {runtime}" if runtime else asked)
    fact(
        "Resources",
        f"{_text(training.get('learners'))} learner(s) {TIMES} {_text(training.get('gpus'))} "
        f"{unit}, "
        f"{_text(training.get('cpus'))} CPU, "
        f"{_text(training.get('memory'))} {_text(training.get('memory_unit'), 'MiB')}",
    )
    fact("Priority", _text(model.get("priority")))
    fact("Owner", f"{_text(model.get('user'))} ({_text(model.get('tenant'))})")
    # ISO 8601 ``*_at`` (FfDL's ``submitted``/``completed`` are epoch milliseconds).
    for label, key in (
        ("Submitted", "submitted"),
        ("Started", "started"),
        ("Completed", "completed"),
    ):
        fact(label, format_time(status_info.get(f"{key}_at") or status_info.get(key)))
    fact("Queue", _queue_text(model.get("queue")))
    fact("Progress", _progress_fact(model.get("progress")))
    fact("GPU use", _gpu_use_text(model.get("gpu_utilization")))
    fact("Start vs ETA", _start_estimate_text(model.get("start_estimate")))
    fact("Placement", _placement_text(model.get("placement"), types))
    fact("Learners", _learners_text(model.get("learners")))
    results = model.get("results") or {}
    fact("Results", _text(results.get("location"), "not stored yet"))
    model_id = _text(model.get("model_id"))
    fact("Download", f"ffdl download {model_id} --trained-model")
    parts: list[RenderableType] = [facts]
    attempts = _attempts_table(model.get("attempts"), model.get("restarts"))
    if attempts is not None:
        parts.append(Text(""))
        parts.append(attempts)
    events = _events_table(model.get("events"))
    if events is not None:
        parts.append(Text(""))
        parts.append(events)
    return Panel(Group(*parts), title=f"[bold]{model_id}[/bold]", title_align="left")


def log_text(item: dict[str, Any]) -> Text:
    """A log line as printed: the line itself, without markup interpretation."""
    return Text(str(item.get("line", "")))


def status_change_text(data: dict[str, Any]) -> Text:
    status = _text(data.get("status"))
    text = Text("── status ", style="dim")
    text.append(status, style=status_style(status) or "bold")
    if data.get("reason"):
        text.append(f" ({data['reason']})", style="dim")
    return text


def demo_summary_panel(
    *,
    model_id: str,
    status: str,
    test_accuracy: str | None,
    results_location: str | None,
    download_hint: str,
    dashboard_url: str,
    docs_url: str,
) -> Panel:
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold", no_wrap=True)
    facts.add_column()
    facts.add_row("Model ID", model_id)
    facts.add_row("Final status", status_cell(status))
    facts.add_row("Test accuracy", test_accuracy or "not reported")
    facts.add_row("Trained model", results_location or "not stored")
    facts.add_row("To download", download_hint)
    facts.add_row("Dashboard", dashboard_url)
    facts.add_row("API docs", docs_url)
    style = "green" if status == "COMPLETED" else "red"
    return Panel(facts, title="[bold]ffdl demo[/bold]", title_align="left", border_style=style)


# -- FfDL's plain-text record formats (``loglines``, ``emetrics``, ``logs --metrics``) ------


def json_line(data: Any) -> str:
    """One record as compact JSON on one line, as FfDL's CLI marshalled it."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def _int_or_none(value: Any) -> int | None:
    # FfDL's spec types int64 fields as strings on the wire; accept both spellings.
    if isinstance(value, bool):
        return None
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def _any_value(value: Any) -> Any:
    """The value of FfDL's typed ``{"type": ..., "value": ...}``, or the value itself."""
    return value.get("value") if isinstance(value, dict) else value


def _number(value: Any) -> Any:
    """A metric value as a JSON number when it is one, else as given."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    try:
        number = float(str(value))
    except (TypeError, ValueError):
        return value
    return int(number) if number.is_integer() and "." not in str(value) else number


def record_time_ms(record: dict[str, Any]) -> int | None:
    """Epoch milliseconds of a log or metric record (``meta.time``)."""
    return _int_or_none(_dig(record, "meta", "time"))


def record_rindex(record: dict[str, Any]) -> int | None:
    return _int_or_none(_dig(record, "meta", "rindex"))


def logline_line(item: dict[str, Any]) -> str:
    """``RINDEX TIME LINE``: FfDL's ``loglines`` output without ``--json``."""
    rindex = record_rindex(item)
    millis = record_time_ms(item)
    return f"{_text(rindex, '0')} {_text(millis, '0')} {item.get('line', '')}"


def _typed_pairs(values: Any) -> str:
    if not isinstance(values, dict):
        return ""
    return ", ".join(f"{name}: {_any_value(values[name])}" for name in sorted(values))


def emetrics_lines(record: dict[str, Any]) -> list[str]:
    """FfDL's three-line ``emetrics`` output of one record without ``--json``."""
    return [
        f"time: {_text(record_time_ms(record), '0')}, "
        f"group-label: {record.get('grouplabel') or ''}, "
        f"training-id: {_dig(record, 'meta', 'training_id') or ''}",
        f"    etimes: {_typed_pairs(record.get('etimes'))}",
        f"    values: {_typed_pairs(record.get('values'))}",
    ]


def metric_data(record: dict[str, Any]) -> dict[str, Any]:
    """An emetrics record in the shape of FfDL's ``MetricData`` (``logs --metrics --json``).

    ``type`` is the group label, ``timestamp`` the record's time as
    ``yyyy-MM-ddTHH:mm:ss.SSSZ``, ``iteration`` the ``iteration`` etime and ``Values`` (FfDL's
    capital V) the metric values as numbers.
    """
    millis = record_time_ms(record)
    stamp = ""
    if millis is not None and millis >= 0:
        moment = datetime.fromtimestamp(millis / 1000.0, tz=UTC)
        stamp = moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{millis % 1000:03d}Z"
    etimes = record.get("etimes") if isinstance(record.get("etimes"), dict) else {}
    iteration = _int_or_none(_any_value((etimes or {}).get("iteration")))
    values = record.get("values") if isinstance(record.get("values"), dict) else {}
    return {
        "type": str(record.get("grouplabel") or ""),
        "timestamp": stamp,
        "iteration": iteration if iteration is not None else 0,
        "Values": {str(k): _number(_any_value(v)) for k, v in (values or {}).items()},
    }


def metric_data_line(data: dict[str, Any]) -> str:
    """FfDL's ``logs --metrics`` text: timestamp, type and iteration, then each value."""
    head = (
        f"Timestamp: {data.get('timestamp', ''):<12} "
        f"Type: {data.get('type', ''):<8} "
        f"Iteration: {data.get('iteration', 0)!s:<7}"
    )
    values = data.get("Values") or {}
    # FfDL's columns of 12, but a value never runs into the next name: numbers keep six
    # significant digits and at least one space follows each value.
    tail = "".join(f"{name}: {_metric_value_text(values[name]):<12} " for name in sorted(values))
    return (head + tail).rstrip()


def _metric_value_text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
