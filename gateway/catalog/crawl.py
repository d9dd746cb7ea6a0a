"""The crawl: a prefix of a mount listed from its store into the catalog, page by page.

Each page is reconciled with the catalog's rows in the same key range in one transaction:
keys new or changed (another ETag or size) are written, keys gone are removed, unchanged keys
are not touched, so a re-crawl writes only what changed. The same transaction moves the
sync's cursor (the last key reconciled), so a run that stops (a crash, Ctrl-C) resumes after
it, on this node or another, once its lease runs out. A row written after the page was listed
(a write through the gateway meanwhile) is newer than the listing and left alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.catalog.catalog import Catalog
from gateway.catalog.keys import successor
from gateway.meta.catalog import catalog_syncs as S
from gateway.meta.store import transaction
from gateway.meta.versions import object_versions as E
from gateway.meta.versions import reconcile_page
from gateway.stores import ListPage, ObjectInfo, Store

PAGE = 1000  # keys a listing request; S3's most
LEASE = 60.0  # seconds a run holds its prefix without progress before another may resume it


@dataclass(frozen=True, slots=True)
class SyncProgress:
    """Where a sync run is: keys listed, written (new or changed) and removed so far, the last
    key reconciled, and whether the prefix is synced to the end."""

    prefix: str
    listed: int
    changed: int
    removed: int
    cursor: str | None
    done: bool
    resumed: bool = False  # this run went on from where an earlier one stopped


class SyncBusy(Exception):
    """Another run holds the prefix (its lease has not run out)."""


def run_owner() -> str:
    """Who runs a sync, for the lease and for the operator: host, process and a token."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


async def sync(
    catalog: Catalog,
    mount_id: int,
    store: Store,
    prefix: str = "",
    *,
    owner: str | None = None,
    page_size: int = PAGE,
    lease: float = LEASE,
    on_progress: Callable[[SyncProgress], None] | None = None,
) -> SyncProgress:
    """List `prefix` of the mount's store into the catalog, resuming an unfinished run; the
    progress after each page goes to `on_progress`. SyncBusy if another run holds it."""
    owner = owner or run_owner()
    async with transaction(catalog.engine) as conn:
        progress = await claim(conn, catalog, mount_id, prefix, owner, lease)
    return await crawl_claimed(
        catalog, mount_id, store, progress, owner=owner, page_size=page_size, lease=lease,
        on_progress=on_progress,
    )  # fmt: skip


async def crawl_claimed(
    catalog: Catalog,
    mount_id: int,
    store: Store,
    progress: SyncProgress,
    *,
    owner: str,
    page_size: int = PAGE,
    lease: float = LEASE,
    on_progress: Callable[[SyncProgress], None] | None = None,
) -> SyncProgress:
    """The pages of a run `owner` has claimed (`claim`), from where `progress` stands."""
    prefix, clock = progress.prefix, catalog.clock
    if on_progress is not None:
        on_progress(progress)
    cursor, finished, completed = progress.cursor, False, False

    async def listing(token: str | None, start_after: str | None) -> tuple[datetime, ListPage]:
        listed_at = clock()
        return listed_at, await store.list_page(prefix, None, token, start_after, page_size)

    ahead = asyncio.ensure_future(listing(None, cursor))
    try:
        while not finished:
            listed_at, page = await ahead
            finished = page.next_token is None
            if not finished:  # the next page is listed while this one is written
                ahead = asyncio.ensure_future(listing(page.next_token, None))
            if not page.objects and not finished:
                continue
            high = None if finished else page.objects[-1].key
            async with transaction(catalog.engine) as conn:
                await hold(conn, catalog, mount_id, prefix, owner, lease)
                changed, removed = await _reconcile(
                    conn, catalog, mount_id, prefix, cursor, high, page.objects, listed_at
                )
                progress = SyncProgress(
                    prefix, progress.listed + len(page.objects), progress.changed + changed,
                    progress.removed + removed, high, finished, progress.resumed,
                )  # fmt: skip
                await _advance(conn, catalog, mount_id, owner, progress, lease)
            cursor = high
            completed = finished
            if on_progress is not None:
                on_progress(progress)
    finally:
        if not ahead.done():
            ahead.cancel()
            with contextlib.suppress(BaseException):
                await ahead
        if not completed:  # stopped: the cursor stays, the prefix is free to resume at once
            await release(catalog, mount_id, [prefix], owner)
    return progress


async def release(catalog: Catalog, mount_id: int, prefixes: list[str], owner: str) -> None:
    """Let go of the runs `owner` holds of `prefixes`, their cursors kept (best effort: a
    lease not let go runs out)."""
    ours = (S.c.mount_id == mount_id) & (S.c.owner == owner) & S.c.prefix.in_(prefixes)
    with contextlib.suppress(Exception):
        async with transaction(catalog.engine) as conn:
            await conn.execute(sa.update(S).where(ours).values(owner=None))


