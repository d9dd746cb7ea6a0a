"""The page store on its own: blocks on real disk, fills from async sources, several processes
sharing one root, crashes (SIGKILL) mid-fill and their leftovers, damaged files, versions
invalidated while read, and what a restart knows."""

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
from awscrt.checksums import crc32c

from gateway.cache import BlockKey, FillFailed
from gateway.cache.layout import (
    INFLIGHT_DIR,
    PIECE,
    TRAILER_SIZE,
    block_path,
    file_size,
    inflight_path,
    retired_path,
    trailer,
)
from gateway.cache.pages import key_name
from tests.support.cache import Cache
from tests.support.net import eventually_async

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
        self.skips: list[int] = []

    def __call__(self, skip: int = 0) -> AsyncIterator[bytes]:
        self.opened += 1
        self.skips.append(skip)
        return self._gen(skip)

    async def _gen(self, skip: int) -> AsyncIterator[bytes]:
        for pos in range(skip, len(self.data), self.chunk):
            if pos == self.fail_after:
                raise OSError("store went away")
            if pos == self.hold_after and self.gate is not None:
                await self.gate.wait()
            yield self.data[pos : pos + self.chunk]
            await asyncio.sleep(0)


Fetch = Callable[[int], AsyncIterator[bytes]]


async def _read(
    pages: Cache, bkey: BlockKey, length: int, fetch: Fetch, start: int = 0, end: int = -1
) -> bytes:
    end = length if end < 0 else end
    out = bytearray()
    async with aclosing(pages.read(bkey, length, start, end, fetch)) as chunks:
        async for chunk in chunks:
            out += chunk
    return bytes(out)


def _store(root: Path, **kw: object) -> Cache:
    kw.setdefault("capacity_bytes", 1 << 30)
    # These tests damage block files through the file system, which a sealed (fs-verity) file
    # refuses where tmp has it; sealing is tests/e2e/test_sealed_blocks.py's.
    kw.setdefault("seal_blocks", False)
    kw.setdefault("janitor_interval", 0.05)
    kw.setdefault("drop_delay", 0.0)
    return Cache(root, **kw)  # type: ignore[arg-type]


@pytest.fixture
async def pages(tmp_path: Path) -> AsyncIterator[Cache]:
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
    assert os.path.getsize(path) == file_size(len(data))
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


async def test_first_bytes_reach_the_reader_before_the_block_is_complete(pages: Cache) -> None:
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


async def test_concurrent_readers_of_a_missing_block_make_one_fetch(pages: Cache) -> None:
    data = _data(MiB + 17)
    source = Source(data)
    source.gate, source.hold_after = asyncio.Event(), 256 << 10
    bkey = BlockKey(1, "k", "e", 4 * MiB, 0)
    ranges = [(0, len(data)), (100, 200), (300 << 10, len(data)), (0, 1)] * 5
    readers = [asyncio.create_task(_read(pages, bkey, len(data), source, s, e)) for s, e in ranges]
    await eventually_async(lambda: pages.stats.misses == len(ranges))  # all in the one fill
    source.gate.set()
    results = await asyncio.gather(*readers)
    for (s, e), got in zip(ranges, results, strict=True):
        assert got == data[s:e]
    assert source.opened == 1
    assert pages.stats.joins >= 1
    await pages.settle()


async def test_a_failed_fill_wakes_every_reader_and_the_next_read_retries(pages: Cache) -> None:
    data = _data(MiB)
    source = Source(data)
    source.fail_after = 512 << 10
    # Held until all four readers are in the one fill: a reader whose look at the disk returned
    # after the fill had failed would rightly start a fill of its own (CI saw 2 opens).
    source.gate, source.hold_after = asyncio.Event(), 256 << 10
    bkey = BlockKey(1, "k", "e", 4 * MiB, 0)
    readers = [asyncio.create_task(_read(pages, bkey, len(data), source)) for _ in range(4)]
    await eventually_async(lambda: pages.stats.misses == len(readers))
    source.gate.set()
    results = await asyncio.gather(*readers, return_exceptions=True)
    assert all(isinstance(r, OSError) for r in results), results
    assert source.opened == 1
    await pages.settle()
    assert os.listdir(os.path.join(pages.root, INFLIGHT_DIR)) == []
    source.fail_after = -1
    assert await _read(pages, bkey, len(data), source) == data
    assert source.opened == 2


