"""The catalog: keys of catalog=on mounts, and the state of synced prefixes.

Revision ID: 0006_catalog
Revises: 0004_store_uploads
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_catalog"
# Re-chained after 0005_jobs when the preload jobs land.
down_revision: str | Sequence[str] | None = "0005_jobs"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported, as in 0001: a migration records what was created then.
TIMESTAMP = sa.DateTime(timezone=True)
OBJECT_KEY = sa.Text().with_variant(sa.Text(collation="C"), "postgresql")


def upgrade() -> None:
    op.create_table(
        "catalog_entries",
        sa.Column("mount_id", sa.Integer(), nullable=False),
        sa.Column("key", OBJECT_KEY, nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("etag", sa.Text(), nullable=False),
        sa.Column("last_modified", TIMESTAMP, nullable=False),
        sa.Column("attrs", sa.Text(), nullable=False),
        sa.Column("complete", sa.Boolean(), nullable=False),
        sa.Column("written_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(
            ["mount_id"],
            ["mounts.id"],
            name=op.f("fk_catalog_entries_mount_id_mounts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("mount_id", "key", name=op.f("pk_catalog_entries")),
    )
    op.create_table(
        "catalog_syncs",
        sa.Column("mount_id", sa.Integer(), nullable=False),
        sa.Column("prefix", OBJECT_KEY, nullable=False),
        sa.Column("synced_at", TIMESTAMP, nullable=True),
        sa.Column("started_at", TIMESTAMP, nullable=True),
        sa.Column("cursor", OBJECT_KEY, nullable=True),
        sa.Column("listed", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("changed", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("removed", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("owner", sa.Text(), nullable=True),
        sa.Column("lease_until", TIMESTAMP, nullable=True),
        sa.ForeignKeyConstraint(
            ["mount_id"],
            ["mounts.id"],
            name=op.f("fk_catalog_syncs_mount_id_mounts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("mount_id", "prefix", name=op.f("pk_catalog_syncs")),
    )


def downgrade() -> None:
    op.drop_table("catalog_syncs")
    op.drop_table("catalog_entries")
