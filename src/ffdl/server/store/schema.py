"""The store's schema: Alembic migrations, applied at start and by ``ffdl db upgrade``.

The migrations live in ``migrations/versions`` (shipped with the package) and run through
Alembic's API on a connection this module opens; there is no ``alembic.ini``. Every change
to ``models.py`` needs a migration: a test compares the models with the head revision.

``upgrade(store)`` brings any database this ffdl can use to the head revision:

- an empty database is created from the models and stamped at head: one step instead of
  every migration in turn (a third of a second on SQLite, where each table a migration
  alters is copied). A test holds the two ways to the same schema, defaults and indexes
  included;
- a database made before migrations existed (ffdl's tables, no ``alembic_version``) is
  first brought to revision 0001's shape as the old code did it (missing tables created,
  missing nullable columns and indexes added), stamped 0001, then upgraded;
- a database at a revision this ffdl does not know (a newer ffdl migrated it) is refused
  with ``SchemaTooNew`` and left unchanged: an older ffdl must not write to a schema it does
  not understand.

The whole upgrade is one transaction holding an exclusive lock, so replicas starting
together upgrade once and the others find the work done: a PostgreSQL advisory lock (held
on the connection that migrates, whose DDL is transactional), or on SQLite the file's
write lock (``BEGIN IMMEDIATE``), with foreign-key enforcement off for the migration's
length because a migration that alters a table on SQLite recreates it (a ``DROP TABLE``
with enforcement on would cascade into the rows that reference it), and a foreign-key
check before it commits.

Adopting a database without a revision uses the current models for revision 0001's tables:
exact while no later migration changes those tables. A migration that does must give the
adoption step the 0001 shape of what it changes (the legacy-upgrade test fails until then).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

# Alembic narrates every step at INFO (even its import: "setup plugin ..."); ffdl logs
# what it applied itself. Set before importing Alembic; an operator's own level stays.
if logging.getLogger("alembic").level == logging.NOTSET:
    logging.getLogger("alembic").setLevel(logging.WARNING)

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, MetaData, Table, create_engine, inspect, text

from ffdl.server.store.db import IMMEDIATE, Store, StoreUnavailable
from ffdl.server.store.models import Base

log = logging.getLogger("ffdl.store")

MIGRATIONS = Path(__file__).with_name("migrations")
INITIAL_REVISION = "0001"
# The tables of revision 0001: all that a database made before migrations can hold.
INITIAL_TABLES = (
    "tenants",
    "users",
    "api_tokens",
    "audit_events",
    "jobs",
    "deploy_steps",
    "events",
    "learners",
    "node_states",
    "log_lines",
    "metrics",
    "webhook_endpoints",
)
# pg_advisory_lock's key for schema upgrades: any fixed 64-bit number ffdl alone uses.
UPGRADE_LOCK_KEY = 0x0FFD1_5C4E3A


class SchemaTooNew(StoreUnavailable):
    """The database's schema is at a revision this ffdl does not know: a newer ffdl made it."""


class SchemaUnadoptable(StoreUnavailable):
    """A database without a revision that cannot be brought to revision 0001 safely."""


@dataclass(frozen=True)
class SchemaState:
    """Where a database's schema stands against this ffdl's migrations."""

    current: str | None
    head: str
    # Revisions ``upgrade`` would apply, oldest first (empty when at head or too new).
    pending: list[str] = field(default_factory=list)
    known: bool = True  # False: ``current`` is newer than this ffdl
    unversioned: bool = False  # ffdl's tables without a revision (made before migrations)


def alembic_config(connection: Connection | None = None) -> Config:
    """Alembic's configuration for ffdl's migrations, built in code.

    ``connection``: what ``migrations/env.py`` migrates (required to run migrations).
    """
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("path_separator", "os")
    if connection is not None:
        config.attributes["connection"] = connection
    config.attributes["applied"] = []
    return config


@functools.cache
def script_directory() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    head = script_directory().get_current_head()
    if head is None:  # pragma: no cover - the package ships its migrations
        raise RuntimeError(f"no migrations found in {MIGRATIONS}")
    return head