async def test_a_short_store_answer_is_not_kept(pages: Cache) -> None:
    bkey = BlockKey(1, "k", "e", 4 * MiB, 0)
    short = Source(_data(1000))
    with pytest.raises(FillFailed):
        await _read(pages, bkey, 2000, short)
    await pages.settle()
    assert not os.path.exists(block_path(pages.root, 1, bkey.name))


@pytest.mark.parametrize("damage", ["flip", "truncate", "trailer", "table"])
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
    elif damage == "trailer":
        raw[len(data)] ^= 1  # the magic
    else:
        raw[len(data) + TRAILER_SIZE] ^= 1  # the checksum of the first piece
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


async def test_a_fill_that_finds_the_block_committed_but_damaged_fetches_it(
    pages: Cache,
) -> None:
    """A read-ahead claims a block another process committed, and the block is gone or
    damaged when read: the fill fetches it for whoever joined, never "vanished"."""
    data = _data(MiB)
    bkey = BlockKey(1, "k", "e", 4 * MiB, 0)
    path = Path(block_path(pages.root, 1, bkey.name))
    path.parent.mkdir(parents=True)
    path.write_bytes(b"x" * MiB + trailer(MiB, 0, 0))  # a wrong checksum
    source = Source(data)
    assert pages.prefetch(bkey, MiB, source)
    assert await _read(pages, bkey, MiB, source) == data  # joins the read-ahead's fill
    assert source.opened == 1 and pages.stats.corrupt == 1
    await pages.settle()
    assert await pages.read_hit(bkey, MiB, 0, MiB) == data


async def test_write_through_blocks_are_hits_and_invalidation_drops_them(pages: Cache) -> None:
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

    async def all_dropped() -> bool:  # from memory at once, from disk in the background
        keys = [BlockKey(1, "k", '"etag"', 4 * MiB, index) for index in range(3)]
        return all([await pages.read_hit(bkey, 1, 0, 1) is None for bkey in keys])

    await eventually_async(all_dropped)


async def test_an_aborted_write_leaves_nothing(pages: Cache) -> None:
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


async def test_a_read_ahead_fill_that_failed_and_ended_still_tells_its_error(
    pages: Cache,
) -> None:
    # A reader reads blocks ahead and, before its first byte goes out, awaits their first
    # bytes: a store that refused the version (overwritten) must be heard even when that
    # answer came, and the fill ended, while the reader was still reading its first block.
    class Changed(Exception):
        pass

    async def refused(skip: int, stop: int | None = None) -> AsyncIterator[bytes]:
        raise Changed("the store has another version now")
        yield b""  # pragma: no cover - an async generator

    bkey = BlockKey(1, "k", "e", MiB, 1)
    arrival = pages.ahead(bkey, MiB, refused)
    assert arrival is not None
    await pages.settle()  # the fill ended and left this process's fills
    assert not pages.filling(bkey)
    assert isinstance(await arrival.started(), Changed)
    # A block in flight already is joined, not fetched again; one in memory needs no wait.
    source = Source(_data(MiB))
    source.gate, source.hold_after = asyncio.Event(), 0
    first = pages.ahead(bkey, MiB, source)
    assert first is not None and pages.ahead(bkey, MiB, source) is first
    source.gate.set()
    assert await first.started() is None
    await pages.settle()
    assert source.opened == 1


# -- several processes on one root --------------------------------------------------------------


def _worker(root: str, fetch_log: str, barrier: Any, out: str) -> None:
    """One process of a node: read block 0 of an object whose store is slow."""

    async def main() -> None:
        store = Cache(root, capacity_bytes=1 << 30, janitor_interval=0.05)
        await store.open()
        data = _data(3 * MiB)

        async def slow(skip: int) -> AsyncIterator[bytes]:
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


