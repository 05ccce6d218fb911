"""``loglines``, ``emetrics`` and ``logs``: a job's log lines and metrics, as FfDL printed them.

Without ``--json`` the records print in FfDL's text forms (``RINDEX TIME LINE`` for log lines,
three lines per metrics record, ``Timestamp: ... Type: ... Iteration: ...`` for
``logs --metrics``); with ``--json`` each record is one line of compact JSON in FfDL's shapes
(``loglines``/``emetrics``: the API's items; ``logs --metrics``: FfDL's ``MetricData``).

Without ``--pagesize`` or ``--pos`` every record prints, page after page (FfDL's CLI
printed the server's first page of 10); with either, one page prints, and when it is full a
note on stderr says how to get the next. ``--follow`` prints what is recorded, then the
job's event stream until the job ends (FfDL's CLI polled forever; a script here gets its
prompt back when the job stops).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.console import Console

from ffdl.cli.context import client_of
from ffdl.cli.render import (
    emetrics_lines,
    json_line,
    log_text,
    logline_line,
    metric_data,
    metric_data_line,
    record_rindex,
    record_time_ms,
    status_change_text,
)
from ffdl.client.http import Client

LOG_PAGE_SIZE = 500
# The server's page when a request names none (FfDL's), and the largest it gives.
SERVER_PAGE_SIZE = 10
SERVER_MAX_PAGE = 10_000
# Asking the event stream for log lines after the largest row id means "no log lines": the
# metric commands follow only the ``emetric`` events.
NO_LOG_LINES = 2**63 - 1

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

ModelId = Annotated[str, typer.Argument(metavar="ID", help="Model ID (training-...).")]
Since = Annotated[
    str | None,
    typer.Option(
        "--since",
        "--since-time",
        help="Only records at or after this time: epoch milliseconds or ISO 8601.",
    ),
]
PageSize = Annotated[
    int | None,
    typer.Option("--pagesize", help="Print one page of this many records (default: all)."),
]
Pos = Annotated[
    int | None,
    typer.Option("--pos", help="If positive, offset from the start; if negative, from the end."),
]
Follow = Annotated[
    bool,
    typer.Option("--follow", "-f", help="Keep printing new records until the job ends."),
]
AsJson = Annotated[bool, typer.Option("--json", help="One JSON record per line.")]

Fetch = Callable[..., list[dict[str, Any]]]


def since_millis(since: str | None) -> int | None:
    """``--since`` as epoch milliseconds, for filtering streamed records; None if not given."""
    if not since:
        return None
    try:
        return int(float(since))
    except OverflowError:
        return None
    except ValueError:
        pass
    try:
        stamp = datetime.fromisoformat(since.replace("Z", "+00:00"))
    except ValueError:
        return None  # the server names the bad value when it is asked
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return int(stamp.timestamp() * 1000)


def _streamed(
    client: Client, model_id: str, kind: str, *, after: int | None, since: int | None
) -> Iterator[dict[str, Any]]:
    """Records of ``kind`` (``log`` or ``emetric``) from the event stream until the job ends,
    skipping those already printed (rindex up to ``after``) and those before ``since``."""
    start = (after or 0) if kind == "log" else NO_LOG_LINES
    for event in client.follow(model_id, since_rindex=start):
        if event.kind == "end":
            return
        if event.kind != kind:
            continue
        rindex = record_rindex(event.data)
        if after is not None and rindex is not None and rindex <= after:
            continue
        millis = record_time_ms(event.data)
        if since is not None and millis is not None and millis < since:
            continue
        yield event.data


def _print_records(
    client: Client,
    model_id: str,
    kind: str,
    fetch: Fetch,
    emit: Callable[[dict[str, Any]], None],
    *,
    since: str | None,
    pagesize: int | None,
    pos: int | None,
    follow: bool,
) -> None:
    """Every record (or the one page asked for), then, with ``follow``, the stream."""
    last: int | None = None
    for record in _recorded(fetch, model_id, since=since, pagesize=pagesize, pos=pos):
        emit(record)
        rindex = record_rindex(record)
        if rindex is not None:
            last = rindex if last is None else max(last, rindex)
    if not follow:
        return
    for record in _streamed(client, model_id, kind, after=last, since=since_millis(since)):
        emit(record)


def _recorded(
    fetch: Fetch, model_id: str, *, since: str | None, pagesize: int | None, pos: int | None
) -> Iterator[dict[str, Any]]:
    """The records asked for: one page with ``pagesize`` or ``pos``, else all of them."""
    if pagesize is not None or pos is not None:
        page = fetch(model_id, since_time=since, pagesize=pagesize, pos=pos)
        yield from page
        size = SERVER_PAGE_SIZE if pagesize is None else pagesize
        if page and len(page) >= size:
            start = pos or 0
            more = (
                f"the next: --pos {start + len(page)}"
                if start >= 0
                else f"the one before: --pos {start - len(page)}"
            )
            err_console.print(
                f"(one page of {len(page)} records; {more}; all of them: leave out "
                "--pagesize and --pos)",
                soft_wrap=True,
            )
        return
    back = _records_back(since)
    if back is not None:
        # "-N": the last N records, which the server counts from the end at each request.
        yield from fetch(model_id, since_time=since, pagesize=min(back, SERVER_MAX_PAGE))
        return
    offset = 0
    while True:
        page = fetch(model_id, since_time=since, pagesize=LOG_PAGE_SIZE, pos=offset)
        yield from page
        if len(page) < LOG_PAGE_SIZE:
            return
        offset += len(page)


def _records_back(since: str | None) -> int | None:
    """N for ``--since -N`` (the last N records), else None."""
    text = (since or "").strip()
    if text.startswith("-") and text[1:].isdigit():
        return max(int(text[1:]), 1)
    return None


def loglines_command(
    ctx: typer.Context,
    model_id: ModelId,
    since: Since = None,
    pagesize: PageSize = None,
    pos: Pos = None,
    follow: Follow = False,
    as_json: AsJson = False,
) -> None:
    """Print a job's log lines: RINDEX TIME LINE, or JSON records with --json."""

    def emit(item: dict[str, Any]) -> None:
        typer.echo(json_line(item) if as_json else logline_line(item))

    with client_of(ctx) as client:
        _print_records(
            client,
            model_id,
            "log",
            client.loglines,
            emit,
            since=since,
            pagesize=pagesize,
            pos=pos,
            follow=follow,
        )


