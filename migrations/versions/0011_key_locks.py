"""Key locks: a writer's hold on one key of a mount against the fleet's other writers of it
(a conditional PUT or a multipart complete, from the check of its condition to the store's
answer), under a lease by the database's clock (gateway/meta/key_locks.py).

Revision ID: 0011_key_locks
Revises: 0010_object_versions
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_key_locks"
down_revision: str | Sequence[str] | None = "0010_object_versions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported, as in 0001: a migration records what was created then.
TIMESTAMP = sa.DateTime(timezone=True)
OBJECT_KEY = sa.Text().with_variant(sa.Text(collation="C"), "postgresql")


def upgrade() -> None:
    op.create_table(
        "key_locks",
        sa.Column("mount_id", sa.Integer(), nullable=False),
        sa.Column("key", OBJECT_KEY, nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("expires_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(
            ["mount_id"],
            ["mounts.id"],
            name=op.f("fk_key_locks_mount_id_mounts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("mount_id", "key", name=op.f("pk_key_locks")),
    )


def downgrade() -> None:
    op.drop_table("key_locks")
