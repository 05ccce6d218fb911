"""Ingesting controller reports: statuses, log lines, metrics, GPU samples and heartbeats.

Each learner attempt numbers its report items 1, 2, 3, ... with no gaps, and the server
keeps the last one applied (``report_seq``). That makes the stream checkable:

- items at or below ``report_seq`` were already applied and are skipped, so a controller may
  resend a batch whose response it never saw without anything being stored twice;
- the items of a batch must be consecutive, and the first new one must be ``report_seq + 1``:
  a batch that jumps ahead (say to seq 2**62, which would make every later genuine item look
  old and silence the job's log) is refused with 409 and stores nothing;
- a job that has ended takes no new items (410), nor does an attempt that was superseded.

Each item's numbers are checked on their own: an item whose iteration cannot be stored, or
whose time or values are absurd, is dropped and a warning line takes its place in the log,
so one bad item never fails its batch nor stalls the stream. A status the learner state
machine does not allow is ignored with a warning line; it never fails a batch either.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import Table, bindparam, select, update
from sqlalchemy.orm import Session

from ffdl.core.errors import AuthError, BadRequest, ConflictError, Gone, IllegalTransition, NotFound
from ffdl.core.limits import (
    MAX_COUNT,
    MAX_GROUP_NAME,
    MAX_INT64,
    MAX_LOG_TEXT,
    MAX_METRIC_NAME,
    MAX_METRIC_VALUES,
    MAX_REASON_TEXT,
    bounded_int,
    iteration_problem,
    metric_value_problem,
    time_problem,
)
from ffdl.core.progress import Report
from ffdl.core.status import (
    TERMINAL_LEARNER_STATES,
    JobStatus,
    LearnerStatus,
    is_terminal,
    learner_transition_allowed,
)
from ffdl.server.platform import Platform
from ffdl.server.report_lanes import RECORD_KINDS
from ffdl.server.services.aggregate import aggregate_job
from ffdl.server.services.gpu_samples import gpu_item_problem, record_gpu_samples
from ffdl.server.services.learner_env import in_place_batch
from ffdl.server.services.progress import progressed, record_progress
from ffdl.server.services.queries import current_learners
from ffdl.server.services.record_numbers import number_lines, number_metrics, numbered
from ffdl.server.store.bulk import insert_rows
from ffdl.server.store.models import Job, Learner, LogLine, Metric
from ffdl.server.store.transitions import set_learner_status, utcnow

log = logging.getLogger("ffdl.server.reports")

MAX_BATCH_ITEMS = 5000
# Report rows go in on the tables themselves (see ``_flush``).
LOG_LINES = cast(Table, LogLine.__table__)
METRICS = cast(Table, Metric.__table__)
JOBS = cast(Table, Job.__table__)
LEARNERS = cast(Table, Learner.__table__)
# The platform puts a learner in PENDING; a controller reports only what follows.
REPORTABLE_STATUSES = frozenset(LearnerStatus) - {LearnerStatus.PENDING}


class ReportItem(BaseModel):
    """One item as a controller sends it; numbers are range-checked by ``_item_problem``."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["status", "log", "emetric", "gpu"]
    seq: int
    time: float
    status: str | None = Field(default=None, max_length=32)
    reason: str | None = None
    exit_code: int | None = None
    error_code: str | None = Field(default=None, max_length=8)
    stream: str = "stdout"
    text: str = ""
    group: str = "train"
    iteration: int | None = None
    values: dict[str, float] = Field(default_factory=dict)
    gpus: list[dict[str, Any]] = Field(default_factory=list)