_STALLING_FILLER = """
import asyncio, sys
from gateway.cache import BlockKey, Fills, PageStore

async def main():
    pages = PageStore(sys.argv[1], capacity_bytes=1 << 30, janitor=False)
    await pages.open()
    store = Fills(pages)
    async def stalls(skip):
        yield sys.argv[3].encode() * int(sys.argv[2])
        print("sent", flush=True)
        await asyncio.sleep(3600)
    async for _ in store.read(BlockKey(1, "k", "e", 4 << 20, 0), 2 << 20, 0, 2 << 20, stalls):
        pass

asyncio.run(main())
"""


async def _stalling_filler(root: Path, piece: int, byte: str) -> asyncio.subprocess.Process:
    """A process filling a 2 MiB block 0 of (1, "k", "e") whose store sends `piece` bytes of
    `byte` and then stalls: returned once they are sent."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _STALLING_FILLER, str(root), str(piece), byte,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        assert await asyncio.wait_for(proc.stdout.readline(), 30) == b"sent\n"
    except BaseException:
        proc.kill()
        await proc.wait()
        raise
    return proc


async def test_a_follower_whose_filler_is_killed_fetches_the_rest_itself(tmp_path: Path) -> None:
    root = tmp_path / "c"
    proc = await _stalling_filler(root, MiB, "x")  # half the block, then stalls
    bkey = BlockKey(1, "k", "e", 4 * MiB, 0)
    # A reader in another process follows the live fill...
    store = _store(root)
    await store.open()
    try:
        data = b"x" * (2 * MiB)  # the bytes the killed process was filling
        source = Source(data)
        follower = asyncio.create_task(_read(store, bkey, len(data), source))
        await eventually_async(lambda: store.stats.misses == 1)  # it waits on the live fill
        assert not follower.done() and source.opened == 0
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        # ...and when its filler dies, gets the rest from the store, never half a block.
        assert await asyncio.wait_for(follower, 10) == data
        assert source.skips == [MiB]
        assert await store.read_hit(bkey, len(data), 0, 10) is None  # not kept
        assert await _read(store, bkey, len(data), source) == data
        assert source.skips == [MiB, 0]
        await store.settle()
        assert await store.read_hit(bkey, len(data), 0, 10) == data[:10]
        assert os.listdir(root / INFLIGHT_DIR) == []
    finally:
        await store.close()


async def test_a_follower_gets_the_first_bytes_of_a_fill_whose_store_stalls(
    tmp_path: Path,
) -> None:
    # A reader in another worker waits for a block's first bytes before it answers (they
    # confirm the version): the filler puts them in its file at once, not after a batch.
    root = tmp_path / "c"
    proc = await _stalling_filler(root, 64 << 10, "y")
    store = _store(root)
    try:
        await store.open()
        bkey = BlockKey(1, "k", "e", 4 * MiB, 0)
        source = Source(b"y" * (2 * MiB))
        chunks = store.read(bkey, 2 * MiB, 0, 2 * MiB, source)
        first = await asyncio.wait_for(anext(chunks), 30)
        assert first == b"y" * len(first) and 0 < len(first) <= 64 << 10
        assert source.opened == 0  # followed, not fetched again
        await chunks.aclose()
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
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


# -- checks of every read -----------------------------------------------------------------------


def flip(path: str, at: int) -> None:
    """Flip one bit of a file in place (same inode, as a bad sector would)."""
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 1]))


async def test_a_read_checks_the_pieces_it_reads_and_drops_a_damaged_block(
    pages: Cache,
) -> None:
    data = _data(2 * MiB)
    source = Source(data)
    bkey = BlockKey(1, "k", "e", 4 * MiB, 0)
    await _read(pages, bkey, len(data), source)
    await pages.settle()
    assert await pages.read_hit(bkey, len(data), 0, len(data)) == data  # read and checked once
    path = block_path(pages.root, 1, bkey.name)
    at = 5 * PIECE + 100
    flip(path, at)  # in place, as a bad sector would be
    # A range of other pieces is served: its own checksums hold.
    assert await pages.read_hit(bkey, len(data), 0, 5 * PIECE) == data[: 5 * PIECE]
    assert pages.stats.corrupt == 0
    # Any read of the damaged piece finds it: the block is dropped, never served.
    assert await pages.read_hit(bkey, len(data), at - 10, at + 10) is None
    assert pages.stats.corrupt == 1 and not os.path.exists(path)
    assert await _read(pages, bkey, len(data), source, at - 10, at + 10) == data[at - 10 : at + 10]
    await pages.settle()
    flip(path, at)
    assert await pages.read_hit(bkey, len(data), 0, len(data)) is None  # whole: the block's CRC
    assert pages.stats.corrupt == 2


async def test_blocks_written_before_the_piece_table_are_read_and_checked(
    pages: Cache,
) -> None:
    data = _data(MiB + 3)
    bkey = BlockKey(1, "old", "e", 4 * MiB, 0)
    path = Path(block_path(pages.root, 1, bkey.name))
    path.parent.mkdir(parents=True)
    path.write_bytes(data + trailer(len(data), crc32c(data), 0))
    assert await pages.read_hit(bkey, len(data), 0, len(data)) == data
    assert await pages.read_hit(bkey, len(data), 70_000, 70_010) == data[70_000:70_010]
    raw = bytearray(path.read_bytes())
    raw[MiB] ^= 1
    path.write_bytes(bytes(raw))
    assert await pages.read_hit(bkey, len(data), 10, 20) is None  # the whole block is checked
    assert pages.stats.corrupt == 1


# -- versions read while they are invalidated ----------------------------------------------------


class Gone(Source):
    """The store after an overwrite: the old version's bytes are no longer there."""

    async def _gen(self, skip: int) -> AsyncIterator[bytes]:
        raise OSError("412: the version is gone")
        yield b""


