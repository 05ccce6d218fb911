"""The GPU type a user pinned an elastic job to (``ffdl scale --gpu-type``), and each job's
finish-time fairness estimate (rho).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("pinned_gpu_type", sa.String(length=100), nullable=True))
        batch.add_column(sa.Column("rho", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("rho")
        batch.drop_column("pinned_gpu_type")
