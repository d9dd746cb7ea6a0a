"""The console's signed-out sessions (by nonce, until the session would have expired), in the
database so that a sign-out holds on every node and worker of a fleet.

Revision ID: 0009_console_signed_out
Revises: 0008_node_samples
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_console_signed_out"
down_revision: str | Sequence[str] | None = "0008_node_samples"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "console_signed_out",
        sa.Column("nonce", sa.Text(), nullable=False),
        sa.Column("expires", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("nonce", name=op.f("pk_console_signed_out")),
    )
    op.create_index("ix_console_signed_out_expires", "console_signed_out", ["expires"])


def downgrade() -> None:
    op.drop_index("ix_console_signed_out_expires", table_name="console_signed_out")
    op.drop_table("console_signed_out")