def emetrics_command(
    ctx: typer.Context,
    model_id: ModelId,
    since: Since = None,
    pagesize: PageSize = None,
    pos: Pos = None,
    follow: Follow = False,
    as_json: AsJson = False,
) -> None:
    """Print a job's evaluation metrics, or JSON records with --json."""

    def emit(record: dict[str, Any]) -> None:
        if as_json:
            typer.echo(json_line(record))
        else:
            for line in emetrics_lines(record):
                typer.echo(line)

    with client_of(ctx) as client:
        _print_records(
            client,
            model_id,
            "emetric",
            client.emetrics,
            emit,
            since=since,
            pagesize=pagesize,
            pos=pos,
            follow=follow,
        )


def follow_lines(client: Client, model_id: str, *, on_status: bool) -> str:
    """Print the job's log lines until it ends, with ``on_status`` each status change before
    the output that follows it (on stdout), and one final line with the outcome (on stdout
    with ``on_status``, else stderr); the final status.

    Ctrl-C stops following, not the job: it says so and how to follow again (exit 130).
    """
    last: dict[str, Any] = {}
    last_shown = False
    try:
        for event in client.follow(model_id):
            if event.kind == "log":
                typer.echo(str(event.data.get("line", "")))
                last_shown = False
            elif event.kind == "status":
                last = dict(event.data)
                if on_status:
                    console.print(status_change_text(last), soft_wrap=True)
                last_shown = on_status
            elif event.kind == "end":
                final = str(event.data.get("status") or "UNKNOWN")
                if not (last_shown and last.get("status") == final):
                    reason = last.get("reason") if last.get("status") == final else None
                    outcome = status_change_text({"status": final, "reason": reason})
                    (console if on_status else err_console).print(outcome, soft_wrap=True)
                return final
    except KeyboardInterrupt:
        err_console.print(
            f"stopped following; {model_id} is still running; "
            f"ffdl logs {model_id} -f to follow again",
            soft_wrap=True,
        )
        raise typer.Exit(130) from None
    return "UNKNOWN"


def _all_pages(fetch: Fetch, model_id: str) -> Iterator[dict[str, Any]]:
    return _recorded(fetch, model_id, since=None, pagesize=None, pos=None)


def _print_metrics(client: Client, model_id: str, *, follow: bool, as_json: bool) -> None:
    def emit(record: dict[str, Any]) -> None:
        data = metric_data(record)
        typer.echo(json_line(data) if as_json else metric_data_line(data))

    last: int | None = None
    for record in _all_pages(client.emetrics, model_id):
        emit(record)
        rindex = record_rindex(record)
        if rindex is not None:
            last = rindex if last is None else max(last, rindex)
    if follow:
        for record in _streamed(client, model_id, "emetric", after=last, since=None):
            emit(record)


def logs_command(
    ctx: typer.Context,
    model_id: ModelId,
    follow: Follow = False,
    metrics: Annotated[
        bool, typer.Option("--metrics", help="Print the evaluation metrics instead of the log.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="With --metrics: one JSON object (MetricData) a line.")
    ] = False,
) -> None:
    """Print a job's log (or, with --metrics, its evaluation metrics); --follow until it ends."""
    with client_of(ctx) as client:
        if metrics:
            _print_metrics(client, model_id, follow=follow, as_json=as_json)
            return
        if follow:
            follow_lines(client, model_id, on_status=False)
            return
        for item in _all_pages(client.loglines, model_id):
            typer.echo(log_text(item).plain)
