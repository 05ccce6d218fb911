"""Schema migrations on real databases (a SQLite file and the session's PostgreSQL): the
models agree with the head revision, a store made at the first revision keeps every row up
to head, databases from before migrations are adopted, newer ones are refused untouched,
and replicas starting together upgrade once."""

from __future__ import annotations

import threading
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import MetaData, Table, insert, inspect, select, text

from ffdl.server.settings import Settings
from ffdl.server.store.db import DatabaseDriverMissing, DatabaseUnreachable, Store
from ffdl.server.store.models import Base, Job, Lease, Metric, Replica
from ffdl.server.store.schema import (
    INITIAL_REVISION,
    INITIAL_TABLES,
    SchemaTooNew,
    SchemaUnadoptable,
    current_revision,
    head_revision,
    initial_schema,
    state,
    upgrade,
)
from tests.postgres import free_port
from tests.server.factories import database_url, on_both_databases

# Every revision after the first, in order: what a store made at the first one still needs.
LATER_REVISIONS = ["0002", "0003", "0004", "0005", "0006", "0007", "0008", "0009", "0010"]
ALL_REVISIONS = [INITIAL_REVISION, *LATER_REVISIONS]

AT = datetime(2024, 5, 6, 7, 8, 9, 123456)  # naive UTC, with microseconds
MANIFEST = {"name": "mnist", "learners": 2, "framework": {"name": "custom", "command": "x"}}

INTERLEAVED_LINES = [
    (1, "training-one"),
    (1, "training-two"),
    (2, "training-one"),
    (2, "training-two"),
    (3, "training-one"),
]
# One or more rows for every table of the first revision, as plain column values (the
# tables are read from the database, so this keeps working when the models move on).
FIRST_REVISION_ROWS: dict[str, list[dict[str, Any]]] = {
    "tenants": [
        {"id": "t1", "name": "Team one", "max_gpus": 8, "created_at": AT},
        {"id": "t2", "name": "Team two", "created_at": AT},
    ],
    "users": [
        {"id": "t1.ada", "tenant_id": "t1", "name": "ada", "role": "admin", "created_at": AT},
        {
            "id": "t2.bob",
            "tenant_id": "t2",
            "name": "bob",
            "role": "member",
            "created_at": AT,
            "password_hash": "$argon2id$v=19$m=65536,t=3,p=4$abc$def",
        },
    ],
    "api_tokens": [
        {
            "token_hash": "a" * 64,
            "user_id": "t1.ada",
            "created_at": AT,
            "id": "tok1",
            "name": "ci",
            "expires_at": AT,
            "last_used_at": AT,
        },
    ],
    "audit_events": [
        {
            "actor_user_id": "t1.ada",
            "actor_tenant_id": "t1",
            "action": "token.create",
            "target": "tok1",
            "tenant_id": "t1",
            "detail": "",
            "created_at": AT,
        },
    ],
    "jobs": [
        {
            "id": "training-one",
            "tenant_id": "t1",
            "user_id": "t1.ada",
            "name": "mnist",
            "description": "",
            "manifest": MANIFEST,
            "status": "PROCESSING",
            "reason": "training",
            "priority": 50,
            "learners": 2,
            "gpus": 1,
            "cpus": 1.5,
            "memory_mb": 512,
            "gpu_type": "a100",
            "placement": [{"node": "a", "gpus": [0]}],
            "attempt": 1,
            "elastic": True,
            "rescale_target": {"gpus": 4},
            "restarts": 0,
            "submitted_at": AT,
            "started_at": AT,
            "status_changed_at": AT,
            "idempotency_key": "k1",
        },
        {
            "id": "training-two",
            "tenant_id": "t2",
            "user_id": "t2.bob",
            "name": "other",
            "description": "d",
            "manifest": {"name": "other"},
            "status": "QUEUED",
            "reason": "",
            "priority": 10,
            "learners": 1,
            "gpus": 0,
            "cpus": 1.0,
            "memory_mb": 256,
            "attempt": 0,
            "elastic": False,
            "submitted_at": AT,
            "status_changed_at": AT,
        },
    ],
    "deploy_steps": [{"job_id": "training-one", "attempt": 1, "step": "staged", "done_at": AT}],
    "events": [
        {
            "job_id": "training-one",
            "from_status": None,
            "to_status": "QUEUED",
            "reason": "",
            "created_at": AT,
        },
        {
            "job_id": "training-one",
            "learner": 1,
            "from_status": "PENDING",
            "to_status": "PROCESSING",
            "reason": "up",
            "created_at": AT,
        },
    ],
    "learners": [
        {
            "job_id": "training-one",
            "index": i,
            "attempt": 1,
            "status": "PROCESSING",
            "node": "a",
            "gpu_ids": [i - 1],
            "handle": {"pid": 100 + i},
            "reason": "",
            "report_seq": 7,
            "last_heartbeat": AT,
            "updated_at": AT,
        }
        for i in (1, 2)
    ],
    "node_states": [{"name": "a", "drained": True, "reason": "maintenance", "changed_at": AT}],
    # Two jobs' lines interleaved, as concurrent jobs store them.
    "log_lines": [
        {
            "job_id": job,
            "learner": 1,
            "attempt": 1,
            "seq": i,
            "stream": "stdout",
            "text": f"line {i} ✓",
            "time": 1715000000.25 + i,
        }
        for i, job in INTERLEAVED_LINES
    ],
    "metrics": [
        {
            "job_id": "training-one",
            "learner": 1,
            "attempt": 1,
            "seq": i,
            "group": "train",
            "iteration": i,
            "values": {"loss": 1.0 / i, "acc": 0.5},
            "time": 1715000000.5,
        }
        for i in range(1, 3)
    ],
    "webhook_endpoints": [
        {
            "job_id": "training-one",
            "event_type": "status",
            "endpoint_id": "e1",
            "url": "https://example.invalid/hook",
            "secret_sealed": "sealed",
            "cursor": 1,
            "attempts": 0,
            "delivered": 1,
            "given_up": 0,
            "created_at": AT,
            "updated_at": AT,
        },
    ],
}


