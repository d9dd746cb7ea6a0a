"""Node cache figures: what `gateway status` shows of each node besides its bytes, hits and
misses: its byte budget, pinned bytes, the blocks preload fetched (counted apart from the
clients' misses), and the same per mount (a JSON list, written whole with each heartbeat).

Revision ID: 0012_node_cache_figures
Revises: 0011_key_locks
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_node_cache_figures"
down_revision: str | Sequence[str] | None = "0011_key_locks"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COUNTS = ("capacity_bytes", "pinned_bytes", "preload_fills")


def upgrade() -> None:
    for name in _COUNTS:
        op.add_column("nodes", sa.Column(name, sa.BigInteger(), nullable=False, server_default="0"))
    op.add_column("nodes", sa.Column("mounts", sa.Text(), nullable=False, server_default="[]"))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        for name in (*_COUNTS, "mounts"):
            batch.drop_column(name)
