"""Preload jobs: jobs, their work items, each node's share of each batch, their first errors;
and the admin flag of access keys (the operator API).

Revision ID: 0005_jobs
Revises: 0004_store_uploads
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_jobs"
down_revision: str | Sequence[str] | None = "0004_store_uploads"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported, as in 0001: a migration records what was created then.
TIMESTAMP = sa.DateTime(timezone=True)
OBJECT_KEY = sa.Text().with_variant(sa.Text(collation="C"), "postgresql")
STATES = "'queued', 'listing', 'running', 'done', 'partial', 'failed', 'cancelled'"


def _counter(name: str) -> sa.Column:  # type: ignore[type-arg]
    return sa.Column(name, sa.BigInteger(), nullable=False, server_default="0")


def upgrade() -> None:
    with op.batch_alter_table("access_keys") as batch:
        batch.add_column(
            sa.Column("admin", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("bucket", sa.String(255), nullable=False),
        sa.Column("prefix", OBJECT_KEY, nullable=False),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("state", sa.String(10), nullable=False),
        sa.Column("message", sa.Text(), nullable=False, server_default=""),
        sa.Column("submitted_by", sa.Text(), nullable=False),
        sa.Column("submitted_at", TIMESTAMP, nullable=False),
        sa.Column("started_at", TIMESTAMP, nullable=True),
        sa.Column("ended_at", TIMESTAMP, nullable=True),
        sa.Column("lease_owner", sa.Text(), nullable=True),
        sa.Column("lease_expires", TIMESTAMP, nullable=True),
        _counter("total_objects"),
        _counter("total_bytes"),
        sa.CheckConstraint(f"state IN ({STATES})", name=op.f("ck_jobs_state")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    op.create_index("ix_jobs_state", "jobs", ["state"])
    op.create_table(
        "job_items",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("key", OBJECT_KEY, nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("etag", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_items_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "seq", name=op.f("pk_job_items")),
    )
    op.create_table(
        "job_work",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Text(), nullable=False),
        sa.Column("state", sa.String(8), nullable=False),
        sa.Column("lease_owner", sa.Text(), nullable=True),
        sa.Column("lease_expires", TIMESTAMP, nullable=True),
        sa.Column("cursor", sa.Integer(), nullable=False, server_default="0"),
        _counter("objects"),
        _counter("bytes"),
        _counter("loaded_objects"),
        _counter("loaded_bytes"),
        _counter("cached_objects"),
        _counter("cached_bytes"),
        _counter("skipped"),
        _counter("failures"),
        _counter("unkept_bytes"),
        sa.Column("full", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.CheckConstraint(
            "state IN ('pending', 'leased', 'done')", name=op.f("ck_job_work_state")
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_work_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "batch", "node_id", name=op.f("pk_job_work")),
    )
    op.create_table(
        "job_errors",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Text(), nullable=False),
        sa.Column("key", OBJECT_KEY, nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_errors_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_errors")),
    )
    op.create_index("ix_job_errors_job_id", "job_errors", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_job_errors_job_id", table_name="job_errors")
    op.drop_table("job_errors")
    op.drop_table("job_work")
    op.drop_table("job_items")
    op.drop_index("ix_jobs_state", table_name="jobs")
    op.drop_table("jobs")
    with op.batch_alter_table("access_keys") as batch:
        batch.drop_column("admin")
