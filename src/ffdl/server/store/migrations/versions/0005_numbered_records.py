"""Per-job numbers of log lines and metrics: each job's records count 1, 2, 3, ... as
FfDL's did, instead of sharing row ids across jobs; jobs indexed in the list's order.

Existing rows are numbered in the order they were stored (their ids), job by job, and each
job's counters start after its last number. On SQLite making ``number`` required rewrites
both tables (the way SQLite changes a column): allow for the time on a large database.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None

# (table, the job's counter of it)
_NUMBERED = (("log_lines", "last_line_number"), ("metrics", "last_metric_number"))


def upgrade() -> None:
    op.create_index("ix_jobs_submitted_id", "jobs", ["submitted_at", "id"])
    with op.batch_alter_table("jobs") as batch:
        for _, counter in _NUMBERED:
            batch.add_column(sa.Column(counter, sa.Integer(), server_default="0", nullable=False))
    for table, counter in _NUMBERED:
        op.add_column(table, sa.Column("number", sa.Integer(), nullable=True))
        op.execute(
            f"UPDATE {table} SET number = ranked.n FROM ("
            f"SELECT id, row_number() OVER (PARTITION BY job_id ORDER BY id) AS n FROM {table}"
            f") AS ranked WHERE {table}.id = ranked.id"
        )
        op.drop_index(f"ix_{table}_job", table_name=table)
        with op.batch_alter_table(table) as batch:
            batch.alter_column("number", existing_type=sa.Integer(), nullable=False)
        op.create_index(f"ux_{table}_job_number", table, ["job_id", "number"], unique=True)
        op.execute(
            f"UPDATE jobs SET {counter} = (SELECT coalesce(max(number), 0) FROM {table} "
            f"WHERE {table}.job_id = jobs.id)"
        )


def downgrade() -> None:
    for table, _ in _NUMBERED:
        op.drop_index(f"ux_{table}_job_number", table_name=table)
        with op.batch_alter_table(table) as batch:
            batch.drop_column("number")
        op.create_index(f"ix_{table}_job", table, ["job_id", "id"])
    with op.batch_alter_table("jobs") as batch:
        for _, counter in reversed(_NUMBERED):
            batch.drop_column(counter)
    op.drop_index("ix_jobs_submitted_id", table_name="jobs")
