"""GPU types a job accepts, and whether one gang may span several of them.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("gpu_types", sa.JSON(), nullable=True))
        batch.add_column(
            sa.Column("mix_gpu_types", sa.Boolean(), server_default=sa.false(), nullable=False)
        )
    # A job that named one type accepts exactly that one.
    op.execute(
        sa.text(
            "UPDATE jobs SET gpu_types = json_build_array(gpu_type) WHERE gpu_type IS NOT NULL"
            if op.get_bind().dialect.name == "postgresql"
            else "UPDATE jobs SET gpu_types = json_array(gpu_type) WHERE gpu_type IS NOT NULL"
        )
    )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("mix_gpu_types")
        batch.drop_column("gpu_types")
