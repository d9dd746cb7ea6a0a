"""The page store on its own: blocks on real disk, fills from async sources, several processes
sharing one root, crashes (SIGKILL) mid-fill, damaged files."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest

from gateway.cache import BlockKey, FillFailed, PageStore
from gateway.cache.layout import INFLIGHT_DIR, TRAILER_SIZE, block_path, inflight_path

pytestmark = pytest.mark.anyio

MiB = 1 << 20


def _data(n: int, seed: int = 1) -> bytes:
    pattern = bytes((seed * 31 + i * 7) % 251 for i in range(4096))
    return (pattern * (n // len(pattern) + 1))[:n]


class Source:
    """An async byte source standing in for a store's ranged read: counts how often it is
    opened, can hold back after a given byte, and can fail."""

    def __init__(self, data: bytes, chunk: int = 64 << 10) -> None:
        self.data = data
        self.chunk = chunk
        self.opened = 0
        self.gate: asyncio.Event | None = None
        self.hold_after = -1
        self.fail_after = -1

    def __call__(self) -> AsyncIterator[bytes]:
        self.opened += 1
        return self._gen()

    async def _gen(self) -> AsyncIterator[bytes]:
        for pos in range(0, len(self.data), self.chunk):
            if pos == self.fail_after:
                raise OSError("store went away")
            if pos == self.hold_after and self.gate is not None:
                await self.gate.wait()
            yield self.data[pos : pos + self.chunk]
            await asyncio.sleep(0)


Fetch = Callable[[], AsyncIterator[bytes]]


async def _read(
    pages: PageStore, bkey: BlockKey, length: int, fetch: Fetch, start: int = 0, end: int = -1
) -> bytes:
    end = length if end < 0 else end
    out = bytearray()
    async with aclosing(pages.read(bkey, length, start, end, fetch)) as chunks:
        async for chunk in chunks:
            out += chunk
    return bytes(out)


def _store(root: Path, **kw: object) -> PageStore:
    kw.setdefault("capacity_bytes", 1 << 30)
    kw.setdefault("janitor_interval", 0.05)
    return PageStore(root, **kw)  # type: ignore[arg-type]


@pytest.fixture
async def pages(tmp_path: Path) -> AsyncIterator[PageStore]:
    store = _store(tmp_path / "cache")
    await store.open()
    yield store
    await store.close()


async def test_miss_fills_then_hits_from_disk_after_restart(tmp_path: Path) -> None:
    data = _data(3 * MiB + 5)
    source = Source(data)
    bkey = BlockKey(1, "big.bin", '"v1"', 4 * MiB, 0)
    store = _store(tmp_path / "c")
    await store.open()
    assert await _read(store, bkey, len(data), source) == data
    assert source.opened == 1
    await store.settle()
    path = block_path(store.root, 1, bkey.name)
    assert os.path.getsize(path) == len(data) + TRAILER_SIZE
    await store.close()

    again = _store(tmp_path / "c")
    await again.open()
    try:
        assert await again.read_hit(bkey, len(data), 1000, 2000) == data[1000:2000]
        assert await _read(again, bkey, len(data), source, 5, MiB) == data[5:MiB]
        assert source.opened == 1
        assert again.stats.hits == 2 and again.stats.misses == 0
    finally:
        await again.close()


async def test_first_bytes_reach_the_reader_before_the_block_is_complete(pages: PageStore) -> None:
    data = _data(2 * MiB)
    source = Source(data)
    source.gate, source.hold_after = asyncio.Event(), MiB
    bkey = BlockKey(1, "k", "e", 4 * MiB, 0)
    chunks = pages.read(bkey, len(data), 0, len(data), source)
    first = await asyncio.wait_for(chunks.__anext__(), 5)
    assert first == data[: len(first)]
    assert not os.path.exists(block_path(pages.root, 1, bkey.name))  # not committed yet
    source.gate.set()
    rest = b"".join([c async for c in chunks])
    assert first + rest == data


async def test_concurrent_readers_of_a_missing_block_make_one_fetch(pages: PageStore) -> None:
    data = _data(MiB + 17)
    source = Source(data)
    source.gate, source.hold_after = asyncio.Event(), 256 << 10
    bkey = BlockKey(1, "k", "e", 4 * MiB, 0)
    ranges = [(0, len(data)), (100, 200), (300 << 10, len(data)), (0, 1)] * 5
    readers = [asyncio.create_task(_read(pages, bkey, len(data), source, s, e)) for s, e in ranges]
    await asyncio.sleep(0.1)
    source.gate.set()
    results = await asyncio.gather(*readers)
    for (s, e), got in zip(ranges, results, strict=True):
        assert got == data[s:e]
    assert source.opened == 1
    assert pages.stats.joins >= 1
    await pages.settle()


async def test_a_failed_fill_wakes_every_reader_and_the_next_read_retries(pages: PageStore) -> None:
    data = _data(MiB)
    source = Source(data)
    source.fail_after = 512 << 10
    bkey = BlockKey(1, "k", "e", 4 * MiB, 0)
    readers = [asyncio.create_task(_read(pages, bkey, len(data), source)) for _ in range(4)]
    results = await asyncio.gather(*readers, return_exceptions=True)
    assert all(isinstance(r, OSError) for r in results), results
    assert source.opened == 1
    await pages.settle()
    assert os.listdir(os.path.join(pages.root, INFLIGHT_DIR)) == []
    source.fail_after = -1
    assert await _read(pages, bkey, len(data), source) == data
    assert source.opened == 2


async def test_a_short_store_answer_is_not_kept(pages: PageStore) -> None:
    bkey = BlockKey(1, "k", "e", 4 * MiB, 0)
    short = Source(_data(1000))
    with pytest.raises(FillFailed):
        await _read(pages, bkey, 2000, short)
    await pages.settle()
    assert not os.path.exists(block_path(pages.root, 1, bkey.name))


@pytest.mark.parametrize("damage", ["flip", "truncate", "trailer"])
async def test_a_damaged_block_is_dropped_and_refetched(tmp_path: Path, damage: str) -> None:
    data = _data(MiB)
    source = Source(data)
    bkey = BlockKey(1, "k", "e", 4 * MiB, 0)
    store = _store(tmp_path / "c")
    await store.open()
    await _read(store, bkey, len(data), source)
    await store.settle()
    await store.close()
    path = block_path(str(tmp_path / "c"), 1, bkey.name)
    raw = bytearray(Path(path).read_bytes())
    if damage == "flip":
        raw[12345] ^= 0x40
    elif damage == "truncate":
        raw = raw[: len(raw) // 2]
    else:
        raw[-TRAILER_SIZE] ^= 1  # the magic
    Path(path).write_bytes(bytes(raw))

    store = _store(tmp_path / "c")  # a new process has verified nothing yet
    await store.open()
    try:
        assert await store.read_hit(bkey, len(data), 10, 20) is None
        assert store.stats.corrupt == 1
        assert not os.path.exists(path)
        assert await _read(store, bkey, len(data), source) == data
        assert source.opened == 2
        await store.settle()
        assert Path(path).read_bytes()[: len(data)] == data
    finally:
        await store.close()


async def test_write_through_blocks_are_hits_and_invalidation_drops_them(pages: PageStore) -> None:
    data = _data(9 * MiB + 3)
    writer = pages.begin_write(1, 4 * MiB, len(data), pinned=False)
    for pos in range(0, len(data), 700_001):
        await writer.write(data[pos : pos + 700_001])
    await writer.commit("k", '"etag"')
    for index in range(3):
        bkey = BlockKey(1, "k", '"etag"', 4 * MiB, index)
        length = min(4 * MiB, len(data) - index * 4 * MiB)
        got = await pages.read_hit(bkey, length, 0, length)
        assert got == data[index * 4 * MiB : index * 4 * MiB + length]
    pages.invalidate(1, "k", '"etag"', len(data), 4 * MiB)
    await asyncio.sleep(0.2)
    for index in range(3):
        bkey = BlockKey(1, "k", '"etag"', 4 * MiB, index)
        assert await pages.read_hit(bkey, 1, 0, 1) is None


async def test_an_aborted_write_leaves_nothing(pages: PageStore) -> None:
    writer = pages.begin_write(1, MiB, 3 * MiB, pinned=False)
    await writer.write(_data(2 * MiB + 5))
    await writer.abort()
    assert os.listdir(os.path.join(pages.root, INFLIGHT_DIR)) == []
    with pytest.raises(FillFailed):
        await pages.begin_write(1, MiB, 10, pinned=False).commit("k", "e")


async def test_prefetch_fills_in_the_background_within_its_slots(tmp_path: Path) -> None:
    store = _store(tmp_path / "c", fill_concurrency=2)
    await store.open()
    try:
        sources = [Source(_data(MiB, i)) for i in range(4)]
        for s in sources:
            s.gate, s.hold_after = asyncio.Event(), 0
        keys = [BlockKey(1, "k", "e", MiB, i) for i in range(4)]
        started = [store.prefetch(k, MiB, s) for k, s in zip(keys, sources, strict=True)]
        assert started == [True, True, False, False]
        for s in sources:
            s.gate.set()
        await store.settle()
        assert await store.read_hit(keys[1], MiB, 0, MiB) == _data(MiB, 1)
        assert await store.read_hit(keys[2], MiB, 0, MiB) is None
    finally:
        await store.close()


# -- several processes on one root --------------------------------------------------------------


def _worker(root: str, fetch_log: str, barrier: Any, out: str) -> None:
    """One process of a node: read block 0 of an object whose store is slow."""

    async def main() -> None:
        store = PageStore(root, capacity_bytes=1 << 30, janitor_interval=0.05)
        await store.open()
        data = _data(3 * MiB)

        async def slow() -> AsyncIterator[bytes]:
            with open(fetch_log, "a") as log:  # noqa: ASYNC230 - a test's one line
                log.write(f"{os.getpid()}\n")
            for pos in range(0, len(data), 256 << 10):
                await asyncio.sleep(0.02)
                yield data[pos : pos + (256 << 10)]

        bkey = BlockKey(7, "shared", "v", 4 * MiB, 0)
        barrier.wait()
        got = await _read(store, bkey, len(data), slow)
        Path(out).write_bytes(b"ok" if got == data else b"bad")
        await store.close()

    asyncio.run(main())


def test_worker_processes_share_one_fill(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    root, fetch_log = str(tmp_path / "c"), str(tmp_path / "fetches")
    barrier = ctx.Barrier(4)
    procs = [
        ctx.Process(target=_worker, args=(root, fetch_log, barrier, str(tmp_path / f"out{i}")))
        for i in range(4)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert [Path(tmp_path / f"out{i}").read_bytes() for i in range(4)] == [b"ok"] * 4
    assert len(Path(fetch_log).read_text().split()) == 1


_CRASH_SCRIPT = """
import asyncio, os, sys
from gateway.cache import BlockKey, PageStore