def _tables(store: Store, names: tuple[str, ...] | list[str]) -> dict[str, Table]:
    metadata = MetaData()
    with store.engine.connect() as conn:
        return {name: Table(name, metadata, autoload_with=conn) for name in names}


def _fill(store: Store) -> None:
    tables = _tables(store, INITIAL_TABLES)
    with store.engine.begin() as conn:
        for name in INITIAL_TABLES:
            for row in FIRST_REVISION_ROWS[name]:
                conn.execute(insert(tables[name]).values(row))


def _rows(
    store: Store, names: tuple[str, ...] | list[str] = INITIAL_TABLES
) -> dict[str, list[dict[str, Any]]]:
    """Every row of these tables, in a stable order."""
    tables = _tables(store, names)
    with store.engine.connect() as conn:
        return {
            name: [
                dict(row)
                for row in conn.execute(
                    select(table).order_by(*table.primary_key.columns)
                ).mappings()
            ]
            for name, table in tables.items()
        }


def _as_before(
    after: dict[str, list[dict[str, Any]]], before: dict[str, list[dict[str, Any]]]
) -> dict[str, list[dict[str, Any]]]:
    """``after`` without the columns later revisions added, which must all be empty but
    the numbers of each job's log lines and metrics (revision 0005), the archive marks
    (0006) and the GPU types (0007), checked here."""
    _check_numbers(after)
    kept: dict[str, list[dict[str, Any]]] = {}
    for name, rows in after.items():
        columns = set(before[name][0])
        for row in rows:
            added = {column: value for column, value in row.items() if column not in columns}
            assert all(value is None for value in added.values()), (name, added)
        kept[name] = [{key: row[key] for key in row if key in columns} for row in rows]
    return kept


