"""A hit past its TTL answered from a listing the worker already read (Versions.fresh): a
warm epoch at the default TTL, its prefix listed within the TTL, takes the hit path as at TTL
-1, rather than the full path's revalidation (a task, queries and a write a key). Counted from
the listing's time, so a read is never more than one TTL behind the store; a changed or
deleted key is not answered from it. A real store (a folder of files), the worker's real
metadata and page stores; the listings' wall clock is injected, the monotonic time passed in."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.generations import Generations
from gateway.meta import MetaStore
from gateway.service.learnt import LearntVersions
from gateway.service.listed import ListedVersions
from gateway.service.metadata import MetadataCache
from gateway.service.revalidation import Revalidator
from gateway.service.shared import Shared
from gateway.stores import ObjectInfo
from tests.support.service import worker

pytestmark = pytest.mark.anyio

TTL = 5.0
KEYS = [f"train/{i:04d}.bin" for i in range(40)]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def node(meta: MetaStore, tmp_path: Path) -> AsyncIterator[tuple[Shared, Path, Clock]]:
    origin = tmp_path / "origin"
    (origin / "train").mkdir(parents=True)
    for key in KEYS:
        (origin / key).write_bytes(key.encode())
    await meta.add_mount("data", f"file://{origin}", {"metadata_ttl": str(TTL)})
    async with worker(meta, tmp_path / "cache") as shared:
        clock = Clock()
        versions = shared.versions
        await versions.revalidator.close()
        versions.revalidator = Revalidator(
            ListedVersions(str(tmp_path / "cache")), wall=clock, page=10, ahead_tick=None
        )
        yield shared, origin, clock


async def test_a_version_past_its_ttl_that_a_listing_told_is_a_hit_from_the_listing_time(
    node: tuple[Shared, Path, Clock],
) -> None:
    shared, origin, clock = node
    versions = shared.versions
    handle = shared.namespace.mount("data")
    assert handle is not None and handle.ttl == TTL
    known = {key: await versions.current(handle, key) for key in KEYS}
    changed, deleted = KEYS[7], KEYS[8]
    (origin / changed).write_bytes(b"another version, another size")
    (origin / deleted).unlink()
    later = time.monotonic() + TTL + 1  # the TTL has run out for every version learnt
    clock.now += TTL + 1
    assert all(versions.fresh(handle, key, later) is None for key in KEYS)  # no listing yet

    await versions.revalidator.cover(handle, KEYS)  # the prefix's pages listed now
    for key in KEYS:
        found = versions.fresh(handle, key, later)
        if key in (changed, deleted):
            assert found is None, key  # the full path asks the store about it
        else:
            assert found == known[key], key
            assert shared.metadata.age(handle.id, key, later) == 0.0  # from the listing's time

    # Fresh for the TTL from the listing, not from the read: past it, no longer.
    clock.now += TTL - 0.5
    assert versions.fresh(handle, KEYS[3], later + TTL - 0.5) == known[KEYS[3]]
    clock.now += 1
    assert versions.fresh(handle, KEYS[3], later + TTL + 0.5) is None
    assert versions.fresh(handle, KEYS[4], later + TTL + 0.5) is None


def _info(etag: str, size: int = 10) -> ObjectInfo:
    return ObjectInfo("k", size, etag, datetime(2026, 1, 1, tzinfo=UTC))


def test_a_version_a_sibling_learnt_past_its_ttl_is_fresh_again_from_a_listing(
    tmp_path: Path,
) -> None:
    wall = Clock()
    a, b = (
        MetadataCache(Generations(str(tmp_path)), learnt=LearntVersions(str(tmp_path)), wall=wall)
        for _ in range(2)
    )
    now = 100.0
    a.put(1, "k", _info('"v1"'), now, a.ticket(1, "k"))  # a asked the store
    wall.now += TTL + 1
    told: list[tuple[str, int]] = []

    def listed(etag: str, size: int) -> float | None:
        told.append((etag, size))
        return 2.0 if etag == '"v1"' and size == 10 else None  # a listing 2 s ago told it

    assert b.fresh(1, "k", TTL, now + TTL + 1) is None  # past the TTL
    assert b.fresh(1, "k", TTL, now + TTL + 1, listed) == _info('"v1"')
    assert told == [('"v1"', 10)]
    assert b.age(1, "k", now + TTL + 1) == 2.0  # fresh again from the listing's time
    assert b.fresh(1, "k", TTL, now + TTL + 3.5) == _info('"v1"')  # no listing asked
    assert b.fresh(1, "k", TTL, now + TTL + 4) is None
    b.forget(1, "k")  # a write through the node: a listing's word no longer makes it fresh
    assert b.fresh(1, "k", TTL, now + 2 * TTL, listed) is None
    a.close()
    b.close()
