"""The fleet's members and their heartbeats.

Revision ID: 0003
Revises: 0002
Create Date: 2025-12-08
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported, as in 0001: a migration records what was created then.
TIMESTAMP = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "nodes",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("address", sa.Text(), nullable=False),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("zone", sa.Text(), server_default="", nullable=False),
        sa.Column("state", sa.String(8), nullable=False),
        sa.Column("started_at", TIMESTAMP, nullable=False),
        sa.Column("heartbeat_at", TIMESTAMP, nullable=False),
        sa.Column("cache_bytes", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("hits", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("misses", sa.BigInteger(), server_default="0", nullable=False),
        sa.CheckConstraint("state IN ('up', 'left')", name=op.f("ck_nodes_state")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_nodes")),
    )


def downgrade() -> None:
    op.drop_table("nodes")
