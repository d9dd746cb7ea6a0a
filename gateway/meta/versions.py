"""The one table of object versions: what the fleet knows of each key's current version, and the
codec between its rows and ObjectInfo.

A row is written by a read that learnt the key's version from its store (a cold miss or a stat
of an immutable mount, `metadata_ttl=-1`, or a key under a catalog's synced prefix), by a write
through the gateway, by a catalog crawl or a store notification. `complete` False: only what a
listing tells (no content type, no user metadata), so a read asks the store once before it
trusts the row. gateway.service.versions is the one reader of rows for a key; the catalog lists
them (gateway.catalog.listing) and crawls reconcile them (gateway.catalog.crawl).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from gateway.stores import ObjectInfo

from .tables import UTCDateTime, metadata, object_key_type

# One row a key, in byte order (the primary key's index serves listings and seeks). Lean on
# purpose, a training set has millions: attributes beyond the listing's are one JSON text.
object_versions = sa.Table(
    "object_versions",
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
    # False: only what a listing tells: a read asks the store once before trusting the row.
    sa.Column("complete", sa.Boolean, nullable=False),
    # When this row was last written: a crawl never overwrites or removes a row written after
    # it listed.
    sa.Column("written_at", UTCDateTime, nullable=False),
)

# ObjectInfo fields kept in the `attrs` JSON text, when set.
TEXT_FIELDS = (
    "content_type",
    "content_encoding",
    "content_disposition",
    "content_language",
    "cache_control",
    "expires",
    "store_version",  # an S3 origin's VersionId of the version, told to clients
)


def dumps(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")) if value else "{}"


def version_row(
    mount_id: int, info: ObjectInfo, complete: bool, written_at: datetime
) -> dict[str, Any]:
    attrs: dict[str, Any] = {n: getattr(info, n) for n in TEXT_FIELDS if getattr(info, n)}
    if info.metadata:
        attrs["metadata"] = dict(info.metadata)
    if info.checksums:
        attrs["checksums"] = dict(info.checksums)
    if info.storage_class != "STANDARD":
        attrs["storage_class"] = info.storage_class
    return {
        "mount_id": mount_id,
        "key": info.key,
        "size": info.size,
        "etag": info.etag,
        "last_modified": info.last_modified,
        "attrs": dumps(attrs),
        "complete": complete,
        "written_at": written_at,
    }


def version_info(row: sa.RowMapping | sa.Row[Any]) -> ObjectInfo:
    values = row._mapping if isinstance(row, sa.Row) else row
    attrs = json.loads(values["attrs"]) if values["attrs"] != "{}" else {}
    return ObjectInfo(
        key=values["key"],
        size=values["size"],
        etag=values["etag"],
        last_modified=values["last_modified"],
        metadata=attrs.get("metadata", {}),
        checksums=attrs.get("checksums", {}),
        storage_class=attrs.get("storage_class", "STANDARD"),
        # Only known names: a newer gateway sharing the database may have added fields.
        **{name: attrs[name] for name in TEXT_FIELDS if name in attrs},
    )