class LogItem(BaseModel):
    """A log line, the item a controller sends most: the same fields as ``ReportItem``'s,
    without the others, which makes checking it a quarter of the cost."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["log"]
    seq: int
    time: float
    stream: str = "stdout"
    text: str = ""


class CheckedLine(NamedTuple):
    """A log line as it is stored: what a checked ``LogItem`` (or a plain one) becomes."""

    seq: int
    time: float
    stream: str
    text: str


class ReportBatch(BaseModel):
    attempt: int = Field(ge=0, le=MAX_COUNT)
    # Items are checked one by one (see ``_parse_items``): a bad one is dropped, not the batch.
    items: list[dict[str, Any]] = Field(default_factory=list, max_length=MAX_BATCH_ITEMS)


@dataclass(frozen=True, slots=True)
class ReportAck:
    accepted: int
    last_seq: int
    halt: bool
    cancel: bool
    dropped: int = 0
    # For a job that takes a new batch while it runs: the batch its learners should use.
    batch: dict[str, int | None] | None = None

    def to_json(self) -> dict[str, Any]:
        answer: dict[str, Any] = {
            "accepted": self.accepted,
            "last_seq": self.last_seq,
            "halt": self.halt,
            "cancel": self.cancel,
            "dropped": self.dropped,
        }
        if self.batch is not None:
            answer["batch"] = self.batch
        return answer


class _Parsed(NamedTuple):
    seq: int
    item: ReportItem | CheckedLine | None
    problem: str | None  # why the item is dropped
    kind: str


def ingest_reports(
    platform: Platform, job_id: str, learner_index: int, token: str | None, batch: ReportBatch
) -> ReportAck:
    """Store one batch; its acknowledgement once it is committed (with the batches of other
    learners that arrived with it: ``store/group_commit.py``)."""
    if token is None or not platform.job_tokens.verify(job_id, token):
        raise AuthError("invalid job token")
    bounded_int(learner_index, "learner", 1, MAX_COUNT)
    parsed = _parse_items(batch.items)
    stored = platform.report_writes.run(
        job_id,
        lambda session: _store_batch(session, platform, job_id, learner_index, batch, parsed),
    )
    if stored.ack.dropped:
        log.warning(
            "dropped %d report items of %s learner %d", stored.ack.dropped, job_id, learner_index
        )
    if stored.status_changed:
        platform.wakeups.notify("lcm", "scheduler", "monitor", "autoscaler")
    return stored.ack


@dataclass(frozen=True, slots=True)
class _Stored:
    ack: ReportAck
    status_changed: bool


def _store_batch(
    session: Session,
    platform: Platform,
    job_id: str,
    learner_index: int,
    batch: ReportBatch,
    parsed: list[_Parsed],
) -> _Stored:
    # The job's row locked first: one job's reports are stored one batch after another
    # even across replicas, so a batch sent twice is found stored, and the numbers of its
    # log lines and metrics (and the ids of its events) grow in commit order (what
    # followers read after).
    head = _read_head(session, job_id, learner_index, batch.attempt)
    if batch.attempt != head.attempt:
        raise Gone(f"attempt {batch.attempt} of {job_id} was superseded")
    fresh = _fresh_items(parsed, head.report_seq)
    learner_done = LearnerStatus(head.learner_status) in TERMINAL_LEARNER_STATES
    if is_terminal(JobStatus(head.status)) and (fresh or not learner_done):
        raise Gone(f"{job_id} has ended ({head.status}); it takes no more reports")
    if all(entry.kind in RECORD_KINDS or entry.problem is not None for entry in fresh):
        return _store_records(session, head, job_id, learner_index, batch.attempt, fresh)
    return _store_with_statuses(session, platform, job_id, learner_index, batch.attempt, fresh)


class _Head(NamedTuple):
    """What a report needs of its job's row (locked) and its learner's, read as values."""

    status: str
    attempt: int
    desired: str | None
    manifest: dict[str, Any]
    gpus: int
    learners: int
    batch_size: int | None
    placement: list[Any] | None
    progress: dict[str, Any] | None
    last_line_number: int
    last_metric_number: int
    learner_id: int
    learner_status: str
    report_seq: int


# Built once: every report reads these two rows.
_JOB_HEAD = (
    select(
        Job.status,
        Job.attempt,
        Job.desired,
        Job.manifest,
        Job.gpus,
        Job.learners,
        Job.batch_size,
        Job.placement,
        Job.progress,
        Job.last_line_number,
        Job.last_metric_number,
    )
    .where(Job.id == bindparam("job_id"))
    .with_for_update()
)
_LEARNER_HEAD = select(Learner.id, Learner.status, Learner.report_seq).where(
    Learner.job_id == bindparam("job_id"),
    Learner.index == bindparam("index"),
    Learner.attempt == bindparam("attempt"),
)


def _read_head(session: Session, job_id: str, learner_index: int, attempt: int) -> _Head:
    connection = session.connection()
    job = connection.execute(_JOB_HEAD, {"job_id": job_id}).first()
    if job is None:
        raise NotFound(f"no job {job_id!r}")
    learner = connection.execute(
        _LEARNER_HEAD, {"job_id": job_id, "index": learner_index, "attempt": attempt}
    ).first()
    if learner is None:
        raise NotFound(f"no learner {learner_index} attempt {attempt} in {job_id}")
    return _Head._make((*job, *learner))


@dataclass(slots=True)
class _Records:
    """The rows of a batch's log lines and metrics, and a warning line for each item
    dropped, in the order they came; the metrics' progress reports beside them."""

    job_id: str
    learner: int
    attempt: int
    logs: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    reports: list[Report] = field(default_factory=list)
    dropped: int = 0

    def add(self, entry: _Parsed) -> None:
        """``entry``: a log line, a metric, or an item to drop (any kind)."""
        item = entry.item
        if item is None or entry.problem is not None:
            self.dropped += 1
            reason = entry.problem or "malformed"
            text = f"[ffdl] dropped {entry.kind} (report item {entry.seq}): {reason}"
            warning = _warning_row(self.job_id, self.learner, self.attempt, entry.seq, text)
            self.logs.append(warning)
        elif isinstance(item, CheckedLine):
            self.logs.append(_log_row(self.job_id, self.learner, self.attempt, item))
        else:
            self.metrics.append(_metric_row(self.job_id, self.learner, self.attempt, item))
            self.reports.append(Report.from_values(item.time, item.iteration, item.values))


