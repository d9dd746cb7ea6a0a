"""The crawl against moto on both databases: a run that stops resumes after its cursor, a
re-crawl writes only what changed, and a row written after a page was listed (a write through
the gateway meanwhile) is newer than the listing and kept."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from gateway.catalog import Catalog, SyncProgress, sync, sync_parallel
from gateway.meta import MetaStore, Mount
from gateway.service.version_rows import VersionRows
from gateway.stores import ObjectInfo, Store, open_store
from tests.support.origin import CountingProxy

pytestmark = pytest.mark.anyio

_buckets = itertools.count()


class Stop(Exception):
    """The operator's Ctrl-C, in the middle of a run."""


async def _mounted(
    meta: MetaStore, proxy: CountingProxy, origin_s3: Any, keys: list[str]
) -> tuple[Mount, Store]:
    bucket = f"catalog-crawl-{next(_buckets)}-{meta.dialect[:2]}"
    origin_s3.create_bucket(Bucket=bucket)
    for key in keys:
        origin_s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    options = {"endpoint_url": proxy.url, "access_key": "ak", "secret_key": "sk"}
    mount = await meta.add_mount(bucket, f"s3://{bucket}", {**options, "catalog": "on"})
    return mount, open_store(mount.uri, options)


async def _keys(catalog: Catalog, mount_id: int, prefix: str = "") -> list[str]:
    await catalog.refresh()
    page = await catalog.list_page(mount_id, prefix, None, None, None, 1000)
    assert page is not None
    return [o.key for o in page.objects]


async def test_a_stopped_sync_resumes_after_its_cursor(
    meta: MetaStore, proxy: CountingProxy, origin_s3: Any
) -> None:
    keys = [f"k/{i:02d}" for i in range(25)]
    mount, store = await _mounted(meta, proxy, origin_s3, keys)
    catalog = Catalog(meta.engine)
    seen: list[SyncProgress] = []

    def stop_after_two_pages(p: SyncProgress) -> None:
        seen.append(p)
        if p.listed == 10:
            raise Stop

    with pytest.raises(Stop):
        await sync(catalog, mount.id, store, "", page_size=5, on_progress=stop_after_two_pages)
    await catalog.refresh()
    assert not catalog.covers(mount.id, "k/")  # not synced to the end: not answered for
    proxy.reset()
    done = await sync(catalog, mount.id, store, "", page_size=5)
    assert done.resumed and done.done and done.listed == 25 and done.changed == 25
    lists = [r for r in proxy.requests if "list-type=2" in r.query]
    assert len(lists) == 3 and "start-after=k%2F09" in lists[0].query
    assert await _keys(catalog, mount.id) == keys
    await store.close()


async def test_a_recrawl_writes_only_what_changed(
    meta: MetaStore, proxy: CountingProxy, origin_s3: Any
) -> None:
    keys = [f"k/{i:02d}" for i in range(12)]
    mount, store = await _mounted(meta, proxy, origin_s3, keys)
    catalog = Catalog(meta.engine)
    first = await sync(catalog, mount.id, store, "", page_size=5)
    assert (first.listed, first.changed, first.removed, first.resumed) == (12, 12, 0, False)
    origin_s3.put_object(Bucket=mount.bucket, Key="k/03", Body=b"longer now")
    origin_s3.delete_object(Bucket=mount.bucket, Key="k/07")
    origin_s3.delete_object(Bucket=mount.bucket, Key="k/11")  # the last key: the final range
    origin_s3.put_object(Bucket=mount.bucket, Key="k/05a", Body=b"new")
    again = await sync(catalog, mount.id, store, "", page_size=5)
    assert (again.listed, again.changed, again.removed) == (11, 2, 2)
    want = sorted({*keys, "k/05a"} - {"k/07", "k/11"})
    assert await _keys(catalog, mount.id) == want
    entry = await VersionRows(meta).lookup(mount.id, "k/03")
    assert entry is not None and entry.info.size == len(b"longer now") and not entry.complete
    await store.close()


