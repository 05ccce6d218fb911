"""Observability: jobs' progress, ETAs and GPU use; learners' latest GPU sample; the
``gpu_samples`` series and the ``cluster_samples`` history; jobs indexed by tenant and
status for ``/metrics``.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None

_JOB_COLUMNS = (
    sa.Column("first_queue_eta_at", sa.Float(), nullable=True),
    sa.Column("progress", sa.JSON(), nullable=True),
    sa.Column("estimated_end_at", sa.Float(), nullable=True),
    sa.Column("gpu_util_avg", sa.Float(), nullable=True),
    sa.Column("gpu_util_span_s", sa.Float(), nullable=True),
    sa.Column("gpu_idle_since", sa.Float(), nullable=True),
    sa.Column("gpu_idle_flagged_at", sa.Float(), nullable=True),
)
_LEARNER_COLUMNS = (
    sa.Column("gpu_util", sa.Float(), nullable=True),
    sa.Column("gpu_memory_mb", sa.Float(), nullable=True),
    sa.Column("gpu_power_w", sa.Float(), nullable=True),
    sa.Column("gpu_stats", sa.JSON(), nullable=True),
    sa.Column("gpu_sampled_at", sa.Float(), nullable=True),
)


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        for column in _JOB_COLUMNS:
            batch.add_column(column)
    with op.batch_alter_table("learners") as batch:
        for column in _LEARNER_COLUMNS:
            batch.add_column(column)
    op.create_index("ix_jobs_tenant_status", "jobs", ["tenant_id", "status"])
    op.create_table(
        "gpu_samples",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("learner", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(length=200), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("span_s", sa.Float(), nullable=False),
        sa.Column("util", sa.Float(), nullable=False),
        sa.Column("memory_mb", sa.Float(), nullable=False),
        sa.Column("power_w", sa.Float(), nullable=True),
        sa.Column("gpus", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_gpu_samples_job", "gpu_samples", ["job_id", "learner", "time"])
    op.create_table(
        "cluster_samples",
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("span_s", sa.Float(), nullable=False),
        sa.Column("gpus_total", sa.Integer(), nullable=False),
        sa.Column("gpus_allocated", sa.Integer(), nullable=False),
        sa.Column("gpus_busy", sa.Float(), nullable=False),
        sa.Column("queue_length", sa.Integer(), nullable=False),
        sa.Column("running", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("time"),
    )


def downgrade() -> None:
    op.drop_table("cluster_samples")
    op.drop_index("ix_gpu_samples_job", table_name="gpu_samples")
    op.drop_table("gpu_samples")
    op.drop_index("ix_jobs_tenant_status", table_name="jobs")
    with op.batch_alter_table("learners") as batch:
        for column in reversed(_LEARNER_COLUMNS):
            batch.drop_column(column.name)
    with op.batch_alter_table("jobs") as batch:
        for column in reversed(_JOB_COLUMNS):
            batch.drop_column(column.name)
