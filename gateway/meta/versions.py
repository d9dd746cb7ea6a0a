"""The one table of object versions: what the fleet knows of each key's current version, and the
codec between its rows and ObjectInfo.

A row is written by a read that learnt the key's version from its store (a cold miss or a stat
of an immutable mount, `metadata_ttl=-1`, or a key under a catalog's synced prefix), by a write
through the gateway, by a catalog crawl or a store notification. `complete` False: only what a
listing tells (no content type, no user metadata), so a read asks the store once before it
trusts the row. gateway.service.versions is the one reader of rows for a key; the catalog lists
them (gateway.catalog.listing). Every write of rows is one of the functions below (the one
writer): a change of keys (`MetaStore.record_versions`, for reads, writes and notifications
through gateway.service.version_rows), and a crawl's reconciliation of a listed page with the
rows it spans (`reconcile_page`, `remove_older`), which never overwrites or removes a row
written after the listing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

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


_IN_CHUNK = 500  # keys in one IN (...) list


async def reconcile_page(
    conn: AsyncConnection,
    insert: Callable[[sa.Table], Any],
    mount_id: int,
    where: sa.ColumnElement[bool],
    listed: Sequence[ObjectInfo],
    listed_at: datetime,
    now: datetime,
) -> tuple[int, int]:
    """Make the mount's rows that `where` selects (a listed page's span of keys) those listed,
    as listing-only rows (complete False) where they differ; rows written since `listed_at`
    are newer than the listing and kept. `insert`: the dialect's insert (ON CONFLICT).
    (written, removed)."""
    E = object_versions
    have = {
        row.key: (row.etag, row.size)
        for row in await conn.execute(
            sa.select(E.c.key, E.c.etag, E.c.size).where(E.c.mount_id == mount_id, where)
        )
    }
    rows = [
        version_row(mount_id, info, False, now)
        for info in listed
        if have.pop(info.key, None) != (info.etag, info.size)
    ]
    if rows:
        statement = insert(E)
        update = {n: statement.excluded[n] for n in rows[0] if n not in ("mount_id", "key")}
        await conn.execute(
            statement.on_conflict_do_update(
                index_elements=["mount_id", "key"], set_=update, where=E.c.written_at < listed_at
            ),
            rows,
        )
    gone = sorted(have)
    for i in range(0, len(gone), _IN_CHUNK):
        await conn.execute(
            sa.delete(E).where(
                E.c.mount_id == mount_id,
                E.c.key.in_(gone[i : i + _IN_CHUNK]),
                E.c.written_at < listed_at,
            )
        )
    return len(rows), len(gone)


async def remove_older(
    conn: AsyncConnection,
    mount_id: int,
    began: datetime,
    keys: Sequence[str] = (),
    lower: str | None = None,
    upper: str | None = None,
) -> int:
    """Remove the mount's rows written before `began` (a crawl that did not list them): the
    `keys` named, or those in [lower, upper) (upper None: to the end). How many."""
    E = object_versions
    where = (E.c.mount_id == mount_id) & (E.c.written_at < began)
    if keys:
        where &= E.c.key.in_(list(keys))
    else:
        assert lower is not None
        where &= E.c.key >= lower
        if upper is not None:
            where &= E.c.key < upper
    return int((await conn.execute(sa.delete(E).where(where))).rowcount)
