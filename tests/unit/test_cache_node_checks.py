"""A block's check counts for every worker of its node (gateway/cache/checks.py): a zero-copy
send by one worker of a block another worker filled or checked within `zero_copy_recheck`
seconds goes unread, as it would in the process that checked it. Before, each process kept
its own checks, and every worker read and checked each block once more at its first send
(`gateway_cache_rechecks`: about half of a warm epoch's first disk hits at two workers).
Two page stores over one root and one table here, as two forked workers hold them; the real
processes are tests/e2e/test_zero_copy_workers.py's."""

from __future__ import annotations

import os

import pytest

from gateway.cache import BlockKey, checks
from gateway.cache.layout import block_path
from gateway.service import FileRegion
from tests.support.cache import Cache
from tests.support.stores import FakeClock
from tests.unit.test_cache_siblings import _fill, _flip

pytestmark = pytest.mark.anyio

MiB = 1 << 20
BIG = os.urandom(MiB)  # sent from its file by a server that sends files
NAME = "ab12c" + "d34ef567" + "0" * 51  # a block's name: 64 hex digits (slot, tag, rest)


def test_a_check_is_told_with_its_age_never_less_than_its_true_one() -> None:
    clock = FakeClock()
    table = checks.Checks(clock.monotonic)
    assert table.age(NAME) is None
    clock.now += 0.75
    table.checked_now(NAME)  # at 0.75 s of the table's life: its second floored, 0
    clock.now += 10
    assert table.age(NAME) == pytest.approx(10.75)
    # A block has two slots: another of the same pair takes the other one, both are known.
    other = NAME[:5] + "99999999" + NAME[13:]
    assert checks._place(other)[0] == checks._place(NAME)[0]
    table.checked_now(other)
    assert table.age(NAME) == pytest.approx(10.75) and table.age(other) == pytest.approx(0.75)
    # A third takes the slot of the older check: that block is then not known to be checked.
    clock.now += 5
    third = NAME[:5] + "77777777" + NAME[13:]
    table.checked_now(third)
    assert table.age(NAME) is None
    assert table.age(other) == pytest.approx(5.75) and table.age(third) == pytest.approx(0.75)
    table.checked_now(other)  # checked again: its own word, not the third's
    assert table.age(other) == pytest.approx(0.75) and table.age(third) is not None
    table.forget(NAME)  # not held: nothing changes
    assert table.age(other) is not None and table.age(third) is not None
    table.forget(other)
    assert table.age(other) is None and table.age(third) is not None


def test_a_word_damaged_or_half_written_says_nothing() -> None:
    table = checks.Checks(FakeClock().monotonic)
    table.checked_now(NAME)
    slot = checks._place(NAME)[0]
    good = table._words[slot]
    for bad in (good ^ (1 << 8), good ^ (1 << 20), good ^ 1, good & ~0xFFFFFFFF, 0):
        table._words[slot] = bad  # a second or check byte that do not match its tag
        assert table.age(NAME) is None, hex(bad)
    table._words[slot] = good
    assert table.age(NAME) is not None


async def test_a_block_one_worker_filled_goes_unread_from_its_siblings(tmp_path: str) -> None:
    node = checks.Checks()
    options = {"capacity_bytes": 1 << 30, "seal_blocks": False, "drop_delay": 0.0}
    filler = Cache(str(tmp_path), checked=node, **options)
    sibling = Cache(str(tmp_path), janitor=False, checked=node, **options)
    # A process of another node's life (or before this change, every sibling): its own table.
    alone = Cache(str(tmp_path), janitor=False, **options)
    for cache in (filler, sibling, alone):
        await cache.open()
    try:
        big = BlockKey(1, "big.bin", '"v1"', 4 * MiB, 0)
        await _fill(filler, big, BIG)
        found = sibling.peek_sendable(big, len(BIG))
        assert isinstance(found, FileRegion)
        found.close()
        region = await sibling.pages.region(big, len(BIG), 1000, 300_000)
        assert isinstance(region, FileRegion)
        region.close()
        assert sibling.pages.stats.rechecks == 0
        assert sibling.pages.stats.zero_copy == 2
        found = alone.peek_sendable(big, len(BIG))
        assert isinstance(found, FileRegion)
        found.close()
        assert alone.pages.stats.rechecks == 1  # read and checked first
    finally:
        for cache in (alone, sibling, filler):
            await cache.close()


async def test_a_block_found_damaged_is_no_longer_taken_as_checked(tmp_path: str) -> None:
    node = checks.Checks()
    options = {"capacity_bytes": 1 << 30, "seal_blocks": False, "drop_delay": 0.0}
    filler = Cache(str(tmp_path), checked=node, **options)
    sibling = Cache(str(tmp_path), janitor=False, checked=node, **options)
    for cache in (filler, sibling):
        await cache.open()
    try:
        big = BlockKey(1, "big.bin", '"v1"', 4 * MiB, 0)
        await _fill(filler, big, BIG)
        assert node.age(big.name) is not None
        _flip(block_path(str(tmp_path), 1, big.name), 5)
        # A read that checks the block (the sibling has not read it: its first read does)
        # finds the damage: dropped, and forgotten by the node.
        assert await sibling.pages.read_disk(big, len(BIG), 0, 100) is None
        assert node.age(big.name) is None
        assert not os.path.exists(block_path(str(tmp_path), 1, big.name))
    finally:
        for cache in (sibling, filler):
            await cache.close()
