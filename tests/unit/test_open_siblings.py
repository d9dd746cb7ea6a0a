"""A key a sibling worker of the node is opening (its version and block 0 from one store
request) is not asked of the store, even once block 0 is cached: the opener's fill commits on
its own (a task), and its version may reach the node's shared record only later (the record
was busy: the share is tried again for a while). A read in that window found block 0 cached,
took the key as known and asked the store for its version (a HEAD): tests/e2e/test_pages_s3.py
counted two store requests for six concurrent first reads, once in CI. It now waits for the
opener's claim, as a read of a key not cached does. The opener is a process holding the key's
open claim (claims are a process's: two workers in one test process do not exclude each
other); the cache, its block 0 and the shared record are real, as is the store (a folder)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.generations import OpenClaims
from gateway.meta import MetaStore
from tests.support.net import eventually_async
from tests.support.service import worker, wrap_store
from tests.unit.test_version_neighbours import CountsStats

pytestmark = pytest.mark.anyio

BODY = bytes(range(256)) * 800  # 200 KiB: one block
_HOLD = """
import sys
from gateway.generations import OpenClaims
claims = OpenClaims(sys.argv[1])
assert claims.take(int(sys.argv[2]))
print("held", flush=True)
sys.stdin.readline()
"""


class CountsAsks(CountsStats):
    """A real store that keeps the keys its stat() and open() were asked for (`stats`)."""

    async def open(self, key: str, *args: Any, **kwargs: Any) -> Any:
        self.stats.append(key)
        return await self._store.open(key, *args, **kwargs)


async def test_a_read_waits_for_a_sibling_opening_a_key_whose_block_0_is_cached_already(
    meta: MetaStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    origin = tmp_path / "origin"
    origin.mkdir()
    (origin / "k.bin").write_bytes(BODY)
    await meta.add_mount("data", f"file://{origin}", {"metadata_ttl": "60"})
    cache = tmp_path / "cache"
    async with (
        worker(meta, cache, workers=2) as opener,
        worker(meta, cache, workers=2) as reader,
    ):
        mine, theirs = opener.namespace.mount("data"), reader.namespace.mount("data")
        assert mine is not None and theirs is not None
        asks = wrap_store(reader, "data", CountsAsks)
        # The opener: block 0 filled and committed, its version kept from the shared record
        # (busy), its claim still held (by the process below, which stands for it).
        learnt = opener.metadata._learnt
        assert learnt is not None
        publish = learnt.publish
        monkeypatch.setattr(learnt, "publish", lambda *a: False)
        monkeypatch.setattr("gateway.service.metadata.SHARE_TRIES", 1)
        opened = await opener.versions.open(mine, "k.bin")
        assert opened is not None
        async for _ in opened.head:
            pass
        await eventually_async(lambda: reader.pages.cached_version(theirs.id, "k.bin"))
        byte = OpenClaims.byte(mine.id, "k.bin")
        holder = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _HOLD, str(cache), str(byte),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        try:
            assert holder.stdout is not None and await holder.stdout.readline() == b"held\n"
            assert await reader.versions._unknown(theirs, "k.bin")  # wait for it, not ask
            reading = asyncio.create_task(reader.versions.open(theirs, "k.bin"))
            # The opener's share goes through, then its claim: the read finds the version.
            ticket = opener.metadata.ticket(mine.id, "k.bin")
            assert publish(mine.id, "k.bin", opened.info, time.monotonic(), ticket)
            assert holder.stdin is not None
            holder.stdin.write(b"\n")
            await holder.stdin.drain()
            assert await reading is None
            info = await reader.versions.current(theirs, "k.bin")
        finally:
            if holder.returncode is None:
                holder.kill()
            await holder.wait()
        assert info.size == len(BODY) and info.etag == opened.info.etag
        assert asks.stats == []  # no HEAD, no GET