def _store_records(
    session: Session,
    head: _Head,
    job_id: str,
    learner_index: int,
    attempt: int,
    fresh: list[_Parsed],
) -> _Stored:
    """A batch of log lines and metrics only (what learners send nearly every time): its
    rows, then one update of the job's row and one of the learner's, with no ORM object
    loaded or flushed (they were most of a small report's cost)."""
    records = _Records(job_id, learner_index, attempt)
    for entry in fresh:
        records.add(entry)
    logs, metrics = records.logs, records.metrics
    job_changes: dict[str, Any] = {}
    if logs:
        job_changes["last_line_number"] = numbered(logs, head.last_line_number)
        insert_rows(session, LOG_LINES, logs)
    if metrics:
        job_changes["last_metric_number"] = numbered(metrics, head.last_metric_number)
        insert_rows(session, METRICS, metrics)
    progress = progressed(head.progress, learner_index, attempt, records.reports)
    if progress is not None:
        job_changes["progress"] = progress
        job_changes["estimated_end_at"] = progress.get("estimated_end_at")
    connection = session.connection()
    if job_changes:
        connection.execute(update(JOBS).where(JOBS.c.id == job_id).values(**job_changes))
    report_seq = fresh[-1].seq if fresh else head.report_seq
    connection.execute(
        update(LEARNERS)
        .where(LEARNERS.c.id == head.learner_id)
        .values(report_seq=report_seq, last_heartbeat=utcnow())
    )
    ack = ReportAck(
        accepted=len(fresh),
        last_seq=report_seq,
        halt=head.desired == "halt"
        or head.status in (JobStatus.HALTING.value, JobStatus.RESCALING.value),
        # An ended job with this learner still running was refused above (``Gone``), and
        # records change no status: only a cancel asked for remains to tell.
        cancel=head.desired == "cancel",
        dropped=records.dropped,
        batch=in_place_batch(
            head.manifest, head.gpus * head.learners, head.batch_size, head.placement
        ),
    )
    return _Stored(ack, status_changed=False)


