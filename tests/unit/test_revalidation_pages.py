"""Revalidation by listing keeps its pages' edges (gateway/service/revalidation.py): readers of
a prefix in shuffled order, TTL after TTL, list each page of it once a TTL, as a reader in
key order would, not from wherever their keys are (spans that overlap cost a listing each).
A real store (a folder of files) and the node's listing records on disk; the wall clock is
injected, so a TTL passes when the test says."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.counters import REGISTRY
from gateway.meta import Mount
from gateway.service.listed import ListedVersions
from gateway.service.namespace import MountHandle
from gateway.service.revalidation import Revalidator
from gateway.stores import open_store

PAGE = 10
TTL = 5.0
KEYS = [f"data/{i:04d}.bin" for i in range(95)]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _listings() -> float:
    return REGISTRY.get_sample_value("gateway_revalidation_listings_total", {"kind": "file"}) or 0


def _handle(root: Path) -> MountHandle:
    mount = Mount(1, "b", f"file://{root}", {}, datetime.now(UTC))
    return MountHandle(mount, open_store(mount.uri, {}), TTL, False, True, False, "file",
                       1 << 20, None, (), 1)  # fmt: skip


def _dataset(tmp_path: Path) -> tuple[Clock, Revalidator, MountHandle]:
    """KEYS in a folder store, and a revalidator of its mount on an injected clock."""
    data = tmp_path / "store"
    (data / "data").mkdir(parents=True)
    for key in KEYS:
        (data / key).write_bytes(key.encode())
    clock = Clock()
    revalidator = Revalidator(ListedVersions(str(tmp_path)), wall=clock, page=PAGE, ahead_tick=None)
    return clock, revalidator, _handle(data)


def test_readers_in_any_order_list_each_page_once_a_ttl(tmp_path: Path) -> None:
    clock, revalidator, handle = _dataset(tmp_path)
    pages = math.ceil(len(KEYS) / PAGE)

    async def epoch(seed: int) -> float:
        before = _listings()
        order = KEYS[:]
        random.Random(seed).shuffle(order)
        for key in order:
            found = await revalidator.find(handle, key)
            if found is not None:  # None: asked alone (the epoch's first key)
                assert found.etag is not None and found.size == len(key), key
        await revalidator.walked()  # the pages walked in the background count in the TTL
        return _listings() - before

    async def epochs() -> list[float]:
        counts = []
        for seed in range(4):
            counts.append(await epoch(seed))
            clock.now += TTL + 1  # every listing lapses before the next epoch
        return counts

    counts = asyncio.run(epochs())
    # The first TTL finds the edges (pages walked from the prefix's start in the background,
    # readers ahead of the walk list from their keys: at most two listings a page); from the
    # next on, each page once. Listed from wherever a key was, it costs about two a page
    # every TTL.
    assert counts[0] <= 2 * pages, counts
    assert counts[1:] == [pages] * 3, counts


def test_renewals_of_many_keys_at_once_list_each_page_once(tmp_path: Path) -> None:
    # The socket client renews its expired leases in batches of up to 1,024 keys in the order
    # it read them (shuffled), the batches side by side: here 4 batches of a quarter each.
    clock, revalidator, handle = _dataset(tmp_path)
    pages = math.ceil(len(KEYS) / PAGE)

    async def renewals() -> list[float]:
        counts = []
        for seed in range(4):
            before = _listings()
            order = random.Random(seed).sample(KEYS, len(KEYS))
            batch = math.ceil(len(order) / 4)
            await asyncio.gather(*(revalidator.cover(handle, order[i : i + batch])
                                   for i in range(0, len(order), batch)))  # fmt: skip
            await revalidator.walked()
            counts.append(_listings() - before)
            assert all(revalidator.lookup(handle, k) is not None for k in KEYS)
            clock.now += TTL + 1
        return counts

    counts = asyncio.run(renewals())
    # The first TTL: the pages walked, and beside them, for each batch, listings from every
    # PAGE-th key of it; from the next on, each page once.
    assert counts[0] <= 4 * pages, counts
    assert counts[1:] == [pages] * 3, counts


def test_a_prefix_read_lately_is_kept_listed_ahead_so_readers_after_a_pause_wait_for_none(
    tmp_path: Path,
) -> None:
    clock, revalidator, handle = _dataset(tmp_path)
    pages = math.ceil(len(KEYS) / PAGE)

    async def run() -> list[int]:
        for _ in range(2):  # two epochs past the TTL: the pages' edges are known
            for key in random.Random(3).sample(KEYS, len(KEYS)):
                await revalidator.find(handle, key)
            await revalidator.walked()
            clock.now += TTL + 1
        listed = []
        clock.now -= TTL + 1
        for step in range(10):  # a pause: nothing read
            clock.now += TTL * 0.5
            listed.append(await revalidator.ahead())
            if step < 8:  # within HOT_FOR of the TTLs since the last read: still spanned
                assert all(revalidator.lookup(handle, k) is not None for k in KEYS), step
        return listed

    listed = asyncio.run(run())
    # Every page again once its listing is older than AHEAD of the TTL (every other look
    # here), and nothing once the prefix has not been read for HOT_FOR TTLs.
    assert listed[:8] == [0, pages] * 4 and listed[8:] == [0, 0], listed


def test_a_renewal_ahead_lists_again_each_page_older_than_the_ttl_less_fresh_for(
    tmp_path: Path,
) -> None:
    # A client renewing its leases ahead of their lapse asks for versions fresh for half the
    # TTL at least: a page listed more lately than that is enough, an older one is listed again
    # (each page once), so that the renewal lasts past the client's next look.
    clock, revalidator, handle = _dataset(tmp_path)
    pages = math.ceil(len(KEYS) / PAGE)
    fresh_for = TTL / 2

    async def run() -> list[float]:
        await revalidator.cover(handle, KEYS)
        await revalidator.walked()  # the pages' edges are known
        listed = []
        for age in (0.4 * TTL, 0.6 * TTL, 0.2 * TTL):
            clock.now += age
            before = _listings()
            await revalidator.cover(handle, random.Random(1).sample(KEYS, len(KEYS)), fresh_for)
            await revalidator.walked()
            listed.append(_listings() - before)
            since = clock.now - TTL + fresh_for
            assert all(revalidator.listed.lookup(handle.id, k, since) for k in KEYS), age
        return listed

    # Listed 0.4 TTL ago: within the TTL less fresh_for; then 1.0 TTL: every page again;
    # then 0.2 TTL after that: none.
    assert asyncio.run(run()) == [0, pages, 0]


class _Nudging:
    """The folder store, which runs `then` on the loop right after its first listing returns:
    in the loop's queue ahead of everything the listing's caller does when it ends."""

    def __init__(self, store: Any, then: Callable[[], None]) -> None:
        self._store, self._then = store, then

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def list_page(self, *args: Any, **kwargs: Any) -> Any:
        page = await self._store.list_page(*args, **kwargs)
        then, self._then = self._then, lambda: None
        asyncio.get_running_loop().call_soon(then)
        return page


def test_a_key_wanted_as_a_walk_ends_is_walked_to(tmp_path: Path) -> None:
    # A walk of a prefix's pages that has just listed as far as it was asked, and a reader that
    # wants a key further (a listing from its own key ending then, say) before the walk's task
    # is wound up: that key's pages are walked too (a walk still registered as running took the
    # wish and ended without it: the next TTL listed those pages from keys, twice a page).
    _, revalidator, handle = _dataset(tmp_path)
    far = KEYS[60]

    async def main() -> tuple[str, bool]:
        nudging = _Nudging(handle.store, lambda: revalidator._walk(nudged, "data/", far))
        nudged = replace(handle, store=nudging)
        revalidator._walk(nudged, "data/", KEYS[3])  # one page: the walk ends after it
        await revalidator.walked()
        found = revalidator.listed.edge(handle.id, "data/", far)
        await revalidator.close()
        return found

    _, known = asyncio.run(main())
    assert known
