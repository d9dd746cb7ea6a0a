"""Listing from the catalog answers as the origin itself does, page for page: random key sets
(characters that sort apart in UTF-16 and UTF-8, multi-character delimiters) synced from moto
into the catalog on SQLite and on PostgreSQL, then listed both ways with random prefixes,
delimiters, start-after markers and page sizes."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gateway.catalog import Catalog, sync
from gateway.meta import MetaStore, SecretBox
from gateway.stores import ListPage, open_store
from tests.support.origin import MotoServer

# '\uff21' sorts above '😀' in UTF-16 (a surrogate pair, 0xD83D...) and below it in UTF-8.
ALPHABET = ["a", "b", "/", "-", " ", "+", "%", "é", "\uff21", "😀", "\U0010fffd"]
DELIMITERS = [None, "/", "-/", "a", "😀", "/a/"]
_buckets = itertools.count()

keys = st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=7).map("".join)
key_sets = st.sets(keys, max_size=40)


@st.composite
def queries(draw: st.DrawFn, names: set[str]) -> tuple[str, str | None, str | None, int]:
    known = sorted(names)
    anchor = st.sampled_from(known) if known else keys
    prefix = draw(st.one_of(st.just(""), anchor.flatmap(lambda k: st.just(k[: len(k) // 2]))))
    delimiter = draw(st.sampled_from(DELIMITERS))
    start_after = draw(st.one_of(st.none(), anchor, keys))
    max_keys = draw(st.sampled_from([1, 2, 3, 5, 1000]))
    return prefix, delimiter, start_after, max_keys


@pytest.fixture
def meta(database_url: str) -> Iterator[tuple[asyncio.AbstractEventLoop, MetaStore]]:
    """The database on an event loop of the test's own: hypothesis runs each example in it."""
    loop = asyncio.new_event_loop()
    store = MetaStore(database_url, SecretBox([SecretBox.generate_key()]))
    try:
        loop.run_until_complete(store.migrate())
        yield loop, store
    finally:
        loop.run_until_complete(store.close())
        loop.close()


def _origin_pages(
    s3: Any, bucket: str, prefix: str, delimiter: str | None, start_after: str | None, n: int
) -> list[tuple[list[tuple[str, int, str]], list[str], bool]]:
    """The listing as moto itself answers ListObjectsV2, page by page."""
    pages = []
    args: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": n}
    if delimiter:
        args["Delimiter"] = delimiter
    if start_after:
        args["StartAfter"] = start_after
    while True:
        got = s3.list_objects_v2(**args)
        objects = [(o["Key"], o["Size"], o["ETag"]) for o in got.get("Contents", [])]
        prefixes = [p["Prefix"] for p in got.get("CommonPrefixes", [])]
        pages.append((objects, prefixes, bool(got["IsTruncated"])))
        if not got["IsTruncated"]:
            return pages
        args["ContinuationToken"] = got["NextContinuationToken"]
        args.pop("StartAfter", None)


async def _catalog_pages(
    catalog: Catalog, mount_id: int, prefix: str, delimiter: str | None, start_after: str | None,
    n: int,
) -> list[tuple[list[tuple[str, int, str]], list[str], bool]]:  # fmt: skip
    pages = []
    token = None
    while True:
        page = await catalog.list_page(
            mount_id, prefix, delimiter, token, None if token else start_after, n
        )
        assert isinstance(page, ListPage)
        objects = [(o.key, o.size, o.etag) for o in page.objects]
        pages.append((objects, list(page.common_prefixes), page.next_token is not None))
        if page.next_token is None:
            return pages
        token = page.next_token


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(names=key_sets, data=st.data())
@example(names={"a/b", "a/c", "a-/x", "b", "\uff21", "😀"}, data=None)
def test_listing_from_the_catalog_matches_the_origin_page_for_page(
    meta: tuple[asyncio.AbstractEventLoop, MetaStore],
    moto_server: MotoServer,
    origin_s3: Any,
    names: set[str],
    data: Any,
) -> None:
    loop, store = meta
    loop.run_until_complete(_check(store, moto_server, origin_s3, names, data))


async def _check(
    meta: MetaStore, moto_server: MotoServer, origin_s3: Any, names: set[str], data: Any
) -> None:
    bucket = f"catalog-prop-{next(_buckets)}-{meta.dialect[:2]}"
    origin_s3.create_bucket(Bucket=bucket)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: origin_s3.put_object(Bucket=bucket, Key=k, Body=k.encode()), names))
    options = {"endpoint_url": moto_server.url, "access_key": "ak", "secret_key": "sk"}
    mount = await meta.add_mount(bucket, f"s3://{bucket}", {**options, "catalog": "on"})
    store = open_store(mount.uri, options)
    catalog = Catalog(meta.engine)
    try:
        done = await sync(catalog, mount.id, store, "", page_size=7)
        assert done.done and done.listed == len(names)
        await catalog.refresh()
        drawn = [("", "/", None, 2), ("a", "-/", "a-", 1)]
        if data is not None:
            drawn = [data.draw(queries(names)) for _ in range(3)]
        for prefix, delimiter, start_after, n in drawn:
            want = await asyncio.to_thread(
                _origin_pages, origin_s3, bucket, prefix, delimiter, start_after, n
            )
            got = await _catalog_pages(catalog, mount.id, prefix, delimiter, start_after, n)
            assert got == want, (prefix, delimiter, start_after, n)
    finally:
        await store.close()
