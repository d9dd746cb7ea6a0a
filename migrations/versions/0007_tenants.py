"""Tenants: users, their policies, keys' users, buckets' owners and bucket policies.

Every key there is belongs to one user, "admin", holding the built-in `admin` policy, and
every mount is owned by it: the gateway answers as it did before, until users are made.

Revision ID: 0007_tenants
Revises: 0006_catalog
Create Date: 2026-12-01
"""

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0007_tenants"
down_revision: str | Sequence[str] | None = "0006_catalog"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIMESTAMP = sa.DateTime(timezone=True)
ADMIN_USER = "admin"


def upgrade() -> None:
    users = op.create_table(
        "users",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_users")),
        sa.UniqueConstraint("name", name=op.f("uq_users_name")),
    )
    op.create_table(
        "policies",
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("document", sa.Text(), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_policies")),
    )
    user_policies = op.create_table(
        "user_policies",
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("policy", sa.String(128), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_user_policies_user_id_users"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("user_id", "policy", name=op.f("pk_user_policies")),
    )  # fmt: skip
    op.create_table(
        "bucket_policies",
        sa.Column("mount_id", sa.Integer(), nullable=False),
        sa.Column("document", sa.Text(), nullable=False),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(
            ["mount_id"], ["mounts.id"], name=op.f("fk_bucket_policies_mount_id_mounts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("mount_id", name=op.f("pk_bucket_policies")),
    )  # fmt: skip
    # No foreign keys on the two added columns: SQLite cannot add one without rebuilding
    # the tables; the store keeps them consistent (a user owning buckets is not deleted).
    op.add_column("access_keys", sa.Column("user_id", sa.Integer(), nullable=True))
    op.add_column("mounts", sa.Column("owner_id", sa.Integer(), nullable=True))

    now = datetime.now(UTC)
    if op.get_bind().dialect.name == "sqlite":
        now = now.replace(tzinfo=None)
    op.bulk_insert(users, [{"name": ADMIN_USER, "created_at": now}])
    admin_id = (
        op.get_bind().execute(sa.select(users.c.id).where(users.c.name == ADMIN_USER)).scalar_one()
    )
    op.bulk_insert(user_policies, [{"user_id": admin_id, "policy": "admin"}])
    op.execute(sa.text("UPDATE access_keys SET user_id = :u").bindparams(u=admin_id))
    op.execute(sa.text("UPDATE mounts SET owner_id = :u").bindparams(u=admin_id))


def downgrade() -> None:
    op.drop_column("mounts", "owner_id")
    op.drop_column("access_keys", "user_id")
    op.drop_table("bucket_policies")
    op.drop_table("user_policies")
    op.drop_table("policies")
    op.drop_table("users")