async def main():
    store = PageStore(sys.argv[1], capacity_bytes=1 << 30, janitor=False)
    await store.open()
    async def stalls():
        yield b"x" * (1 << 20)
        print("half", flush=True)
        await asyncio.sleep(3600)
    async for _ in store.read(BlockKey(1, "k", "e", 4 << 20, 0), 2 << 20, 0, 2 << 20, stalls):
        pass

asyncio.run(main())
"""


async def test_a_fill_killed_mid_block_leaves_no_block_and_is_retried(tmp_path: Path) -> None:
    root = tmp_path / "c"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CRASH_SCRIPT, str(root), stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    assert await asyncio.wait_for(proc.stdout.readline(), 30) == b"half\n"
    bkey = BlockKey(1, "k", "e", 4 * MiB, 0)
    # A reader in another process follows the live fill...
    store = _store(root)
    await store.open()
    try:
        data = _data(2 * MiB)
        source = Source(data)
        follower = asyncio.create_task(_read(store, bkey, len(data), source))
        await asyncio.sleep(0.3)
        assert not follower.done() and source.opened == 0
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        # ...and when its filler dies, fails cleanly rather than serving half a block.
        with pytest.raises(FillFailed):
            await asyncio.wait_for(follower, 10)
        assert await store.read_hit(bkey, len(data), 0, 10) is None
        assert await _read(store, bkey, len(data), source) == data
        assert source.opened == 1
    finally:
        await store.close()


async def test_leftovers_of_a_crash_are_cleaned_at_open(tmp_path: Path) -> None:
    root = tmp_path / "c"
    (root / INFLIGHT_DIR).mkdir(parents=True)
    name = BlockKey(1, "k", "e", MiB, 0).name
    Path(inflight_path(str(root), name)).write_bytes(b"torn")  # nobody holds its lock
    old = root / INFLIGHT_DIR / ".private.w"
    old.write_bytes(b"spooled")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    store = _store(root)
    await store.open()
    try:
        assert os.listdir(root / INFLIGHT_DIR) == []
    finally:
        await store.close()
