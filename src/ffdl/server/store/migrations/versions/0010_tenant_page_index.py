"""A tenant's jobs in list order, id included: a deep page's ids read from the index alone.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_index("ix_jobs_tenant_submitted_id", "jobs", ["tenant_id", "submitted_at", "id"])
    # Its every use is served by the new index, which begins with the same columns.
    op.drop_index("ix_jobs_tenant_submitted", table_name="jobs")


def downgrade() -> None:
    op.create_index("ix_jobs_tenant_submitted", "jobs", ["tenant_id", "submitted_at"])
    op.drop_index("ix_jobs_tenant_submitted_id", table_name="jobs")