async def test_a_row_written_after_the_listing_is_kept(
    meta: MetaStore, proxy: CountingProxy, origin_s3: Any
) -> None:
    mount, store = await _mounted(meta, proxy, origin_s3, ["a", "b"])
    now = datetime.now(UTC)
    written = Catalog(meta.engine)
    rows = VersionRows(meta)  # the writes through the gateway: now
    # The crawl listed a minute ago, before those writes reached the catalog.
    crawl = Catalog(meta.engine, clock=lambda: now - timedelta(minutes=1))
    newer = ObjectInfo("a", 5, '"new"', now)
    await rows.record_now(mount.id, "a", newer)
    await rows.record_now(mount.id, "c", ObjectInfo("c", 1, '"just-written"', now))
    await sync(crawl, mount.id, store)
    await written.refresh()
    got = await rows.lookup(mount.id, "a")
    assert got is not None and got.info.etag == '"new"' and got.complete
    assert await _keys(written, mount.id) == ["a", "b", "c"]
    await store.close()


async def test_a_sync_split_by_sub_prefix_lists_them_at_once_and_resumes_each(
    meta: MetaStore, proxy: CountingProxy, origin_s3: Any
) -> None:
    keys = [f"s/{shard:02d}/{i:02d}" for shard in range(6) for i in range(7)]
    mount, store = await _mounted(meta, proxy, origin_s3, ["t/x", *keys])  # t/: not synced
    catalog = Catalog(meta.engine)
    pages = 0

    def stop_midway(p: SyncProgress) -> None:
        nonlocal pages
        pages += 1
        if p.listed >= 15:
            raise Stop

    with pytest.raises(Stop):
        await sync_parallel(
            catalog, mount.id, store, "s/", workers=3, page_size=3, on_progress=stop_midway
        )
    done = await sync_parallel(catalog, mount.id, store, "s/", workers=3, page_size=3)
    assert done.done and done.resumed and done.listed == len(keys)
    await catalog.refresh()
    assert catalog.covers(mount.id, "s/") and not catalog.covers(mount.id, "t/")
    page = await catalog.list_page(mount.id, "s/", None, None, None, 1000)
    assert page is not None and [o.key for o in page.objects] == keys
    # A shard gone from the store is gone from the catalog after a re-crawl, rows and all.
    for i in range(7):
        origin_s3.delete_object(Bucket=mount.bucket, Key=f"s/03/{i:02d}")
    again = await sync_parallel(catalog, mount.id, store, "s/", workers=3, page_size=3)
    assert (again.listed, again.changed, again.removed) == (35, 0, 7)
    page = await catalog.list_page(mount.id, "s/", "/", None, None, 1000)
    assert page is not None and page.common_prefixes == [f"s/{s:02d}/" for s in (0, 1, 2, 4, 5)]
    await store.close()


async def test_a_prefix_with_keys_of_its_own_is_synced_in_one_run(
    meta: MetaStore, proxy: CountingProxy, origin_s3: Any
) -> None:
    keys = ["p/a", "p/b/1", "p/c/1"]
    mount, store = await _mounted(meta, proxy, origin_s3, keys)
    catalog = Catalog(meta.engine)
    done = await sync_parallel(catalog, mount.id, store, "p/", workers=4)
    assert done.done and done.listed == 3
    assert await _keys(catalog, mount.id, "p/") == keys
    await store.close()


async def test_the_lookups_of_concurrent_readers_are_one_query(
    meta: MetaStore, proxy: CountingProxy, origin_s3: Any
) -> None:
    keys = [f"k/{i:02d}" for i in range(40)]
    mount, store = await _mounted(meta, proxy, origin_s3, keys)
    catalog = Catalog(meta.engine)
    await sync(catalog, mount.id, store)
    await catalog.refresh()
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    sa.event.listen(meta.engine.sync_engine, "before_cursor_execute", seen)
    try:
        rows = VersionRows(meta)
        got = await asyncio.gather(*(rows.lookup(mount.id, k) for k in [*keys, "k/none"]))
    finally:
        sa.event.remove(meta.engine.sync_engine, "before_cursor_execute", seen)
    assert [e.info.key for e in got[:-1] if e is not None] == keys and got[-1] is None
    assert len([s for s in statements if "object_versions" in s]) == 1
    await store.close()