def _check_numbers(after: dict[str, list[dict[str, Any]]]) -> None:
    """Each job's records numbered 1, 2, 3, ... in the order stored (their ids), and each
    job's counters at its last number; the columns are then dropped from ``after``."""
    last: dict[tuple[str, str], int] = {}
    for table, counter in (("log_lines", "last_line_number"), ("metrics", "last_metric_number")):
        numbers: dict[str, list[int]] = {}
        for row in sorted(after.get(table, []), key=lambda row: row["id"]):
            numbers.setdefault(row["job_id"], []).append(row.pop("number"))
        for job, given in numbers.items():
            assert given == list(range(1, len(given) + 1)), (table, job, given)
            last[(job, counter)] = len(given)
        for job_row in after.get("jobs", []):
            assert job_row.pop(counter) == last.get((job_row["id"], counter), 0)
    # Nothing is archived yet (revision 0006).
    for job_row in after.get("jobs", []):
        assert job_row.pop("archived_line_number") == job_row.pop("archived_metric_number") == 0
    # A job that named one GPU type accepts that one, and no gang spans types (0007).
    for job_row in after.get("jobs", []):
        kind = job_row["gpu_type"]
        assert job_row.pop("gpu_types") == (None if kind is None else [kind])
        assert job_row.pop("mix_gpu_types") in (False, 0)


def _differences(store: Store) -> list[Any]:
    with store.engine.connect() as conn:
        return list(compare_metadata(MigrationContext.configure(conn), Base.metadata))


def _shape(store: Store) -> dict[str, dict[str, Any]]:
    """Every table as the database describes it, column order aside: columns (type,
    nullability, server default), primary key, indexes, unique and foreign keys, checks."""
    inspector = inspect(store.engine)
    shape: dict[str, dict[str, Any]] = {}
    for table in inspector.get_table_names():
        columns = {
            column["name"]: (str(column["type"]), column["nullable"], column.get("default"))
            for column in inspector.get_columns(table)
        }
        shape[table] = {
            "columns": columns,
            "primary key": inspector.get_pk_constraint(table)["constrained_columns"],
            "indexes": sorted(
                (index["name"], tuple(index["column_names"]), bool(index["unique"]))
                for index in inspector.get_indexes(table)
            ),
            "unique": sorted(
                (unique["name"], tuple(unique["column_names"]))
                for unique in inspector.get_unique_constraints(table)
            ),
            "foreign keys": sorted(
                (
                    tuple(key["constrained_columns"]),
                    key["referred_table"],
                    tuple(key["referred_columns"]),
                    repr(sorted(key.get("options", {}).items())),
                )
                for key in inspector.get_foreign_keys(table)
            ),
            "checks": sorted(
                str(check["sqltext"]) for check in inspector.get_check_constraints(table)
            ),
        }
    return shape


def _column_order(store: Store) -> dict[str, list[str]]:
    inspector = inspect(store.engine)
    return {
        table: [column["name"] for column in inspector.get_columns(table)]
        for table in Base.metadata.tables
    }


@on_both_databases
def test_the_models_and_the_head_migration_agree(tmp_path: Path, database: str) -> None:
    """A model changed without a migration (or the reverse) fails here."""
    store = Store(database_url(tmp_path, database))
    try:
        assert upgrade(store, empty_from_models=False) == ALL_REVISIONS
        assert _differences(store) == []
        # The comparison sees a change: a column the migrations never made.
        with store.engine.begin() as conn:
            conn.execute(text("ALTER TABLE jobs ADD COLUMN stray INTEGER"))
        assert [diff[0] for diff in _differences(store)] == ["remove_column"]
    finally:
        store.dispose()


