"""A sync split by delimiter: the prefix's sub-prefixes (`prefix` + name + '/') crawled at once,
each as a sync of its own (its own cursor and lease, so each resumes on its own), where the
store's layout allows it: every key of the prefix lies in a sub-prefix, as in a training set
of shards. A prefix with keys of its own is crawled in one run, as `sync` does.

When the sub-prefixes are synced, the catalog's rows under the prefix that lie in none of them
(a sub-prefix gone from the store) are removed, the prefix is marked synced and the
sub-prefixes' own sync rows are dropped: a re-crawl takes the prefix as a whole again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from gateway.catalog.catalog import Catalog
from gateway.catalog.crawl import (
    LEASE,
    PAGE,
    SyncProgress,
    claim,
    crawl_claimed,
    held,
    hold,
    release,
    run_owner,
    sync,
)
from gateway.catalog.keys import successor
from gateway.catalog.listing import list_page
from gateway.meta.catalog import catalog_syncs as S
from gateway.meta.store import transaction
from gateway.meta.versions import remove_older
from gateway.stores import Store

DELIMITER = "/"


async def sync_parallel(
    catalog: Catalog,
    mount_id: int,
    store: Store,
    prefix: str = "",
    *,
    workers: int = 4,
    owner: str | None = None,
    page_size: int = PAGE,
    lease: float = LEASE,
    on_progress: Callable[[SyncProgress], None] | None = None,
) -> SyncProgress:
    """`sync`, with up to `workers` sub-prefixes listed at once where the layout allows."""
    owner = owner or run_owner()
    # Claimed before the store is asked anything: nodes that find a re-crawl due at once
    # do not all list the layout.
    async with transaction(catalog.engine) as conn:
        start = await claim(conn, catalog, mount_id, prefix, owner, lease)
        began: datetime = (await conn.execute(_row(mount_id, prefix, S.c.started_at))).scalar_one()
    try:
        children, own_keys = await _layout(store, prefix, page_size)
    except BaseException:
        await release(catalog, mount_id, [prefix], owner)
        raise
    if own_keys or not children or workers <= 1:
        return await crawl_claimed(
            catalog, mount_id, store, start, owner=owner, page_size=page_size, lease=lease,
            on_progress=on_progress,
        )  # fmt: skip
    totals: dict[str, SyncProgress] = {}

    def report(p: SyncProgress) -> None:
        totals[p.prefix] = p
        if on_progress is not None:
            on_progress(_sum(prefix, totals.values(), False, start.resumed))

    slots = asyncio.Semaphore(workers)

    async def child(sub: str) -> None:
        async with slots:
            query = sa.select(S).where(S.c.mount_id == mount_id, S.c.prefix == sub)
            async with transaction(catalog.engine) as conn:
                row = (await conn.execute(query)).first()
            if row is not None and row.synced_at is not None and row.synced_at >= began:
                # Done by this run before it stopped: counted, not listed again.
                totals[sub] = SyncProgress(sub, row.listed, row.changed, row.removed, None, True)
                return
            await sync(
                catalog, mount_id, store, sub, owner=owner, page_size=page_size, lease=lease,
                on_progress=report,
            )  # fmt: skip

    renewing = asyncio.create_task(_renew(catalog, mount_id, prefix, owner, lease))
    done: SyncProgress | None = None
    try:
        runs = [asyncio.create_task(child(sub)) for sub in children]
        try:
            await asyncio.gather(*runs)
        except BaseException:  # one failed: the others stop too, each keeping its cursor
            for run in runs:
                run.cancel()
            await asyncio.gather(*runs, return_exceptions=True)
            raise
        removed = await _outside(catalog, mount_id, prefix, owner, lease, set(children), began)
        done = _sum(prefix, totals.values(), True, start.resumed)
        done = SyncProgress(prefix, done.listed, done.changed, done.removed + removed, None, True,
                            start.resumed)  # fmt: skip
        now = catalog.clock()
        async with transaction(catalog.engine) as conn:
            await conn.execute(
                held(mount_id, prefix, owner).values(
                    synced_at=now, started_at=None, cursor=None, owner=None, lease_until=None,
                    listed=done.listed, changed=done.changed, removed=done.removed,
                )
            )  # fmt: skip
            subs = sa.delete(S).where(S.c.mount_id == mount_id, S.c.prefix.in_(children))
            await conn.execute(subs)
    finally:
        renewing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewing
        if done is None:  # stopped: free to resume at once (the sub-prefixes keep cursors)
            await release(catalog, mount_id, [prefix, *children], owner)
    if on_progress is not None:
        on_progress(done)
    return done


def _row(mount_id: int, prefix: str, column: sa.Column[Any]) -> sa.Select[Any]:
    return sa.select(column).where(S.c.mount_id == mount_id, S.c.prefix == prefix)


def _sum(prefix: str, parts: Iterable[SyncProgress], done: bool, resumed: bool) -> SyncProgress:
    items = list(parts)
    return SyncProgress(
        prefix, sum(p.listed for p in items), sum(p.changed for p in items),
        sum(p.removed for p in items), None, done, resumed,
    )  # fmt: skip


async def _layout(store: Store, prefix: str, page_size: int) -> tuple[list[str], bool]:
    """The prefix's sub-prefixes, and whether it holds keys of its own."""
    children: list[str] = []
    own = False
    token = None
    while True:
        page = await store.list_page(prefix, DELIMITER, token, None, page_size)
        children += page.common_prefixes
        own = own or bool(page.objects)
        if page.next_token is None:
            return children, own
        token = page.next_token


async def _renew(catalog: Catalog, mount_id: int, prefix: str, owner: str, lease: float) -> None:
    while True:
        await asyncio.sleep(lease / 3)
        until = catalog.clock() + timedelta(seconds=lease)
        async with transaction(catalog.engine) as conn:
            await conn.execute(held(mount_id, prefix, owner).values(lease_until=until))


async def _outside(
    catalog: Catalog,
    mount_id: int,
    prefix: str,
    owner: str,
    lease: float,
    children: set[str],
    began: datetime,
) -> int:
    """Remove the rows under `prefix` in none of `children` (written before the run began);
    how many. The catalog's own listing by delimiter finds them, a seek per sub-prefix."""
    removed = 0
    after: str | None = None
    while True:
        async with transaction(catalog.engine) as conn:
            await hold(conn, catalog, mount_id, prefix, owner, lease)
            page = await list_page(conn, mount_id, prefix, DELIMITER, after, PAGE)
            for sub in page.common_prefixes:
                if sub not in children:
                    removed += await remove_older(
                        conn, mount_id, began, lower=sub, upper=successor(sub)
                    )
            stray = [o.key for o in page.objects]
            if stray:
                removed += await remove_older(conn, mount_id, began, keys=stray)
        if page.next_token is None:
            return removed
        entries = [o.key for o in page.objects] + list(page.common_prefixes)
        after = max(entries)
