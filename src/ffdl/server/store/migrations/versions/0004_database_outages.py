"""Database outages: when each replica last saw its database come back.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("replicas") as batch:
        batch.add_column(sa.Column("database_returned_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("replicas") as batch:
        batch.drop_column("database_returned_at")
