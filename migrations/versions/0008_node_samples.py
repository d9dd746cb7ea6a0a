"""Node samples: each node's running totals (requests, bytes sent, cache hits and misses, cache
bytes and capacity) every few heartbeats, an hour of them, for the console's charts; and
access_keys.disabled: a disabled key authenticates nowhere.

Revision ID: 0008_node_samples
Revises: 0007_tenants
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_node_samples"
down_revision: str | Sequence[str] | None = "0007_tenants"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _total(name: str) -> sa.Column:  # type: ignore[type-arg]
    return sa.Column(name, sa.BigInteger(), nullable=False)


def upgrade() -> None:
    op.create_table(
        "node_samples",
        sa.Column("node_id", sa.Text(), nullable=False),
        sa.Column("worker", sa.Integer(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        _total("requests"),
        _total("sent_bytes"),
        _total("hits"),
        _total("misses"),
        _total("cache_bytes"),
        _total("capacity_bytes"),
        sa.PrimaryKeyConstraint("node_id", "worker", "at", name=op.f("pk_node_samples")),
    )
    op.create_index("ix_node_samples_at", "node_samples", ["at"])
    with op.batch_alter_table("access_keys") as batch:
        batch.add_column(
            sa.Column("disabled", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("access_keys") as batch:
        batch.drop_column("disabled")
    op.drop_index("ix_node_samples_at", table_name="node_samples")
    op.drop_table("node_samples")