def known_revisions() -> set[str]:
    return {script.revision for script in script_directory().walk_revisions()}


def current_revision(store: Store) -> str | None:
    """The database's revision; None for an empty database or one made before migrations."""
    store.check_reachable()
    with store.engine.connect() as conn:
        return _current(conn)


def state(store: Store) -> SchemaState:
    """Where ``store``'s schema stands (for ``ffdl db status``)."""
    store.check_reachable()
    head = head_revision()
    with store.engine.connect() as conn:
        current = _current(conn)
        unversioned = current is None and bool(_present(conn, INITIAL_TABLES))
    if current is not None and current not in known_revisions():
        return SchemaState(current=current, head=head, known=False)
    pending = _between(INITIAL_REVISION if unversioned else current, head)
    return SchemaState(current=current, head=head, pending=pending, unversioned=unversioned)


def upgrade(store: Store, to: str = "head", *, empty_from_models: bool = True) -> list[str]:
    """Bring ``store``'s schema to revision ``to``; the revisions applied, oldest first.

    An empty database brought to head is created from the models in one step and stamped
    at head (``empty_from_models``; False runs every migration instead, as a test that
    holds the two ways to the same schema does).

    Raises ``DatabaseUnreachable``, ``SchemaTooNew`` (nothing changed) or
    ``SchemaUnadoptable``; any failure of a migration rolls the whole upgrade back.
    """
    store.check_reachable()
    with _exclusive(store) as conn:
        current = _current(conn)
        if current is not None and current not in known_revisions():
            raise SchemaTooNew(too_new_message(store, current))
        empty = current is None and not _present(conn, Base.metadata.tables)
        if empty and empty_from_models and to == "head":
            Base.metadata.create_all(conn)
            MigrationContext.configure(conn).stamp(script_directory(), "head")
            conn.commit()
            return _between(None, head_revision())
        if current is None and _present(conn, INITIAL_TABLES):
            added = _adopt(conn)
            log.info(
                "database %s had no schema revision (made before migrations): "
                "brought to revision %s%s",
                store.address,
                INITIAL_REVISION,
                f", adding {', '.join(added)}" if added else "",
            )
        config = alembic_config(conn)
        command.upgrade(config, to)
        applied: list[str] = list(config.attributes["applied"])
        if applied and store.dialect == "sqlite":
            _check_foreign_keys(conn)
        conn.commit()
    return applied


def too_new_message(store: Store, current: str) -> str:
    return (
        f"the database's schema ({store.address}) is at revision {current}, newer than "
        f"this ffdl knows (head {head_revision()}): upgrade ffdl to the version that "
        "migrated it, or newer"
    )


def add_missing_columns(conn: Connection, tables: Iterable[Table]) -> list[str]:
    """Add to existing ``tables`` the columns and indexes of the models they lack.

    Only nullable columns can be added to a table that may hold rows; a non-nullable one is
    a schema change this step cannot make, and says so. Returns ``table.column`` names added.
    """
    inspector = inspect(conn)
    preparer = conn.dialect.identifier_preparer
    added: list[str] = []
    for table in tables:
        if not inspector.has_table(table.name):
            continue
        present = {column["name"] for column in inspector.get_columns(table.name)}
        missing = [column for column in table.columns if column.name not in present]
        for column in missing:
            if not column.nullable:
                raise SchemaUnadoptable(
                    f"database table {table.name} lacks the non-nullable column "
                    f"{column.name}; it cannot be added automatically"
                )
            column_type = column.type.compile(dialect=conn.dialect)
            conn.execute(
                text(
                    f"ALTER TABLE {preparer.format_table(table)} "
                    f"ADD COLUMN {preparer.format_column(column)} {column_type}"
                )
            )
            added.append(f"{table.name}.{column.name}")
        # Every index, not only those over the columns just added: an index added to
        # the schema later (say a unique one over old columns) must reach old databases.
        for index in table.indexes:
            index.create(conn, checkfirst=True)
    return added


def _current(conn: Connection) -> str | None:
    heads = MigrationContext.configure(conn).get_current_heads()
    # One line of migrations: a database has at most one head.
    return heads[0] if heads else None


