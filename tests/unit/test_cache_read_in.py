"""A block on disk but not in the page cache, asked for by a server that sends files (the
HTTP edge's hits: PageStore.peek_sendable): given at once as a region of its file whose read
into the page cache, and check, runs on a cache-io thread (`reading`); the loop never waits
for the disk. The server sends it once the read is done (gateway/server/sends.py; the edge's
answers: tests/unit/test_server.py, tests/e2e/test_edge_fast.py)."""

from __future__ import annotations

import asyncio
import os

import pytest

from gateway.cache import BlockKey
from gateway.cache.blockfile import Corrupt
from gateway.cache.layout import block_path
from gateway.cache.resident import in_page_cache
from gateway.service import FileRegion
from tests.support.cache import Cache
from tests.support.net import eventually_async
from tests.unit.test_cache_siblings import _fill, _flip

pytestmark = pytest.mark.anyio

MiB = 1 << 20
BIG = os.urandom(MiB)  # sent from its file
SMALL = os.urandom(16 << 10)  # the memory tier's: read into it when in the page cache


async def _filled(root: str, data: bytes = BIG) -> tuple[Cache, BlockKey, str]:
    cache = Cache(root, capacity_bytes=1 << 30, seal_blocks=False, drop_delay=0.0)
    await cache.open()
    bkey = BlockKey(1, "big.bin", '"v1"', 4 * MiB, 0)
    await _fill(cache, bkey, data)
    cache.pages.memory.clear()  # on disk only
    return cache, bkey, block_path(root, 1, bkey.name)


def _out_of_memory(path: str) -> bool:
    """Written back and dropped from the page cache: its next read goes to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return not in_page_cache(fd, 0, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def _opened_as(fd: int) -> str | None:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except FileNotFoundError:
        return None


async def test_a_block_out_of_the_page_cache_is_read_in_on_a_thread_then_sent(
    tmp_path: str,
) -> None:
    cache, bkey, path = await _filled(str(tmp_path))
    try:
        await eventually_async(lambda: _out_of_memory(path), timeout=15)
        found = cache.peek_sendable(bkey, MiB)
        assert isinstance(found, FileRegion) and found.reading is not None
        fd, reading = found.fd, found.reading
        # Closed (the client went) while the thread reads it: the descriptor stays open
        # for the read, and is closed once it is done.
        found.close()
        assert not reading.done() and os.fstat(fd).st_size > MiB
        await reading
        await asyncio.sleep(0)
        assert _opened_as(fd) != path  # closed (the number may be another file's now)
        assert cache.pages.stats.disk_sends == 1 and cache.pages.stats.hits == 1
        # In the page cache now, and checked by that read: sent from its file, unread.
        again = cache.peek_sendable(bkey, MiB)
        assert isinstance(again, FileRegion) and again.reading is None
        assert os.pread(again.fd, MiB, 0) == BIG
        again.close()
        assert cache.pages.stats.disk_sends == 1 and cache.pages.stats.rechecks == 0
    finally:
        await cache.close()


async def test_a_small_block_out_of_the_page_cache_is_read_in_then_enters_the_memory_tier(
    tmp_path: str,
) -> None:
    cache, bkey, path = await _filled(str(tmp_path), SMALL)
    try:
        await eventually_async(lambda: _out_of_memory(path), timeout=15)
        # Its file, read in on a thread, or sent from the page cache if the kernel's read-ahead
        # (which the look with RWF_NOWAIT starts) brought it in meanwhile: not the full path.
        found = cache.peek_sendable(bkey, len(SMALL))
        assert isinstance(found, FileRegion)
        if found.reading is not None:
            await found.reading
        assert os.pread(found.fd, len(SMALL), 0) == SMALL
        found.close()
        again = cache.peek_sendable(bkey, len(SMALL))  # from the page cache, into the tier
        assert isinstance(again, memoryview) and bytes(again) == SMALL
        assert cache.peek(bkey) == SMALL
        assert cache.pages.stats.disk_sends == (found.reading is not None)
    finally:
        await cache.close()


async def test_a_block_damaged_on_disk_fails_its_read_in_and_is_dropped(tmp_path: str) -> None:
    cache, bkey, path = await _filled(str(tmp_path))
    try:
        _flip(path, MiB // 2)
        await eventually_async(lambda: _out_of_memory(path), timeout=15)
        # Checked within the zero-copy window (it was just filled): the read in checks the
        # whole block all the same, as it reads all of it.
        found = cache.peek_sendable(bkey, MiB)
        assert isinstance(found, FileRegion) and found.reading is not None
        with pytest.raises(Corrupt):
            await found.reading
        found.close()
        await eventually_async(lambda: not os.path.exists(path), timeout=15)
        assert cache.pages.stats.corrupt == 1
        assert cache.peek_sendable(bkey, MiB) is None
    finally:
        await cache.close()
