"""The catalog's table: the state of each synced prefix of a `catalog=on` mount (gateway.catalog
reads and writes it; the keys' versions are in gateway.meta.versions)."""

from __future__ import annotations

import sqlalchemy as sa

from .tables import UTCDateTime, metadata, object_key_type

# A prefix of a mount that `gateway sync` (or a re-crawl) lists into the catalog: the catalog
# answers for keys under it once it has been synced. A run in progress keeps its cursor (the
# last key reconciled) under a lease, so that it resumes, here or on another node.
catalog_syncs = sa.Table(
    "catalog_syncs",
    metadata,
    sa.Column(
        "mount_id",
        sa.Integer,
        sa.ForeignKey("mounts.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("prefix", object_key_type(), primary_key=True),
    sa.Column("synced_at", UTCDateTime, nullable=True),  # the last run that finished
    sa.Column("started_at", UTCDateTime, nullable=True),  # the run in progress, if any
    sa.Column("cursor", object_key_type(), nullable=True),
    sa.Column("listed", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("changed", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("removed", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("owner", sa.Text, nullable=True),
    sa.Column("lease_until", UTCDateTime, nullable=True),
)
