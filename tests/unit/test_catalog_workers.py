"""A node answers a synced prefix alike through all of its workers once one of them has seen
the sync finish: each worker re-reads the synced prefixes on its own timer, and until then a
worker that had not seen it sent listings to the store, wrote no row for what a HEAD learnt
and opened known keys without their catalogued version (tests/e2e/test_catalog.py's fleet
test failed 1 run in 4 on it). The worker that sees a change tells the node's others, which
re-read before their next request.

Two workers' services side by side over one cache directory (the node's shared counters) and a
real database; the sync is a real crawl of a file store, made elsewhere (another node, or the
CLI of another host), so that no worker here is told of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.catalog import sync
from gateway.meta import MetaStore
from tests.support.service import worker

pytestmark = pytest.mark.anyio


async def test_a_sync_one_worker_has_seen_is_seen_by_the_others_before_their_next_request(
    meta: MetaStore, tmp_path: Path
) -> None:
    origin = tmp_path / "origin"
    (origin / "train").mkdir(parents=True)
    (origin / "train" / "a.bin").write_bytes(b"a" * 100)
    mount = await meta.add_mount("cat", origin.as_uri(), {"catalog": "on", "metadata_ttl": "60"})
    cache = tmp_path / "cache"
    async with worker(meta, cache) as a, worker(meta, cache) as b:
        handle = a.namespace.mount("cat")
        assert handle is not None
        assert not a.catalog.covers(mount.id, "train/a.bin")
        await sync(a.catalog, mount.id, handle.store, "train/")
        assert not b.namespace.stale()  # nobody told this node
        await a.catalog.refresh()  # worker a's periodic re-read finds the sync
        assert a.catalog.covers(mount.id, "train/a.bin")
        assert b.namespace.stale()  # a request to b re-reads first (S3App, the peer API)
        assert not b.catalog.covers(mount.id, "train/a.bin")
        await b.namespace.current()
        assert b.catalog.covers(mount.id, "train/a.bin")
        # Told once: the workers' re-reads of what they already know tell nobody again.
        await a.namespace.current()
        await b.namespace.current()
        assert not a.namespace.stale() and not b.namespace.stale()
        await a.catalog.refresh()
        assert not b.namespace.stale()
