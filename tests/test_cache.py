"""The whole-object cache: fills, reads per tier, restart, eviction, single flight, repair."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.cache import (
    CacheEntry,
    CacheKey,
    CacheMiss,
    FillAborted,
    FillSizeError,
    ObjectCache,
)

pytestmark = pytest.mark.anyio

MiB = 1 << 20


def make_cache(
    root: Path,
    *,
    capacity_bytes: int = 64 * MiB,
    max_object_bytes: int = 16 * MiB,
    memory_bytes: int = 0,  # off unless a test is about it, so reads prove the disk path
    **options: Any,
) -> ObjectCache:
    return ObjectCache(
        root,
        capacity_bytes=capacity_bytes,
        max_object_bytes=max_object_bytes,
        memory_bytes=memory_bytes,
        **options,
    )


@pytest.fixture
async def cache(tmp_path: Path) -> AsyncIterator[ObjectCache]:
    cache = make_cache(tmp_path / "cache")
    await cache.open()
    yield cache
    await cache.close()


async def put(cache: ObjectCache, key: CacheKey, data: bytes, chunk: int = 300_000) -> CacheEntry:
    fill = cache.begin_fill(key, len(data))
    assert fill is not None
    async with fill:
        for i in range(0, len(data), chunk):
            await fill.write(data[i : i + chunk])
        return await fill.commit()


def committed_files(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("??/??/*") if p.is_file())


def temp_files(root: Path) -> list[Path]:
    return list((root / "tmp").iterdir())


async def test_fill_then_read_ranges_and_stream(cache: ObjectCache, tmp_path: Path) -> None:
    data = os.urandom(3 * MiB + 12345)  # several write batches, not a multiple of any of them
    key = CacheKey(1, "datasets/a.bin", '"etag-1"')

    entry = await put(cache, key, data)

    assert cache.lookup(key) == entry
    assert entry.size == len(data)
    name = key.name
    assert entry.path == tmp_path / "cache" / name[:2] / name[2:4] / name
    assert entry.path.read_bytes() == data
    for start, end in [(0, len(data)), (0, 1), (MiB - 1, MiB + 1), (len(data) - 7, len(data))]:
        assert await cache.read(entry, start, end) == data[start:end]
    assert await cache.read(entry, 5, 5) == b""
    chunks = [c async for c in cache.stream(entry, 100, len(data) - 100, chunk_size=MiB)]
    assert [len(c) for c in chunks] == [MiB, MiB, MiB, 12345 - 200]
    assert b"".join(chunks) == data[100:-100]
    with pytest.raises(ValueError):
        await cache.read(entry, 0, len(data) + 1)


async def test_stream_survives_eviction_of_its_file(cache: ObjectCache) -> None:
    data = os.urandom(3 * MiB)
    key = CacheKey(1, "big", "e")
    entry = await put(cache, key, data)

    stream = cache.stream(entry, 0, len(data), chunk_size=MiB)
    first = await anext(stream)
    cache.invalidate(key)  # the fd the stream holds keeps the bytes readable
    rest = [c async for c in stream]

    assert first + b"".join(rest) == data
    assert cache.lookup(key) is None


async def test_memory_tier_serves_small_objects_without_the_file(tmp_path: Path) -> None:
    cache = make_cache(tmp_path / "c", memory_bytes=MiB, memory_object_max=64 << 10)
    await cache.open()
    try:
        small, large = os.urandom(4096), os.urandom(100_000)
        small_entry = await put(cache, CacheKey(1, "small", "e"), small)
        large_entry = await put(cache, CacheKey(1, "large", "e"), large)
        assert cache.stats.memory_entries == 1
        assert cache.stats.memory_bytes_used == 4096

        small_entry.path.unlink()  # only the memory tier can answer now
        assert await cache.read(small_entry, 10, 20) == small[10:20]
        assert b"".join([c async for c in cache.stream(small_entry, 0, 4096, 1000)]) == small
        assert cache.stats.memory_hits == 2

        large_entry.path.unlink()  # too large for the memory tier: read from disk, so a miss
        with pytest.raises(CacheMiss):
            await cache.read(large_entry, 0, 10)
    finally:
        await cache.close()


async def test_disk_read_of_a_small_object_promotes_it_to_memory(tmp_path: Path) -> None:
    root = tmp_path / "c"
    cache = make_cache(root, memory_bytes=MiB)
    await cache.open()
    key, data = CacheKey(1, "k", "e"), os.urandom(1000)
    await put(cache, key, data)
    await cache.close()

    cache = make_cache(root, memory_bytes=MiB)
    await cache.open()
    try:
        entry = cache.lookup(key)
        assert entry is not None
        assert cache.stats.memory_entries == 0  # the memory tier does not survive a restart
        assert await cache.read(entry, 1, 3) == data[1:3]
        assert cache.stats.memory_entries == 1
        entry.path.unlink()
        assert await cache.read(entry, 0, 1000) == data
    finally:
        await cache.close()


async def test_restart_keeps_entries(tmp_path: Path) -> None:
    root = tmp_path / "c"
    cache = make_cache(root)
    await cache.open()
    objects = {CacheKey(7, f"k{i}", "e"): os.urandom(1000 * (i + 1)) for i in range(5)}
    for key, data in objects.items():
        await put(cache, key, data)
    await cache.close()

    cache = make_cache(root)
    await cache.open()
    try:
        assert cache.stats.entries == 5
        assert cache.stats.bytes_used == sum(len(d) for d in objects.values())
        for key, data in objects.items():
            entry = cache.lookup(key)
            assert entry is not None
            assert await cache.read(entry, 0, entry.size) == data
    finally:
        await cache.close()


async def test_restart_keeps_the_lru_order_of_hits(tmp_path: Path) -> None:
    root = tmp_path / "c"
    keys = [CacheKey(1, name, "e") for name in "abc"]
    cache = make_cache(root, capacity_bytes=3000, touch_interval=0)
    await cache.open()
    for key in keys:
        await put(cache, key, os.urandom(1000))
    await cache.close()
    for age, key in zip((300, 200, 100), keys, strict=True):  # a oldest, c newest
        path = root / key.name[:2] / key.name[2:4] / key.name
        os.utime(path, (path.stat().st_atime - age, path.stat().st_mtime - age))

    cache = make_cache(root, capacity_bytes=3000, touch_interval=0)
    await cache.open()
    assert cache.lookup(keys[0]) is not None  # a hit: its mtime moves to now
    await cache.close()

    cache = make_cache(root, capacity_bytes=3000, touch_interval=0)
    await cache.open()
    try:
        await put(cache, CacheKey(1, "d", "e"), os.urandom(1000))
        assert cache.lookup(keys[0]) is not None
        assert cache.lookup(keys[1]) is None  # b is the oldest now
        assert cache.lookup(keys[2]) is not None
    finally:
        await cache.close()


async def test_open_removes_leftover_temp_files(tmp_path: Path) -> None:
    root = tmp_path / "c"
    (root / "tmp").mkdir(parents=True)
    (root / "tmp" / "3f2a9c").write_bytes(b"half an object")

    cache = make_cache(root)
    await cache.open()
    try:
        assert temp_files(root) == []
        assert cache.stats.entries == 0
    finally:
        await cache.close()


async def test_short_fill_is_not_committed(cache: ObjectCache, tmp_path: Path) -> None:
    key = CacheKey(1, "k", "e")
    fill = cache.begin_fill(key, 1000)
    assert fill is not None
    waiter = asyncio.ensure_future(cache.wait(key))
    await fill.write(b"x" * 999)

    with pytest.raises(FillSizeError):
        await fill.commit()

    assert await asyncio.wait_for(waiter, 5) is None
    assert_nothing_kept(cache, key, tmp_path / "cache")
    with pytest.raises(FillAborted):
        await fill.commit()


async def test_long_fill_fails_at_the_write_past_the_size(
    cache: ObjectCache, tmp_path: Path
) -> None:
    key = CacheKey(1, "k", "e")
    fill = cache.begin_fill(key, 2 * MiB)
    assert fill is not None
    waiter = asyncio.ensure_future(cache.wait(key))
    await fill.write(b"x" * (2 * MiB - 1))  # a batch reached the temp file already

    with pytest.raises(FillSizeError):
        await fill.write(b"yz")

    assert await asyncio.wait_for(waiter, 5) is None
    assert_nothing_kept(cache, key, tmp_path / "cache")
    with pytest.raises(FillAborted):
        await fill.write(b"more")


def assert_nothing_kept(cache: ObjectCache, key: CacheKey, root: Path) -> None:
    assert cache.lookup(key) is None
    assert committed_files(root) == []
    assert temp_files(root) == []


async def test_large_fill_aborted_midway_leaves_no_temp_file(
    cache: ObjectCache, tmp_path: Path
) -> None:
    fill = cache.begin_fill(CacheKey(1, "k", "e"), 4 * MiB)
    assert fill is not None
    await fill.write(b"x" * (2 * MiB))  # past one batch, so a temp file exists
    assert len(temp_files(tmp_path / "cache")) == 1

    await fill.abort()

    assert temp_files(tmp_path / "cache") == []


async def test_aborted_fill_wakes_waiters_with_none(cache: ObjectCache) -> None:
    key = CacheKey(1, "k", "e")
    fill = cache.begin_fill(key, 10)
    assert fill is not None
    assert cache.begin_fill(key, 10) is None
    waiters = [asyncio.ensure_future(cache.wait(key)) for _ in range(3)]
    await asyncio.sleep(0)

    await fill.write(b"12345")
    await fill.abort(ConnectionError("origin went away"))
    await fill.abort()  # idempotent

    assert await asyncio.wait_for(asyncio.gather(*waiters), 5) == [None, None, None]
    retry = cache.begin_fill(key, 10)  # nothing left behind: the next caller may lead
    assert retry is not None
    await retry.abort()


async def test_cancelled_leader_wakes_waiters_with_none(cache: ObjectCache) -> None:
    key = CacheKey(1, "k", "e")
    started = asyncio.Event()

    async def leader() -> None:
        fill = cache.begin_fill(key, 10)
        assert fill is not None
        async with fill:
            await fill.write(b"12345")
            started.set()
            await asyncio.sleep(3600)  # the client hangs up here

    task = asyncio.ensure_future(leader())
    await started.wait()
    waiter = asyncio.ensure_future(cache.wait(key))
    await asyncio.sleep(0)
    task.cancel()

    assert await asyncio.wait_for(waiter, 5) is None
    assert cache.begin_fill(key, 10) is not None


async def test_leader_cancelled_mid_write_leaves_no_temp_file_or_open_fd(
    cache: ObjectCache, tmp_path: Path
) -> None:
    fds_before = len(os.listdir("/proc/self/fd"))

    async def leader() -> None:
        fill = cache.begin_fill(CacheKey(1, "k", "e"), 4 * MiB)
        assert fill is not None
        async with fill:
            await fill.write(b"x" * (2 * MiB))  # the first batch creates the temp file
            await fill.write(b"x" * (2 * MiB))

    task = asyncio.ensure_future(leader())
    await asyncio.sleep(0)  # the leader now waits on the thread that opens and writes
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert temp_files(tmp_path / "cache") == []
    assert len(os.listdir("/proc/self/fd")) == fds_before


async def test_concurrent_misses_make_one_fill(cache: ObjectCache) -> None:
    key, data = CacheKey(3, "shared", '"v1"'), os.urandom(2 * MiB + 1)
    callers = 10
    arrived = 0
    all_arrived = asyncio.Event()
    leaders: list[int] = []

    async def get(i: int) -> bytes:
        nonlocal arrived
        entry = cache.lookup(key)
        assert entry is None
        fill = cache.begin_fill(key, len(data))
        arrived += 1
        if arrived == callers:
            all_arrived.set()
        if fill is not None:
            leaders.append(i)
            async with fill:
                await fill.write(data[: MiB + 5])
                await all_arrived.wait()
                await fill.write(data[MiB + 5 :])
                entry = await fill.commit()
        else:
            entry = await cache.wait(key)
        assert entry is not None
        return await cache.read(entry, 0, entry.size)

    results = await asyncio.wait_for(asyncio.gather(*(get(i) for i in range(callers))), 10)

    assert len(leaders) == 1
    assert all(r == data for r in results)
    assert cache.stats.entries == 1


async def test_lru_evicts_the_oldest_and_keeps_the_recently_used(tmp_path: Path) -> None:
    root = tmp_path / "c"
    cache = make_cache(root, capacity_bytes=3000, memory_bytes=MiB)
    await cache.open()
    a, b, c, d = (CacheKey(1, name, "e") for name in "abcd")
    for key in (a, b, c):
        await put(cache, key, os.urandom(1000))
    assert cache.lookup(a) is not None  # a is now the most recently used

    await put(cache, d, os.urandom(1000))

    assert [cache.lookup(k) is not None for k in (a, b, c, d)] == [True, False, True, True]
    stats = cache.stats
    assert (stats.entries, stats.bytes_used, stats.evictions) == (3, 3000, 1)
    assert stats.memory_entries == 3  # the evicted object left the memory tier too
    await cache.close()
    assert {p.name for p in committed_files(root)} == {a.name, c.name, d.name}


async def test_free_space_floor_evicts_all_but_the_newest(tmp_path: Path) -> None:
    cache = make_cache(tmp_path / "c", min_free_bytes=1 << 62)  # never met: always short
    await cache.open()
    try:
        first = CacheKey(1, "first", "e")
        await put(cache, first, b"1" * 100)
        entry = await put(cache, CacheKey(1, "second", "e"), b"2" * 100)

        assert cache.lookup(first) is None
        assert cache.stats.entries == 1
        assert await cache.read(entry, 0, 100) == b"2" * 100
    finally:
        await cache.close()


async def test_oversize_objects_are_not_admitted(tmp_path: Path) -> None:
    cache = make_cache(tmp_path / "c", capacity_bytes=5000, max_object_bytes=10_000)
    await cache.open()
    try:
        assert cache.admits(5000)
        assert not cache.admits(5001)  # within max_object_bytes but over the whole capacity
        with pytest.raises(ValueError):
            cache.begin_fill(CacheKey(1, "k", "e"), 5001)
    finally:
        await cache.close()
    cache = make_cache(tmp_path / "c", max_object_bytes=1000)
    assert cache.admits(1000)
    assert not cache.admits(1001)


async def test_file_deleted_behind_the_cache_raises_miss_and_is_forgotten(
    cache: ObjectCache,
) -> None:
    keys = [CacheKey(1, "read", "e"), CacheKey(1, "stream", "e")]
    entries = [await put(cache, key, os.urandom(2 * MiB)) for key in keys]
    for entry in entries:
        entry.path.unlink()

    with pytest.raises(CacheMiss):
        await cache.read(entries[0], 0, 10)
    with pytest.raises(CacheMiss):
        async for _ in cache.stream(entries[1], 0, entries[1].size):
            pass

    assert cache.lookup(keys[0]) is None
    assert cache.lookup(keys[1]) is None
    assert (cache.stats.entries, cache.stats.bytes_used) == (0, 0)
    assert cache.begin_fill(keys[0], 2 * MiB) is not None  # refillable


async def test_a_new_etag_is_a_new_entry(cache: ObjectCache) -> None:
    old, new = CacheKey(1, "k", '"v1"'), CacheKey(1, "k", '"v2"')
    await put(cache, old, b"old bytes")

    assert cache.lookup(new) is None
    entry = await put(cache, new, b"new bytes!")

    assert await cache.read(entry, 0, entry.size) == b"new bytes!"
    old_entry = cache.lookup(old)
    assert old_entry is not None and old_entry.path != entry.path
    stats = cache.stats
    assert (stats.entries, stats.hits, stats.misses) == (2, 1, 1)


def test_key_names_are_unambiguous() -> None:
    names = {
        CacheKey(1, "ab", "c").name,
        CacheKey(1, "a", "bc").name,
        CacheKey(11, "a", "c").name,
        CacheKey(1, "1a", "c").name,
    }
    assert len(names) == 4
    assert CacheKey(1, "ab", "c").name == CacheKey(1, "ab", "c").name
    assert len(CacheKey(1, "ab", "c").name) == 64


async def test_a_write_is_named_by_the_version_the_store_answered(cache: ObjectCache) -> None:
    data = os.urandom(3 * MiB + 5)
    fill = cache.begin_write(len(data))
    for i in range(0, len(data), MiB):
        await fill.write(data[i : i + MiB])
    assert cache.lookup(CacheKey(1, "k", '"etag"')) is None
    entry = await cache.commit_write(fill, CacheKey(1, "k", '"etag"'))
    assert cache.lookup(CacheKey(1, "k", '"etag"')) == entry
    assert await cache.read(entry, 0, len(data)) == data


async def test_an_aborted_write_leaves_nothing(cache: ObjectCache, tmp_path: Path) -> None:
    fill = cache.begin_write(2 * MiB)
    await fill.write(b"x" * (MiB + 1))
    await fill.abort()
    assert cache.stats.entries == 0
    assert not any((tmp_path / "cache").rglob("*/*/*"))
    with pytest.raises(FillAborted):
        await cache.commit_write(fill, CacheKey(1, "k", '"e"'))