@on_both_databases
def test_an_empty_database_is_made_from_the_models_as_the_migrations_would_make_it(
    tmp_path: Path, database: str
) -> None:
    for name in ("migrated", "made"):
        (tmp_path / name).mkdir()
    migrated = Store(database_url(tmp_path / "migrated", database))
    made = Store(database_url(tmp_path / "made", database))
    try:
        assert upgrade(migrated, empty_from_models=False) == ALL_REVISIONS
        assert upgrade(made) == ALL_REVISIONS
        assert current_revision(made) == head_revision()
        assert _shape(made) == _shape(migrated)
        # Made in one step, from the models: each table's columns in the models' order.
        # Migrated, the columns later revisions add come last.
        models = {
            name: [c.name for c in table.columns] for name, table in Base.metadata.tables.items()
        }
        assert _column_order(made) == models
        assert _column_order(migrated) != models
        assert upgrade(made) == []
        # The comparison sees a default the models lack.
        with made.engine.begin() as conn:
            conn.execute(text("ALTER TABLE jobs ADD COLUMN stray INTEGER DEFAULT 7"))
        assert _shape(made)["jobs"]["columns"]["stray"][2] is not None
        assert _shape(made) != _shape(migrated)
    finally:
        migrated.dispose()
        made.dispose()


@on_both_databases
def test_a_store_made_at_the_first_revision_keeps_every_row_up_to_head(
    tmp_path: Path, database: str
) -> None:
    store = Store(database_url(tmp_path, database))
    try:
        assert upgrade(store, INITIAL_REVISION) == [INITIAL_REVISION]
        assert set(inspect(store.engine).get_table_names()) == {*INITIAL_TABLES, "alembic_version"}
        _fill(store)
        before = _rows(store)
        assert {name: len(rows) for name, rows in before.items()} == {
            name: len(rows) for name, rows in FIRST_REVISION_ROWS.items()
        }

        assert upgrade(store) == LATER_REVISIONS
        assert current_revision(store) == head_revision()
        assert _as_before(_rows(store), before) == before

        # The values come back as written: JSON as JSON, naive UTC times to the microsecond.
        with store.read() as session:
            job = session.get(Job, "training-one")
            assert job is not None
            assert job.manifest == MANIFEST and job.rescale_target == {"gpus": 4}
            assert job.placement == [{"node": "a", "gpus": [0]}] and job.elastic is True
            assert job.submitted_at == AT and job.submitted_at.tzinfo is None
            metric = session.scalars(select(Metric).order_by(Metric.seq)).first()
            assert metric is not None and metric.values == {"loss": 1.0, "acc": 0.5}
        # The new tables work.
        with store.write() as session:
            session.add(Lease(name="scheduler", holder="r1", token=1, expires_at=AT))
            session.add(
                Replica(
                    id="r1",
                    url="http://127.0.0.1:1",
                    host="h",
                    pid=1,
                    version="0.1.0",
                    started_at=AT,
                    seen_at=AT,
                )
            )
        with store.read() as session:
            lease = session.get(Lease, "scheduler")
            assert lease is not None and lease.token == 1 and lease.expires_at == AT
            assert session.get(Replica, "r1") is not None
        assert upgrade(store) == []
    finally:
        store.dispose()


def test_a_database_from_before_migrations_is_adopted_with_nothing_lost(
    tmp_path: Path,
) -> None:
    """As ``create_all`` made it: here a release that lacked ``jobs.runtime`` and the
    ``webhook_endpoints`` table."""
    older = [name for name in INITIAL_TABLES if name != "webhook_endpoints"]
    store = Store(f"sqlite:///{tmp_path / 'ffdl.db'}")
    try:
        initial = initial_schema()
        initial.create_all(store.engine, tables=[initial.tables[name] for name in older])
        with store.engine.begin() as conn:
            conn.execute(text("ALTER TABLE jobs DROP COLUMN runtime"))
        tables = _tables(store, older)
        with store.engine.begin() as conn:
            for name in older:
                for row in FIRST_REVISION_ROWS[name]:
                    conn.execute(insert(tables[name]).values(row))
        before = _rows(store, older)
        assert all(before.values())
        schema = state(store)
        assert schema.unversioned and schema.current is None and schema.pending == LATER_REVISIONS

        assert upgrade(store) == LATER_REVISIONS

        assert current_revision(store) == head_revision()
        assert _differences(store) == []
        after = _rows(store, older)
        for row in after["jobs"]:
            assert row.pop("runtime") is None
        assert _as_before(after, before) == before
        assert upgrade(store) == []
    finally:
        store.dispose()