def _between(start: str | None, head: str) -> list[str]:
    if start == head:
        return []
    scripts = script_directory().iterate_revisions(head, start or "base")
    return [script.revision for script in reversed(list(scripts))]


def _present(conn: Connection, tables: Iterable[str]) -> set[str]:
    """Which of ``tables`` the database has."""
    return set(inspect(conn).get_table_names()) & set(tables)


def _adopt(conn: Connection) -> list[str]:
    """Bring a database made before migrations to revision 0001 and stamp it so."""
    later = _present(conn, set(Base.metadata.tables) - set(INITIAL_TABLES))
    if later:
        raise SchemaUnadoptable(
            f"the database has no schema revision but already has table(s) "
            f"{', '.join(sorted(later))}, which only later revisions create: it was made by "
            "a development build of ffdl; start over with an empty database"
        )
    # Revision 0001's tables as its migration makes them, not as the models stand now: the
    # columns later revisions add are theirs to add.
    initial = initial_schema()
    tables = [initial.tables[name] for name in INITIAL_TABLES]
    initial.create_all(conn, tables=tables)
    added = add_missing_columns(conn, tables)
    MigrationContext.configure(conn).stamp(script_directory(), INITIAL_REVISION)
    return added


@functools.cache
def initial_schema() -> MetaData:
    """The schema of revision 0001, read back from an in-memory SQLite database."""
    engine = create_engine("sqlite://")
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), INITIAL_REVISION)
            metadata = MetaData()
            metadata.reflect(conn, only=list(INITIAL_TABLES))
    finally:
        engine.dispose()
    return metadata


def _check_foreign_keys(conn: Connection) -> None:
    broken = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
    if broken:
        tables = sorted({str(row[0]) for row in broken})
        raise RuntimeError(
            f"the migration broke {len(broken)} foreign key(s) in {', '.join(tables)}; rolled back"
        )


@contextmanager
def _exclusive(store: Store) -> Iterator[Connection]:
    """A connection in a transaction that no other upgrade (or, on SQLite, writer) shares."""
    if store.dialect == "postgresql":
        with _advisory_locked(store) as conn:
            yield conn
    else:
        with _sqlite_immediate(store) as conn:
            yield conn


@contextmanager
def _advisory_locked(store: Store) -> Iterator[Connection]:
    with store.engine.connect() as conn:
        key = {"key": UPGRADE_LOCK_KEY}
        if not conn.execute(text("SELECT pg_try_advisory_lock(:key)"), key).scalar():
            log.info("waiting for another process's schema upgrade of %s", store.address)
            conn.execute(text("SELECT pg_advisory_lock(:key)"), key)
        # The lock belongs to the session, not the transaction: it outlives this commit.
        conn.commit()
        try:
            yield conn
        finally:
            conn.rollback()
            try:
                conn.execute(text("SELECT pg_advisory_unlock(:key)"), key)
                conn.commit()
            except Exception:
                # Closing the session releases the lock: never pool this connection.
                conn.invalidate()


@contextmanager
def _sqlite_immediate(store: Store) -> Iterator[Connection]:
    with store.engine.connect() as conn:
        raw = conn.connection.driver_connection
        assert raw is not None
        # Only outside a transaction does this pragma take effect.
        raw.execute("PRAGMA foreign_keys=OFF")
        try:
            conn.execution_options(**IMMEDIATE)
            conn.begin()
            yield conn
        finally:
            conn.rollback()
            try:
                raw.execute("PRAGMA foreign_keys=ON")
            except Exception:
                conn.invalidate()


def describe(schema: SchemaState) -> Sequence[str]:
    """Lines saying where a schema stands, for ``ffdl db status``."""
    current = schema.current or ("none (made before migrations)" if schema.unversioned else "none")
    lines = [f"current revision: {current}", f"head revision: {schema.head}"]
    if not schema.known:
        lines.append(
            f"the database is newer than this ffdl (revision {schema.current}): upgrade ffdl"
        )
    elif schema.pending:
        lines.append(f"pending: {' '.join(schema.pending)} (ffdl db upgrade applies them)")
    else:
        lines.append("up to date")
    return lines
