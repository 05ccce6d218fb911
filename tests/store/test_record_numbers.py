"""Each job numbers its own log lines and metrics 1, 2, 3, ... (FfDL's ``rindex``), on a
real SQLite file and a real PostgreSQL database: two platforms on one database, as two
replicas, store the reports of two jobs' learners at once, each batch through either, and
every view of a job (pages, ``pos``, ``since_time``, a follower's cursor) agrees."""

from __future__ import annotations

import threading
from pathlib import Path

from ffdl.server.app import build_platform
from ffdl.server.platform import Platform
from ffdl.server.services import logs
from ffdl.server.services.follow import Cursor, Wanted, poll
from ffdl.server.services.reports import ReportBatch, ingest_reports
from ffdl.server.settings import Settings
from ffdl.server.store.db import Store
from ffdl.server.store.models import Job, Learner, LogLine
from ffdl.server.store.transitions import utcnow
from tests.integration.live import wait_for
from tests.server.factories import database_url, make_job, on_both_databases, start_learner

BATCHES = 12
PER_BATCH = 5
# (job, learner) pairs reporting at once: job "a" has two learners.
WRITERS = (("training-a", 1), ("training-a", 2), ("training-b", 1))


def _add_second_learner(store: Store, job_id: str) -> None:
    with store.write() as session:
        session.add(
            Learner(
                job_id=job_id,
                index=2,
                attempt=1,
                status="PROCESSING",
                node="node-a",
                gpu_ids=[],
                updated_at=utcnow(),
            )
        )


def _items(learner: int, batch: int) -> list[dict[str, object]]:
    items: list[dict[str, object]] = []
    for n in range(PER_BATCH):
        seq = batch * (PER_BATCH + 1) + n + 1
        text = f"learner {learner} line {batch * PER_BATCH + n}"
        items.append({"type": "log", "seq": seq, "time": 1e9 + seq, "text": text})
    seq = batch * (PER_BATCH + 1) + PER_BATCH + 1
    values = {"step": float(batch)}
    items.append({"type": "emetric", "seq": seq, "time": 1e9 + seq, "values": values})
    return items