async def test_a_retired_version_is_read_by_readers_under_way_not_by_new_ones(
    pages: Cache,
) -> None:
    data = _data(3 * MiB)
    size = MiB
    keys = [BlockKey(1, "k", '"v1"', size, i) for i in range(3)]
    for i, bkey in enumerate(keys):
        await _read(pages, bkey, size, Source(data[i * size : (i + 1) * size]))
    await pages.settle()
    retired = [retired_path(pages.root, k.name) for k in keys]
    version = keys[0].version
    pages.hold(version)  # two readers have begun on it
    pages.hold(version)
    pages.invalidate(1, "k", '"v1"', len(data), size)  # an overwrite through the gateway
    pages.release(version)
    await pages.settle()  # the blocks moved to retired/
    # A new read does not find it (it would fetch the new version); a reader under way does.
    gone = Gone(b"")
    with pytest.raises(OSError, match="412"):
        await _read(pages, keys[1], size, gone)
    async with aclosing(pages.read(keys[2], size, 0, size, gone, retired_ok=True)) as chunks:
        assert b"".join([c async for c in chunks]) == data[2 * size :]
    assert all(os.path.exists(p) for p in retired)
    pages.release(version)  # the last reader is done: its blocks go
    deadline = time.monotonic() + 10
    while any(os.path.exists(p) for p in retired):
        assert time.monotonic() < deadline, "the retired blocks stayed"
        await asyncio.sleep(0.01)
    assert not await pages.cached_version(1, "k")


async def test_a_version_retired_by_another_process_is_read_by_readers_under_way(
    tmp_path: Path,
) -> None:
    """Readers in other processes, which no hold of this one protects, get `drop_delay` to
    finish; a process that closes removes what it retired."""
    store = _store(tmp_path / "c", drop_delay=3600.0)
    await store.open()
    data = _data(MiB)
    bkey = BlockKey(1, "k", '"v1"', MiB, 0)
    try:
        await _read(store, bkey, MiB, Source(data))
        await store.settle()
        store.invalidate(1, "k", '"v1"', MiB, MiB)
        other = _store(tmp_path / "c", janitor=False)  # as another worker would read it
        await other.open()
        try:
            await store.settle()  # the blocks moved to retired/
            assert await other.read_hit(bkey, MiB, 0, MiB) is None
            reader = other.read(bkey, MiB, 0, MiB, Gone(b""), retired_ok=True)
            async with aclosing(reader) as chunks:
                assert b"".join([c async for c in chunks]) == data
        finally:
            await other.close()
        assert os.path.exists(retired_path(store.root, bkey.name))
    finally:
        await store.close()
    assert not os.path.exists(retired_path(str(tmp_path / "c"), bkey.name))


