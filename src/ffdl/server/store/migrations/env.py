"""Alembic's environment for ffdl's store: runs migrations on the connection it is given.

``ffdl.server.store.schema`` builds the Alembic config in code and passes, in
``config.attributes``, the connection to migrate (already in its transaction, holding the
upgrade lock) and a list that collects the revisions applied. There is no ``alembic.ini``
and no offline (SQL script) mode.

``render_as_batch``: on SQLite, a migration that alters a table recreates it (copy, drop,
rename), the only way SQLite can change most of a table; on PostgreSQL batch operations
are plain ``ALTER TABLE``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from alembic import context
from alembic.runtime.migration import MigrationContext, MigrationInfo

from ffdl.server.store.models import Base

config = context.config
connection = config.attributes.get("connection")
if connection is None:
    raise RuntimeError(
        "ffdl's migrations run through ffdl.server.store.schema (ffdl db upgrade), "
        "not from the alembic command line"
    )
applied: list[str] = config.attributes.setdefault("applied", [])


def _record(
    ctx: MigrationContext, step: MigrationInfo, heads: Collection[Any], run_args: Mapping[str, Any]
) -> None:
    if step.is_upgrade and not step.is_stamp and step.up_revision_id is not None:
        applied.append(step.up_revision_id)


context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=True,
    compare_type=True,
    on_version_apply=_record,
)
with context.begin_transaction():
    context.run_migrations()
