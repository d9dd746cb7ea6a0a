"""The catalog's tables: every key of a `catalog=on` mount with its version and attributes, and
the state of each synced prefix (gateway.catalog reads and writes them)."""

from __future__ import annotations

import sqlalchemy as sa

from .tables import UTCDateTime, metadata, object_key_type

# One row a key, in byte order (the primary key's index serves listings and seeks). Lean on
# purpose, a training set has millions: attributes beyond the listing's are one JSON text.
catalog_entries = sa.Table(
    "catalog_entries",
    metadata,
    sa.Column(
        "mount_id",
        sa.Integer,
        sa.ForeignKey("mounts.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("key", object_key_type(), primary_key=True),
    sa.Column("size", sa.BigInteger, nullable=False),
    sa.Column("etag", sa.Text, nullable=False),
    sa.Column("last_modified", UTCDateTime, nullable=False),
    # JSON object: content type, user metadata and the other ObjectInfo fields that are set.
    sa.Column("attrs", sa.Text, nullable=False),
    # False: only what a listing tells (no content type, no user metadata): a HEAD of the key
    # asks the store once, and a cold GET opens it, before the catalog answers for it.
    sa.Column("complete", sa.Boolean, nullable=False),
    # When this row was last written (by a write through the gateway, a crawl or a
    # notification): a crawl never overwrites or removes a row written after it listed.
    sa.Column("written_at", UTCDateTime, nullable=False),
)

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