# -- the cached version of a key, across restarts ----------------------------------------------


async def test_the_cached_version_of_a_key_is_known_after_a_restart(tmp_path: Path) -> None:
    root = tmp_path / "c"
    store = _store(root)
    await store.open()
    try:
        assert not await store.cached_version(1, "k")
        await _read(store, BlockKey(1, "k", '"v1"', MiB, 1), 10, Source(_data(10)))  # not block 0
        await store.settle()
        assert not await store.cached_version(1, "k")
        writer = store.begin_write(1, MiB, 5, pinned=False)
        await writer.write(b"hello")
        await writer.commit("written", '"w"')
        block0 = BlockKey(1, "k", '"v1"', MiB, 0)
        await _read(store, block0, 10, Source(_data(10)))
        await store.settle()
    finally:
        await store.close()
    again = _store(root)
    await again.open()
    try:
        assert await again.cached_version(1, "k")
        assert await again.cached_version(1, "written")
        assert not await again.cached_version(2, "k")
        os.unlink(block_path(again.root, 1, block0.name))  # evicted, say
        assert not await again.cached_version(1, "k")
        assert not list((root / "keys" / "1").rglob(key_name(1, "k")))  # the record went too
    finally:
        await again.close()


# -- what dead processes leave -------------------------------------------------------------------

_LEFTOVERS_SCRIPT = """
import sys, time
from gateway.cache import blockfile
root, name = sys.argv[1], sys.argv[2]
lock_fd, lock = blockfile.spool_lock(root)
blockfile.spool(lock, 0, b"w" * 100_000, 0)
how, fd = blockfile.claim(root, 1, name)
assert how == blockfile.CLAIMED
blockfile.write_all(fd, b"f" * 100_000)
print(lock, flush=True)
time.sleep(3600)
"""


async def test_sweeps_remove_what_dead_processes_left_and_nothing_of_live_ones(
    tmp_path: Path,
) -> None:
    root = tmp_path / "c"
    store = _store(root, sweep_interval=0.05)
    await store.open()
    procs = []
    live: set[str] = set()
    try:
        for name in ("a" * 64, "b" * 64):  # one to live, one to be killed
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", _LEFTOVERS_SCRIPT, str(root), name,
                stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            assert proc.stdout is not None
            lock = os.path.basename((await asyncio.wait_for(proc.stdout.readline(), 30)).strip())
            procs.append(proc)
            if not live:
                live = {name, lock.decode(), f"{lock.decode()}.0"}
        inflight = root / INFLIGHT_DIR
        assert len(list(inflight.iterdir())) == 6  # each: a fill, a spool lock and its block
        procs[1].send_signal(signal.SIGKILL)
        await procs[1].wait()
        deadline = time.monotonic() + 10
        while {p.name for p in inflight.iterdir()} != live:
            assert time.monotonic() < deadline, sorted(p.name for p in inflight.iterdir())
            await asyncio.sleep(0.02)
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        await store.close()


async def test_a_waiter_on_any_fill_wakes_when_one_ends(pages: Cache) -> None:
    await pages.any_ended()  # none in flight: at once
    data = _data(MiB)
    source = Source(data)
    source.gate, source.hold_after = asyncio.Event(), 64 << 10
    chunks = pages.read(BlockKey(1, "k", "e", 4 * MiB, 0), MiB, 0, MiB, source)
    first = await asyncio.wait_for(chunks.__anext__(), 5)  # the fill is under way
    assert pages.in_flight == 1
    waiter = asyncio.create_task(pages.any_ended())
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiter.done()  # the fill is held after its first chunk
    source.gate.set()
    await asyncio.wait_for(waiter, 5)
    assert first + b"".join([c async for c in chunks]) == data
