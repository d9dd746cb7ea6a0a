"""Multipart uploads in progress and their parts.

Revision ID: 0002
Revises: 0001
Create Date: 2025-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported, as in 0001: a migration records what was created then.
TIMESTAMP = sa.DateTime(timezone=True)
# Byte order for S3 keys (SQLite's default already; PostgreSQL needs the C collation).
OBJECT_KEY = sa.Text().with_variant(sa.Text(collation="C"), "postgresql")


def upgrade() -> None:
    op.create_table(
        "multipart_uploads",
        sa.Column("upload_id", sa.Text(), nullable=False),
        sa.Column("mount_id", sa.Integer(), nullable=False),
        sa.Column("key", OBJECT_KEY, nullable=False),
        sa.Column("store_upload_id", sa.Text(), nullable=False),
        sa.Column("attrs", sa.Text(), nullable=False),
        sa.Column("initiated_at", TIMESTAMP, nullable=False),
        sa.Column("access_key", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["mount_id"],
            ["mounts.id"],
            name=op.f("fk_multipart_uploads_mount_id_mounts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("upload_id", name=op.f("pk_multipart_uploads")),
    )
    op.create_index(
        "ix_multipart_uploads_mount_id_key_upload_id",
        "multipart_uploads",
        ["mount_id", "key", "upload_id"],
        unique=False,
    )
    op.create_index(
        "ix_multipart_uploads_initiated_at",
        "multipart_uploads",
        ["initiated_at"],
        unique=False,
    )
    op.create_table(
        "multipart_parts",
        sa.Column("upload_id", sa.Text(), nullable=False),
        sa.Column("part_number", sa.Integer(), nullable=False),
        sa.Column("etag", sa.Text(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("uploaded_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(
            ["upload_id"],
            ["multipart_uploads.upload_id"],
            name=op.f("fk_multipart_parts_upload_id_multipart_uploads"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("upload_id", "part_number", name=op.f("pk_multipart_parts")),
    )


def downgrade() -> None:
    op.drop_table("multipart_parts")
    op.drop_index("ix_multipart_uploads_initiated_at", table_name="multipart_uploads")
    op.drop_index("ix_multipart_uploads_mount_id_key_upload_id", table_name="multipart_uploads")
    op.drop_table("multipart_uploads")
