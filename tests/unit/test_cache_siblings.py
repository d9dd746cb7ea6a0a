"""A block one process of a node filled is answered without a wait by its siblings: two page
stores over one root, as two workers of a node hold them. Before, a process answered from
disk on the event loop (PageStore.peek_disk, peek_sendable: the HTTP edge's hits), or sent
from its file (region: the full path's ranges and large objects), only the blocks it had
filled or read itself, so a warm epoch at two workers went the full path for
about half of its objects (loadtest epochs). A sibling's block is checked before its bytes
are given, as every first read from disk is: a damaged one is never given. Each store here
keeps its own table of checks (as processes that share none: a node restarted, or before
the workers shared theirs); test_cache_node_checks.py is a node's workers sharing one."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest

from gateway.cache import BlockKey
from gateway.cache.layout import block_path
from gateway.service import FileRegion
from tests.support.cache import Cache

pytestmark = pytest.mark.anyio

MiB = 1 << 20
SMALL = os.urandom(100 << 10)  # taken by the memory tier
BIG = os.urandom(MiB)  # sent from its file by a server that sends files


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _fill(cache: Cache, bkey: BlockKey, data: bytes) -> None:
    out = bytearray()
    async for chunk in cache.read(bkey, len(data), 0, len(data), lambda skip: _one(data[skip:])):
        out += chunk
    assert bytes(out) == data
    await cache.settle()


def _stores(root: str) -> tuple[Cache, Cache]:
    options = {"capacity_bytes": 1 << 30, "seal_blocks": False, "drop_delay": 0.0}
    return Cache(root, **options), Cache(root, janitor=False, **options)


def _flip(path: str, at: int) -> None:
    with open(path, "r+b") as f:
        byte = f.read()[at]
        f.seek(at)
        f.write(bytes([byte ^ 0x01]))


def _bytes_of(found: object, length: int) -> bytes:
    if isinstance(found, FileRegion):
        try:
            return os.pread(found.fd, length, found.offset)
        finally:
            found.close()
    assert isinstance(found, memoryview | bytes), found
    return bytes(found)


async def test_a_block_a_sibling_filled_is_answered_from_the_page_cache(tmp_path: str) -> None:
    filler, sibling = _stores(str(tmp_path))
    await filler.open()
    await sibling.open()
    try:
        small = BlockKey(1, "small.bin", '"v1"', 4 * MiB, 0)
        big = BlockKey(1, "big.bin", '"v1"', 4 * MiB, 0)
        await _fill(filler, small, SMALL)
        await _fill(filler, big, BIG)
        assert sibling.may_answer(small, disk=True) and sibling.may_answer(big, disk=True)
        assert not sibling.may_answer(small, disk=False)  # a HEAD's: the memory tier only
        assert _bytes_of(sibling.peek_disk(small, len(SMALL)), len(SMALL)) == SMALL
        assert sibling.peek(small) == SMALL  # and now in its memory tier
        assert _bytes_of(sibling.peek_sendable(big, len(BIG)), len(BIG)) == BIG
        assert (sibling.stats.hits, sibling.stats.memory_hits) == (3, 1)
        # A range of a block the sibling has not read, on the full path: sent from its file,
        # checked first (a third process's view: the filler's block, unread by it).
        third = Cache(str(tmp_path), janitor=False, capacity_bytes=1 << 30, seal_blocks=False)
        await third.open()
        try:
            found = await third.pages.region(big, len(BIG), 1000, 300_000)
            assert isinstance(found, FileRegion)
            assert _bytes_of(found, 299_000) == BIG[1000:300_000]
            assert third.pages.stats.rechecks == 1
        finally:
            await third.close()
        # A block no process cached: nothing, and nothing counted.
        gone = BlockKey(1, "never.bin", '"v1"', 4 * MiB, 0)
        assert sibling.peek_disk(gone, 10) is None and sibling.peek_sendable(gone, MiB) is None
        assert await sibling.pages.region(gone, MiB, 0, 10) is None
        assert sibling.stats.hits == 3
    finally:
        await sibling.close()
        await filler.close()


async def test_a_damaged_block_of_a_sibling_is_never_given(tmp_path: str) -> None:
    filler, sibling = _stores(str(tmp_path))
    await filler.open()
    await sibling.open()
    try:
        keys = [BlockKey(1, name, '"v1"', 4 * MiB, 0) for name in ("small.bin", "big.bin")]
        for bkey, data in zip(keys, (SMALL, BIG), strict=True):
            await _fill(filler, bkey, data)
            # In the page cache: a read of it would succeed.
            _flip(block_path(str(tmp_path), 1, bkey.name), len(data) // 2)
        assert sibling.peek_disk(keys[0], len(SMALL)) is None
        assert sibling.peek(keys[0]) is None
        assert sibling.peek_sendable(keys[1], len(BIG)) is None
        assert await sibling.pages.region(keys[1], len(BIG), 0, 1000) is None
        assert not os.path.exists(block_path(str(tmp_path), 1, keys[1].name))  # dropped
        assert sibling.stats.hits == 0
    finally:
        await sibling.close()
        await filler.close()
