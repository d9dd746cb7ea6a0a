"""A page of a listing from the catalog, as S3 lists: keys after a marker, in byte order, those
with the delimiter after the prefix rolled up into common prefixes. A common prefix costs one
seek past it (the next query starts at the bound above it), never a read of every key
beneath it, so a page costs the same at any depth of the key space."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.catalog.keys import encode_token, rolled_up, successor
from gateway.meta.versions import object_versions as E
from gateway.meta.versions import version_info
from gateway.stores import ListPage, ObjectInfo

_COLUMNS = (E.c.key, E.c.size, E.c.etag, E.c.last_modified, E.c.attrs)


def _rows(mount_id: int, lower: str | None, inclusive: bool, upper: str | None, limit: int) -> Any:
    query = sa.select(*_COLUMNS).where(E.c.mount_id == mount_id)
    if lower is not None:
        query = query.where(E.c.key >= lower if inclusive else E.c.key > lower)
    if upper is not None:
        query = query.where(E.c.key < upper)
    return query.order_by(E.c.key).limit(limit)


def start(prefix: str, delimiter: str | None, after: str | None) -> tuple[str | None, bool] | None:
    """Where the listing's first query starts: (bound, inclusive); None past the end.
    Entries at or before `after` are not listed, and a common prefix holding `after` is at
    or before it: all of it is passed."""
    if after is None or after < prefix:
        return prefix or None, True
    held = rolled_up(after, prefix, delimiter) if after.startswith(prefix) else None
    if held is not None:
        above = successor(held)
        return (above, True) if above is not None else None
    return after, False


async def list_page(
    conn: AsyncConnection,
    mount_id: int,
    prefix: str,
    delimiter: str | None,
    after: str | None,
    max_keys: int,
) -> ListPage:
    objects: list[ObjectInfo] = []
    prefixes: list[str] = []
    if max_keys <= 0:
        return ListPage(objects, prefixes, None)
    upper = successor(prefix) if prefix else None
    begin = start(prefix, delimiter, after)
    if begin is None:
        return ListPage(objects, prefixes, None)
    lower, inclusive = begin
    count, last, limit = 0, "", max_keys + 1
    while True:
        rows = (await conn.execute(_rows(mount_id, lower, inclusive, upper, limit))).all()
        seek: str | None = None
        used = 0  # rows of this batch looked at
        for row in rows:
            used += 1
            common = rolled_up(row.key, prefix, delimiter)
            if count == max_keys:  # one entry more than the page holds: there is a next page
                return ListPage(objects, prefixes, encode_token(last))
            if common is None:
                objects.append(version_info(row))
                last = row.key
            else:
                prefixes.append(common)
                last = common
            count += 1
            if common is not None:
                seek = common
                break
        if seek is None:
            if len(rows) < limit:
                return ListPage(objects, prefixes, None)
            lower, inclusive = rows[-1].key, False
            continue
        above = successor(seek)
        if above is None:
            return ListPage(objects, prefixes, None)
        lower, inclusive = above, True
        # Common prefixes come in runs: ask for few rows at a time while they do, so that the
        # rows beneath each one are not fetched only to be passed.
        limit = max(2, min(max_keys - count + 1, 2 * used))