async def hold(
    conn: AsyncConnection, catalog: Catalog, mount_id: int, prefix: str, owner: str, lease: float
) -> None:
    """Renew the run's lease, first thing in a transaction that reads and then writes: on
    SQLite the write lock is then taken (or waited for) before the reads, whose snapshot a
    concurrent writer (another sub-prefix's run, a write through the gateway) would otherwise
    make stale, failing the transaction's first write at once with "database is locked".
    SyncBusy if another run has taken the prefix over."""
    until = catalog.clock() + timedelta(seconds=lease)
    renewed = await conn.execute(held(mount_id, prefix, owner).values(lease_until=until))
    if renewed.rowcount != 1:
        raise SyncBusy(f"prefix {prefix!r} was taken over by another run")


def held(mount_id: int, prefix: str, owner: str) -> Any:
    return sa.update(S).where(S.c.mount_id == mount_id, S.c.prefix == prefix, S.c.owner == owner)


async def claim(
    conn: AsyncConnection, catalog: Catalog, mount_id: int, prefix: str, owner: str, lease: float
) -> SyncProgress:
    now = catalog.clock()
    insert = catalog.insert(S).values(mount_id=mount_id, prefix=prefix)
    await conn.execute(insert.on_conflict_do_nothing(index_elements=["mount_id", "prefix"]))
    where = (S.c.mount_id == mount_id) & (S.c.prefix == prefix)
    row = (await conn.execute(sa.select(S).where(where))).one()
    if row.owner is not None and row.owner != owner and row.lease_until > now:
        raise SyncBusy(f"prefix {prefix!r} is being synced by {row.owner}")
    resumed = row.started_at is not None
    values: dict[str, Any] = {"owner": owner, "lease_until": now + timedelta(seconds=lease)}
    if not resumed:
        values.update(started_at=now, cursor=None, listed=0, changed=0, removed=0)
    free = (S.c.owner.is_(None)) | (S.c.owner == owner) | (S.c.lease_until <= now)
    claimed = await conn.execute(sa.update(S).where(where & free).values(**values))
    if claimed.rowcount != 1:  # taken between our read and our update
        raise SyncBusy(f"prefix {prefix!r} is being synced by another run")
    if not resumed:
        return SyncProgress(prefix, 0, 0, 0, None, False)
    return SyncProgress(prefix, row.listed, row.changed, row.removed, row.cursor, False, True)


async def _advance(
    conn: AsyncConnection,
    catalog: Catalog,
    mount_id: int,
    owner: str,
    progress: SyncProgress,
    lease: float,
) -> None:
    now = catalog.clock()
    values: dict[str, Any] = {
        "cursor": progress.cursor, "listed": progress.listed, "changed": progress.changed,
        "removed": progress.removed, "lease_until": now + timedelta(seconds=lease),
    }  # fmt: skip
    if progress.done:
        values.update(synced_at=now, started_at=None, owner=None, lease_until=None)
    moved = await conn.execute(held(mount_id, progress.prefix, owner).values(**values))
    if moved.rowcount != 1:  # our lease ran out and another run took the prefix over
        raise SyncBusy(f"prefix {progress.prefix!r} was taken over by another run")


async def _reconcile(
    conn: AsyncConnection,
    catalog: Catalog,
    mount_id: int,
    prefix: str,
    after: str | None,
    high: str | None,
    listed: list[ObjectInfo],
    listed_at: datetime,
) -> tuple[int, int]:
    """Make the catalog's keys in (after, high] (to the prefix's end with None) those listed;
    (written, removed)."""
    where = E.c.key > after if after is not None else E.c.key >= prefix
    if high is not None:
        where &= E.c.key <= high
    elif (above := successor(prefix)) is not None:
        where &= E.c.key < above
    return await reconcile_page(
        conn, catalog.insert, mount_id, where, listed, listed_at, catalog.clock()
    )


@dataclass(frozen=True, slots=True)
class SyncState:
    """A prefix's sync as the database has it: when it last finished, and the run in progress
    (its cursor, owner and lease), with the counts of the last or current run."""

    mount_id: int
    prefix: str
    synced_at: datetime | None
    started_at: datetime | None
    cursor: str | None
    listed: int
    changed: int
    removed: int
    owner: str | None
    lease_until: datetime | None


async def sync_states(catalog: Catalog, mount_id: int | None = None) -> list[SyncState]:
    query = sa.select(S).order_by(S.c.mount_id, S.c.prefix)
    if mount_id is not None:
        query = query.where(S.c.mount_id == mount_id)
    async with transaction(catalog.engine) as conn:
        rows = (await conn.execute(query)).mappings().all()
    return [SyncState(**row) for row in rows]