def _store_with_statuses(
    session: Session,
    platform: Platform,
    job_id: str,
    learner_index: int,
    attempt: int,
    fresh: list[_Parsed],
) -> _Stored:
    """A batch that changes a status or carries GPU samples, through the job's and the
    learner's ORM objects (the status gate and the fold into the job need them)."""
    status_changed = False
    # Read anew even when the session holds them: a batch of records stored before this
    # one in the same group changed both rows without the ORM.
    job = session.get(Job, job_id, populate_existing=True)  # locked above
    learner = session.scalars(
        select(Learner)
        .where(
            Learner.job_id == job_id,
            Learner.index == learner_index,
            Learner.attempt == attempt,
        )
        .execution_options(populate_existing=True)
    ).one()
    assert job is not None
    learner.last_heartbeat = utcnow()
    records = _Records(job_id, learner_index, attempt)
    logs, metrics = records.logs, records.metrics
    gpu_readings: list[tuple[float, list[dict[str, Any]]]] = []
    for entry in fresh:
        item = entry.item
        if entry.problem is not None or not isinstance(item, ReportItem) or item.type == "emetric":
            records.add(entry)
        elif item.type == "gpu":
            gpu_readings.append((item.time, item.gpus))
        else:
            # Keep row order: flush pending lines before a status so a follower never
            # sees COMPLETED ahead of the last lines.
            _flush(session, job, logs, metrics)
            applied, warning = _apply_status(session, learner, item)
            status_changed |= applied
            if warning is not None:
                row = _warning_row(job_id, learner_index, attempt, item.seq, warning)
                logs.append(row)
    _flush(session, job, logs, metrics)
    record_progress(job, learner_index, attempt, records.reports)
    record_gpu_samples(session, job, learner, gpu_readings, platform.settings)
    if fresh:
        learner.report_seq = fresh[-1].seq
    if status_changed:
        _aggregate(session, job)
    terminal = is_terminal(JobStatus(job.status))
    ack = ReportAck(
        accepted=len(fresh),
        last_seq=learner.report_seq,
        halt=job.desired == "halt"
        or job.status in (JobStatus.HALTING.value, JobStatus.RESCALING.value),
        cancel=job.desired == "cancel" or (terminal and not _learner_done(learner)),
        dropped=records.dropped,
        batch=in_place_batch(job.manifest, job.gpus * job.learners, job.batch_size, job.placement),
    )
    return _Stored(ack, status_changed)


def _parse_items(raw_items: list[dict[str, Any]]) -> list[_Parsed]:
    """Each item with its seq, checked; a batch whose seqs are unusable is refused whole."""
    parsed: list[_Parsed] = []
    for index, raw in enumerate(raw_items):
        seq = raw.get("seq")
        if isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq <= MAX_INT64:
            raise BadRequest(
                f"items[{index}].seq must be an integer from 1 to {MAX_INT64}",
                detail={"field": f"items[{index}].seq"},
            )
        if parsed and seq != parsed[-1].seq + 1:
            raise BadRequest(
                f"items[{index}].seq is {seq}, expected {parsed[-1].seq + 1}: the items of a "
                "batch must be numbered consecutively",
                detail={"field": f"items[{index}].seq"},
            )
        kind = raw.get("type")
        kind_text = kind if kind in ("status", "log", "emetric", "gpu") else "item"
        try:
            if kind == "log":
                line = _plain_log_line(raw, seq) or _log_line(LogItem.model_validate(raw))
                parsed.append(_Parsed(seq, line, time_problem(line.time), "log"))
                continue
            item = ReportItem.model_validate(raw)
        except ValidationError as error:
            first = error.errors(include_url=False)[0]
            where = ".".join(str(part) for part in first["loc"]) or "item"
            parsed.append(_Parsed(seq, None, f"{where}: {first['msg']}", str(kind_text)))
            continue
        parsed.append(_Parsed(seq, item, _item_problem(item), item.type))
    return parsed


def _plain_log_line(raw: dict[str, Any], seq: int) -> CheckedLine | None:
    """``raw`` as a log line when each of its fields has exactly the type ``LogItem`` asks,
    or None (then ``LogItem`` checks it and says what is wrong). Log lines are most of what
    controllers send, and this check costs a fraction of the model's."""
    when = raw.get("time")
    stream = raw.get("stream", "stdout")
    text = raw.get("text", "")
    if type(when) not in (float, int) or type(stream) is not str or type(text) is not str:
        return None
    return CheckedLine(seq, cast(float, when), stream, text)


def _log_line(item: LogItem) -> CheckedLine:
    return CheckedLine(item.seq, item.time, item.stream, item.text)


def _fresh_items(parsed: list[_Parsed], report_seq: int) -> list[_Parsed]:
    """The items not applied yet; refuses a batch that does not continue the stream."""
    if not parsed or parsed[-1].seq <= report_seq:
        return []
    expected = report_seq + 1
    if parsed[0].seq > expected:
        raise ConflictError(
            f"report items must continue from seq {expected}, got {parsed[0].seq}",
            detail={"expected_seq": expected, "got": parsed[0].seq},
        )
    return parsed[expected - parsed[0].seq :]


