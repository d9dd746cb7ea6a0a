"""A short-circuit client renews its leases past their TTL in one request for up to 1,024
keys (gateway/s3/local.py); the node answers each key's version from what it knows and asks
the store about the others. Those are asked at once (a bounded number at a time): one after
another, a thousand keys behind a store 50 ms away took 50 s, longer than the TTL they were
being renewed for, and the client asked again (found with loadtest epochs, TTL 5 s).

The service over a real file store and a real database; the store's stat() is held until
all of the keys' stats are in flight together, which can only happen if they are asked at
once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gateway.meta import MetaStore
from gateway.service import S3Service
from gateway.stores import ObjectInfo
from tests.support.service import worker, wrap_store

pytestmark = pytest.mark.anyio

KEYS = [f"train/{i:02d}.bin" for i in range(8)]


class StatsTogether:
    """A real store whose stat() waits until `together` of them are in flight at once."""

    def __init__(self, store: Any, together: int) -> None:
        self._store = store
        self._together = together
        self.in_flight = 0
        self.most = 0
        self._all_in = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def stat(self, key: str) -> ObjectInfo:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        if self.in_flight >= self._together:
            self._all_in.set()
        try:
            await self._all_in.wait()
            info: ObjectInfo = await self._store.stat(key)
            return info
        finally:
            self.in_flight -= 1


async def test_versions_past_their_ttl_are_asked_of_the_store_at_once(
    meta: MetaStore, tmp_path: Path
) -> None:
    origin = tmp_path / "origin"
    (origin / "train").mkdir(parents=True)
    for i, key in enumerate(KEYS):
        (origin / key).write_bytes(bytes([i]) * 1000)
    # TTL 0: every version is asked of the store, as every one past a TTL is.
    await meta.add_mount("vers", origin.as_uri(), {"metadata_ttl": "0"})
    async with worker(meta, tmp_path / "cache") as shared:
        store = wrap_store(shared, "vers", StatsTogether, len(KEYS))
        service = S3Service(shared)
        async with asyncio.timeout(10):  # one at a time, the first would wait for ever
            found = await service.local_files("vers", KEYS, 0)
        sizes = [f if isinstance(f, Exception) else f.info.size for f in found]
        assert sizes == [1000] * len(KEYS)
        assert store.most == len(KEYS)
