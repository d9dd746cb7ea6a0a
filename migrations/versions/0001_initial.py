"""Mounts, access keys and object metadata.

Revision ID: 0001
Revises:
Create Date: 2025-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported from gateway.meta.tables: a migration is a record of what
# was created then, and must not change when the tables module does.
TIMESTAMP = sa.DateTime(timezone=True)
# Byte order for S3 keys (SQLite's default already; PostgreSQL needs the C collation).
OBJECT_KEY = sa.Text().with_variant(sa.Text(collation="C"), "postgresql")


def upgrade() -> None:
    op.create_table(
        "mounts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("bucket", sa.String(255), nullable=False),
        sa.Column("uri", sa.Text(), nullable=False),
        sa.Column("options", sa.Text(), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_mounts")),
        sa.UniqueConstraint("bucket", name=op.f("uq_mounts_bucket")),
    )
    op.create_table(
        "access_keys",
        sa.Column("access_key", sa.String(128), nullable=False),
        sa.Column("secret_enc", sa.Text(), nullable=False),
        sa.Column("description", sa.Text(), server_default="", nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("access_key", name=op.f("pk_access_keys")),
    )
    op.create_table(
        "objects",
        sa.Column("mount_id", sa.Integer(), nullable=False),
        sa.Column("key", OBJECT_KEY, nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("etag", sa.Text(), nullable=False),
        sa.Column("last_modified", TIMESTAMP, nullable=False),
        sa.Column("content_type", sa.Text(), nullable=True),
        sa.Column("extra", sa.Text(), nullable=False),
        sa.Column("checked_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(
            ["mount_id"],
            ["mounts.id"],
            name=op.f("fk_objects_mount_id_mounts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("mount_id", "key", name=op.f("pk_objects")),
    )


def downgrade() -> None:
    op.drop_table("objects")
    op.drop_table("access_keys")
    op.drop_table("mounts")
