"""A restarted worker of an immutable mount (metadata_ttl=-1) that finds a key only in its row
takes the rows of the keys after it in one read (Versions._neighbours), each under the ticket
of its key taken before the row was asked for: a key changed meanwhile is not kept, not even
as a hint. A real store (a folder of files), the real metadata and page stores, a real
database (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from gateway.meta import MetaStore
from gateway.service.learnt import LearntVersions
from gateway.service.version_rows import Entry
from gateway.stores.base import ObjectInfo
from tests.support.service import worker, wrap_store

pytestmark = pytest.mark.anyio

KEYS = [f"train/{i:04d}.bin" for i in range(30)]


async def test_a_restarted_worker_takes_the_versions_of_a_keys_neighbours_from_their_rows(
    meta: MetaStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    known = {key: (info.etag, info.size) for key, info in (await _rows(meta, tmp_path)).items()}
    # Its rows are written (at the latest when the worker closes); a new worker knows nothing.
    async with worker(meta, tmp_path / "after") as shared:
        versions, metadata = shared.versions, shared.metadata
        handle = shared.namespace.mount("data")
        assert handle is not None
        changed = KEYS[7]
        rows = versions.rows.lookup_many

        async def racing(mount_id: int, keys: Sequence[str]) -> dict[str, Entry]:
            found = await rows(mount_id, keys)
            metadata.forget(handle.id, changed)  # a change heard of while the rows were read
            return found

        monkeypatch.setattr(versions.rows, "lookup_many", racing)
        # Shared five at a time, and a change heard of between two slices' writes.
        later = KEYS[20]
        monkeypatch.setattr("gateway.service.versions.NEIGHBOURS_SHARED", 5)
        put_many = metadata.put_many

        def sharing(mount_id: int, learnt: list[tuple[str, ObjectInfo, float, int]]) -> None:
            put_many(mount_id, learnt)
            if learnt[0][0] == KEYS[1]:
                metadata.forget(handle.id, later)

        monkeypatch.setattr(metadata, "put_many", sharing)
        first = await versions.current(handle, KEYS[0])
        assert (first.etag, first.size) == known[KEYS[0]]
        await asyncio.gather(*versions._neighbouring.values())
        now = time.monotonic()
        for key in KEYS[1:]:
            if key in (changed, later):
                assert not metadata.holds(handle.id, key), key
                assert versions.fresh(handle, key, now) is None
            else:
                found = versions.fresh(handle, key, now)
                assert found is not None and (found.etag, found.size) == known[key], key


async def _rows(meta: MetaStore, tmp_path: Path) -> dict[str, ObjectInfo]:
    """An immutable mount "data" of KEYS over a folder, every version learnt by a worker that
    has closed since (its rows written): what a restarted node finds."""
    origin = tmp_path / "origin"
    (origin / "train").mkdir(parents=True)
    for key in KEYS:
        (origin / key).write_bytes(key.encode())
    await meta.add_mount("data", f"file://{origin}", {"metadata_ttl": "-1"})
    async with worker(meta, tmp_path / "before") as shared:
        handle = shared.namespace.mount("data")
        assert handle is not None and handle.ttl < 0
        return {key: await shared.versions.current(handle, key) for key in KEYS}


class CountsStats:
    """A real store that keeps the keys its stat() was asked for (a HEAD each, of S3)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.stats: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def stat(self, key: str) -> ObjectInfo:
        self.stats.append(key)
        info: ObjectInfo = await self._store.stat(key)
        return info


async def test_a_version_a_sibling_shares_while_a_read_queues_its_lookup_is_taken_not_asked(
    meta: MetaStore, tmp_path: Path
) -> None:
    """A restarted node's worker asks for a key it knows nothing of, and while its lookup
    waits for its turn a sibling worker shares the key's version (the rows of its first key's
    neighbours): the read takes it. It asked the store (a HEAD of an immutable mount's key,
    whose version is known for good) when the version arrived between its look and its
    lookup; found by tests/e2e/test_cache_restart.py failing one run in ~30 under load."""
    known = await _rows(meta, tmp_path)
    async with worker(meta, tmp_path / "after", workers=2) as shared:
        store = wrap_store(shared, "data", CountsStats)
        handle = shared.namespace.mount("data")
        assert handle is not None
        sibling = LearntVersions(shared.pages.root)
        try:
            assert sibling.shared
            key = KEYS[3]
            asking = asyncio.create_task(shared.versions.current(handle, key))
            await asyncio.sleep(0)  # it found nothing fresh; its lookup is queued, not begun
            assert not asking.done() and shared.versions.fresh(handle, key) is None
            ticket = shared.metadata.ticket(handle.id, key)
            assert sibling.publish(handle.id, key, known[key], time.time(), ticket)
            got = await asking
        finally:
            sibling.close()
        assert (got.etag, got.size) == (known[key].etag, known[key].size)
        assert store.stats == []
