"""Uploads a node opened at an under-store on its own behalf, under a lease.

Revision ID: 0004_store_uploads
Revises: 0003
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_store_uploads"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported, as in 0001: a migration records what was created then.
TIMESTAMP = sa.DateTime(timezone=True)
OBJECT_KEY = sa.Text().with_variant(sa.Text(collation="C"), "postgresql")


def upgrade() -> None:
    op.create_table(
        "store_uploads",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("mount_id", sa.Integer(), nullable=False),
        sa.Column("key", OBJECT_KEY, nullable=False),
        sa.Column("store_upload_id", sa.Text(), nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("expires_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(
            ["mount_id"],
            ["mounts.id"],
            name=op.f("fk_store_uploads_mount_id_mounts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_store_uploads")),
    )
    op.create_index("ix_store_uploads_expires_at", "store_uploads", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_store_uploads_expires_at", table_name="store_uploads")
    op.drop_table("store_uploads")
