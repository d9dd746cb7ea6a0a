"""A catalog's row of a key under a synced prefix, learnt from the store's answer, is stamped
with when the store was asked, not when its answer came: a read trusts the row for the mount's
TTL from its stamp, and a slow answer stamped late was trusted past one TTL from the asking
(as the workers' shared record was before issue 40's fix; docs/cache.md, "Freshness").

The service over a real file store and a real database; the store's stat() answers late."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gateway.catalog import sync
from gateway.meta import MetaStore
from gateway.service import Conditions, S3Service
from gateway.stores import ObjectInfo
from tests.support.service import worker, wrap_store

pytestmark = pytest.mark.anyio

LATE = 1.0  # seconds the store takes to answer a HEAD
NO_CONDITIONS = Conditions(None, None, None, None)


class AnswersLate:
    """A real store whose stat() is answered LATE seconds after it is asked."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.asked: list[datetime] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def stat(self, key: str) -> ObjectInfo:
        self.asked.append(datetime.now(UTC))
        info: ObjectInfo = await self._store.stat(key)
        await asyncio.sleep(LATE)  # the store's latency, not the test's wait
        return info


async def test_a_synced_prefix_row_learnt_from_a_late_answer_is_stamped_at_the_asking(
    meta: MetaStore, tmp_path: Path
) -> None:
    origin = tmp_path / "origin"
    (origin / "train").mkdir(parents=True)
    (origin / "train" / "a.bin").write_bytes(b"a" * 100)
    mount = await meta.add_mount("cat", origin.as_uri(), {"catalog": "on", "metadata_ttl": "60"})
    async with worker(meta, tmp_path / "cache") as shared:
        handle = shared.namespace.mount("cat")
        assert handle is not None
        await sync(shared.catalog, mount.id, handle.store, "train/")
        await shared.catalog.refresh()
        store = wrap_store(shared, "cat", AnswersLate)
        # The crawl's row knows only what a listing tells: the HEAD asks the store, whose
        # answer completes the row.
        got = await S3Service(shared).head_object("cat", "train/a.bin", None, NO_CONDITIONS)
        assert got.info.size == 100 and len(store.asked) == 1
        answered = datetime.now(UTC)
        rows = await meta.find_versions([(mount.id, "train/a.bin")])
        info, complete, written_at = rows[(mount.id, "train/a.bin")]
        assert complete and info.size == 100
        stamp = written_at if written_at.tzinfo else written_at.replace(tzinfo=UTC)
        # At the asking (within the clocks' conversion), a whole LATE before the answer.
        assert stamp <= store.asked[0] + timedelta(seconds=LATE / 4)
        assert stamp < answered - timedelta(seconds=LATE / 2)
