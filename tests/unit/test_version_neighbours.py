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

import pytest

from gateway.meta import MetaStore
from gateway.service.version_rows import Entry
from tests.support.service import worker

pytestmark = pytest.mark.anyio

KEYS = [f"train/{i:04d}.bin" for i in range(30)]


async def test_a_restarted_worker_takes_the_versions_of_a_keys_neighbours_from_their_rows(
    meta: MetaStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    origin = tmp_path / "origin"
    (origin / "train").mkdir(parents=True)
    for key in KEYS:
        (origin / key).write_bytes(key.encode())
    await meta.add_mount("data", f"file://{origin}", {"metadata_ttl": "-1"})
    async with worker(meta, tmp_path / "before") as shared:
        handle = shared.namespace.mount("data")
        assert handle is not None and handle.ttl < 0
        known = {}
        for key in KEYS:
            info = await shared.versions.current(handle, key)
            known[key] = (info.etag, info.size)
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
        first = await versions.current(handle, KEYS[0])
        assert (first.etag, first.size) == known[KEYS[0]]
        await asyncio.gather(*versions._neighbouring.values())
        now = time.monotonic()
        for key in KEYS[1:]:
            if key == changed:
                assert not metadata.holds(handle.id, key)
                assert versions.fresh(handle, key, now) is None
            else:
                found = versions.fresh(handle, key, now)
                assert found is not None and (found.etag, found.size) == known[key], key