def _item_problem(item: ReportItem) -> str | None:
    """Why ``item`` cannot be stored as it is, or None. Statuses carry no stored numbers
    but their exit code; their time is not stored, so it is not checked."""
    if item.type == "status":
        if item.exit_code is not None and not -(2**31) <= item.exit_code <= 2**31 - 1:
            return "exit code out of range"
        return None
    if (problem := time_problem(item.time)) is not None:
        return problem
    if item.type == "gpu":
        return gpu_item_problem(item.gpus)
    if (problem := iteration_problem(item.iteration)) is not None:
        return problem
    if not item.values:
        return "no values"
    if len(item.values) > MAX_METRIC_VALUES:
        return f"more than {MAX_METRIC_VALUES} values"
    for name, value in item.values.items():
        if len(name) > MAX_METRIC_NAME:
            return f"a value name is longer than {MAX_METRIC_NAME} characters"
        if (problem := metric_value_problem(name, value)) is not None:
            return problem
    return None


def _learner_done(learner: Learner) -> bool:
    return LearnerStatus(learner.status) in TERMINAL_LEARNER_STATES


def _aggregate(session: Session, job: Job) -> None:
    """Fold the learners into the job; a fold the job's state machine forbids (possible
    only with out-of-order or forged reports) leaves the job to the monitor, and the
    learner's own report still counts. The savepoint follows the learner's flushed update,
    so pysqlite has begun the transaction it lives in."""
    learners = current_learners(session, job)
    try:
        with session.begin_nested():
            aggregate_job(session, job, learners)
    except IllegalTransition as exc:
        log.warning("reports of %s: job status not updated: %s", job.id, exc)


def _flush(
    session: Session, job: Job, logs: list[dict[str, Any]], metrics: list[dict[str, Any]]
) -> None:
    if not logs and not metrics:
        return
    # The rows go in on the driver's own statements, now: building them row by row through
    # the ORM or the statement compiler was most of a report's cost on the server. The
    # job's new numbers and the learner's changes stay pending, flushed once at the end.
    if logs:
        number_lines(job, logs)
        insert_rows(session, LOG_LINES, logs)
        logs.clear()
    if metrics:
        number_metrics(job, metrics)
        insert_rows(session, METRICS, metrics)
        metrics.clear()


def _warning_row(job_id: str, learner: int, attempt: int, seq: int, text: str) -> dict[str, Any]:
    # The dropped item's own seq: it keeps its place in the stream and stays unique.
    return {
        "job_id": job_id,
        "learner": learner,
        "attempt": attempt,
        "seq": seq,
        "stream": "ffdl",
        "text": text,
        "time": time.time(),
    }


def _log_row(job_id: str, learner: int, attempt: int, item: CheckedLine) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "learner": learner,
        "attempt": attempt,
        "seq": item.seq,
        "stream": item.stream[:8],
        "text": item.text[:MAX_LOG_TEXT],
        "time": item.time,
    }


def _metric_row(job_id: str, learner: int, attempt: int, item: ReportItem) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "learner": learner,
        "attempt": attempt,
        "seq": item.seq,
        "group": item.group[:MAX_GROUP_NAME],
        "iteration": item.iteration,
        "values": item.values,
        "time": item.time,
    }


def _apply_status(session: Session, learner: Learner, item: ReportItem) -> tuple[bool, str | None]:
    """Apply a reported status; (whether it changed, a warning line when it was ignored)."""
    try:
        target = LearnerStatus(item.status or "")
    except ValueError:
        return False, f"[ffdl] ignored unknown status {str(item.status)[:32]!r}"
    current = LearnerStatus(learner.status)
    if target == current:
        return False, None
    if current in TERMINAL_LEARNER_STATES:
        # A late report about a learner we already finalised (e.g. killed): keep ours.
        return False, None
    if target not in REPORTABLE_STATUSES or not learner_transition_allowed(current, target):
        return False, f"[ffdl] ignored status {target.value}: not allowed after {current.value}"
    event = set_learner_status(
        session,
        learner,
        target,
        (item.reason or "")[:MAX_REASON_TEXT],
        exit_code=item.exit_code,
        error_code=item.error_code,
    )
    return event is not None, None