@on_both_databases
def test_two_replicas_storing_interleaved_reports_number_each_job_from_one(
    tmp_path: Path, database: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    settings = Settings(home=home, sandbox=False, database_url=database_url(home, database))
    replicas: list[Platform] = [build_platform(settings), build_platform(settings)]
    try:
        store = replicas[0].store
        for job_id in ("training-a", "training-b"):
            make_job(store, job_id, tenant_id="default", user_id="admin")
            start_learner(store, job_id)
        _add_second_learner(store, "training-a")
        errors: list[BaseException] = []

        def report(job_id: str, learner: int) -> None:
            token = replicas[0].job_tokens.issue(job_id)
            try:
                for batch in range(BATCHES):
                    # Each batch through the other replica than the one before.
                    platform = replicas[(batch + learner) % 2]
                    items = _items(learner, batch)
                    ack = ingest_reports(
                        platform, job_id, learner, token, ReportBatch(attempt=1, items=items)
                    )
                    assert ack.accepted == len(items)
            except BaseException as exc:  # the test reports it below
                errors.append(exc)

        threads = [threading.Thread(target=report, args=writer) for writer in WRITERS]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert errors == []

        with store.read() as session:
            ids = {
                job_id: [
                    row.id
                    for row in session.query(LogLine)
                    .filter(LogLine.job_id == job_id)
                    .order_by(LogLine.id)
                ]
                for job_id in ("training-a", "training-b")
            }
        # The two jobs' rows did interleave: their row ids alone would have had gaps.
        assert ids["training-a"] != list(range(ids["training-a"][0], ids["training-a"][-1] + 1))

        parts = (store, replicas[0].archive)
        for job_id, learners in (("training-a", 2), ("training-b", 1)):
            lines = BATCHES * PER_BATCH * learners
            metrics = BATCHES * learners
            with store.read() as session:
                job = session.get(Job, job_id)
                assert job is not None
                assert (job.last_line_number, job.last_metric_number) == (lines, metrics)
                every = logs.loglines(*parts, job, since_time=None, pagesize=10_000, pos=None)
                numbers = [item["meta"]["rindex"] for item in every]
                assert numbers == list(range(1, lines + 1))
                # Each learner's lines in the order it sent them.
                for index in range(1, learners + 1):
                    mine = [i["line"] for i in every if i["line"].startswith(f"learner {index} ")]
                    expected = BATCHES * PER_BATCH
                    assert mine == [f"learner {index} line {n}" for n in range(expected)]
                page = logs.loglines(*parts, job, since_time=None, pagesize=7, pos=20)
                assert [item["meta"]["rindex"] for item in page] == list(range(21, 28))
                back = logs.loglines(*parts, job, since_time="-4", pagesize=10, pos=None)
                assert [item["meta"]["rindex"] for item in back] == numbers[-4:]
                tail = logs.loglines(*parts, job, since_time=None, pagesize=3, pos=-2)
                assert [item["meta"]["rindex"] for item in tail] == numbers[-4:-1]
                emetrics = logs.emetrics(*parts, job, since_time=None, pagesize=10_000, pos=None)
                assert [m["meta"]["rindex"] for m in emetrics] == list(range(1, metrics + 1))
                start = logs.first_row_at(*parts, LogLine, job_id, logs.Since(back=10))
            # A follower from "the last 10" reads exactly those, by number.
            cursor = Cursor(line=start)
            batch = poll(replicas[1], job_id, cursor, Wanted(metrics=False, events=False))
            assert [line.number for line in batch.lines] == numbers[-10:]
            assert cursor.line == lines
    finally:
        for platform in replicas:
            platform.close()


@on_both_databases
def test_records_and_statuses_of_one_job_stored_in_one_group_number_every_line_once(
    tmp_path: Path, database: str
) -> None:
    """A batch of records only is stored without the ORM; a batch with a status through
    the job's ORM object. In one group (one session), the second status batch must not
    number its lines from the job's row as the first one left it."""
    home = tmp_path / "home"
    home.mkdir()
    settings = Settings(home=home, sandbox=False, database_url=database_url(home, database))
    platform = build_platform(settings)
    try:
        store = platform.store
        make_job(store, "training-a", tenant_id="default", user_id="admin")
        start_learner(store, "training-a")
        _add_second_learner(store, "training-a")
        token = platform.job_tokens.issue("training-a")
        held, release = threading.Event(), threading.Event()

        def hold(_session: object) -> None:  # leads a group and keeps it open
            held.set()
            release.wait(timeout=60)

        def line(seq: int, text: str) -> dict[str, object]:
            return {"type": "log", "seq": seq, "time": 1e9 + seq, "text": text}

        status = {"type": "status", "seq": 1, "time": 1e9, "status": "PROCESSING"}
        batches = [
            (1, [status, line(2, "a1"), line(3, "a2")]),  # through the ORM
            (2, [line(1, "b1"), line(2, "b2")]),  # records only
            (1, [{**status, "seq": 4}, line(5, "a3")]),  # through the ORM again
        ]
        acks: list[object] = []
        errors: list[BaseException] = []

        def send(learner: int, items: list[dict[str, object]]) -> None:
            try:
                batch = ReportBatch(attempt=1, items=items)
                acks.append(ingest_reports(platform, "training-a", learner, token, batch))
            except BaseException as exc:  # the test reports it below
                errors.append(exc)

        holder = threading.Thread(target=platform.report_writes.run, args=("a-holder", hold))
        holder.start()
        assert held.wait(timeout=30)
        senders: list[threading.Thread] = []

        def all_queued() -> bool:  # each batch in line before the next is sent: in order
            return platform.report_writes.waiting() == len(senders)

        for learner, items in batches:
            sender = threading.Thread(target=send, args=(learner, items))
            sender.start()
            senders.append(sender)
            wait_for(all_queued)
        commits = platform.report_writes.commits
        release.set()
        for thread in [holder, *senders]:
            thread.join(timeout=60)
        assert errors == []
        assert len(acks) == 3
        # The three batches went in one transaction, after the holder's.
        assert platform.report_writes.commits == commits + 2

        with store.read() as session:
            rows = session.query(LogLine).filter(LogLine.job_id == "training-a")
            numbered = sorted((row.number, row.text) for row in rows)
            job = session.get(Job, "training-a")
            assert job is not None and job.last_line_number == 5
        assert numbered == [(1, "a1"), (2, "a2"), (3, "b1"), (4, "b2"), (5, "a3")]
    finally:
        platform.close()