def test_an_unversioned_database_with_later_tables_is_refused(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'ffdl.db'}")
    try:
        Base.metadata.create_all(store.engine)
        with pytest.raises(SchemaUnadoptable, match="leases, record_chunks, replicas"):
            upgrade(store)
        assert current_revision(store) is None
    finally:
        store.dispose()


@on_both_databases
def test_a_newer_schema_is_refused_and_left_unchanged(tmp_path: Path, database: str) -> None:
    store = Store(database_url(tmp_path, database))
    try:
        upgrade(store, INITIAL_REVISION)
        _fill(store)
        with store.engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = '0999'"))
        before = _rows(store)
        tables = set(inspect(store.engine).get_table_names())

        with pytest.raises(SchemaTooNew) as refused:
            upgrade(store)
        assert str(refused.value).startswith("the database's schema (")
        expected = f"is at revision 0999, newer than this ffdl knows (head {head_revision()})"
        assert f"{expected}: upgrade ffdl" in str(refused.value)
        assert current_revision(store) == "0999"
        assert set(inspect(store.engine).get_table_names()) == tables
        assert _rows(store) == before
        schema = state(store)
        assert not schema.known and schema.pending == []

        # What `ffdl up` does first: it refuses the same way, before touching anything.
        from ffdl.server.app import build_platform

        settings = Settings(home=tmp_path / "home", database_url=store.url)
        with pytest.raises(SchemaTooNew, match="revision 0999"):
            build_platform(settings)
        assert current_revision(store) == "0999"
    finally:
        store.dispose()


@on_both_databases
def test_replicas_starting_together_upgrade_once(tmp_path: Path, database: str) -> None:
    url = database_url(tmp_path, database)
    stores = [Store(url) for _ in range(4)]
    results: list[list[str]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(len(stores))

    def run(store: Store) -> None:
        start.wait()
        try:
            results.append(upgrade(store))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(store,), daemon=True) for store in stores]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not [thread for thread in threads if thread.is_alive()], "an upgrade hung"
        assert errors == []
        assert sorted(results) == [[], [], [], ALL_REVISIONS]
        assert current_revision(stores[0]) == head_revision()
    finally:
        for store in stores:
            store.dispose()


def test_an_unreachable_server_is_named_without_the_password() -> None:
    port = free_port()
    store = Store(f"postgresql+psycopg://ffdl:s3cret-pw@127.0.0.1:{port}/ffdl")
    try:
        with pytest.raises(DatabaseUnreachable) as unreachable:
            upgrade(store)
        message = str(unreachable.value)
        assert message.startswith(f"database unreachable at 127.0.0.1:{port}: ")
        assert "s3cret-pw" not in message
    finally:
        store.dispose()


def test_a_postgresql_url_without_psycopg_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(__import__("sys").modules, "psycopg", None)
    with pytest.raises(DatabaseDriverMissing) as missing:
        Store("postgresql+psycopg://ffdl:s3cret-pw@db.example:5432/ffdl")
    message = str(missing.value)
    assert "pip install 'ffdl[postgres]'" in message and "s3cret-pw" not in message
    assert "postgresql+psycopg://ffdl:***@db.example:5432/ffdl" in message


def test_an_unsupported_url_is_refused() -> None:
    with pytest.raises(ValueError, match="unsupported database URL mysql://u:\\*\\*\\*@h/d"):
        Store("mysql://u:pw@h/d")
