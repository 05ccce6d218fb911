"""Retention: chunks of log lines and metrics moved out to the archive store, and each
job's mark of how far its records were moved.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None

_MARKS = ("archived_line_number", "archived_metric_number")


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        for mark in _MARKS:
            batch.add_column(sa.Column(mark, sa.Integer(), server_default="0", nullable=False))
    op.create_table(
        "record_chunks",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "job_id",
            sa.String(length=64),
            sa.ForeignKey("jobs.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("first_number", sa.Integer(), nullable=False),
        sa.Column("last_number", sa.Integer(), nullable=False),
        sa.Column("min_time", sa.Float(), nullable=False),
        sa.Column("max_time", sa.Float(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("size_bytes", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_index(
        "ux_record_chunks_job_kind_first",
        "record_chunks",
        ["job_id", "kind", "first_number"],
        unique=True,
    )


def downgrade() -> None:
    op.drop_index("ux_record_chunks_job_kind_first", table_name="record_chunks")
    op.drop_table("record_chunks")
    with op.batch_alter_table("jobs") as batch:
        for mark in reversed(_MARKS):
            batch.drop_column(mark)
