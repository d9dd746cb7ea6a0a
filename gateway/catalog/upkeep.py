"""What keeps a node's catalog fresh beside the writes through it: which prefixes are synced
(re-read every few seconds), re-crawls of those due by their mount's `catalog_ttl` (one node
each, under the sync's lease), and the consumers of the mounts' change notifications."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta

import sqlalchemy as sa

from gateway.catalog.catalog import Catalog
from gateway.catalog.crawl import SyncBusy, run_owner
from gateway.catalog.notifications import Changed, QueueConsumer, QueueSource
from gateway.catalog.options import CatalogOptions
from gateway.catalog.parallel import sync_parallel
from gateway.meta import MetaUnavailable
from gateway.meta.catalog import catalog_syncs as S
from gateway.meta.store import transaction
from gateway.stores import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CatalogMount:
    """A catalog=on mount as the upkeep needs it."""

    id: int
    uri: str
    options: Mapping[str, str]  # the store's options (credentials for its queue too)
    store: Store
    catalog: CatalogOptions


async def due(catalog: Catalog, mount_id: int, ttl: float) -> list[str]:
    """The mount's synced prefixes whose last sync is older than `ttl` seconds, and runs
    that stopped (their lease ran out): what a re-crawl should take now."""
    now = catalog.clock()
    free = S.c.owner.is_(None) | (S.c.lease_until <= now)
    stale = S.c.synced_at < now - timedelta(seconds=ttl)
    stopped = S.c.started_at.is_not(None)
    query = sa.select(S.c.prefix).where(S.c.mount_id == mount_id, free, stale | stopped)
    async with transaction(catalog.engine) as conn:
        return [prefix for (prefix,) in await conn.execute(query.order_by(S.c.prefix))]


class Upkeep:
    def __init__(
        self,
        catalog: Catalog,
        mounts: Callable[[], list[CatalogMount]],
        changed: Changed,
        interval: float = 2.0,
    ) -> None:
        self.catalog = catalog
        self.mounts = mounts
        self.changed = changed
        self.interval = interval
        self.owner = run_owner()
        self._consumers: dict[tuple[int, str], asyncio.Task[None]] = {}
        self._crawl: asyncio.Task[None] | None = None

    async def run(self) -> None:
        try:
            while True:
                try:
                    await self.catalog.refresh()
                except MetaUnavailable as exc:
                    log.warning("catalog unavailable, serving the synced prefixes known: %s", exc)
                except Exception:
                    log.exception("catalog refresh failed")
                mounts = self.mounts()
                self._consume(mounts)
                if self._crawl is None or self._crawl.done():
                    self._crawl = asyncio.create_task(self._recrawl(mounts))
                await asyncio.sleep(self.interval)
        finally:
            for task in [*self._consumers.values(), self._crawl]:
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task

    def _consume(self, mounts: list[CatalogMount]) -> None:
        """One consumer a mount with a queue, for as long as the mount has it."""
        wanted: dict[tuple[int, str], CatalogMount] = {
            (m.id, m.catalog.queue): m for m in mounts if m.catalog.queue
        }
        for at, task in list(self._consumers.items()):
            if at not in wanted or task.done():
                task.cancel()
                del self._consumers[at]
        for (mount_id, queue), m in wanted.items():
            if (mount_id, queue) in self._consumers:
                continue
            try:
                source = QueueSource.of(queue, m.uri, m.options)
            except ValueError as exc:
                log.error("mount %d: %s", mount_id, exc)
                continue
            consumer = QueueConsumer(mount_id, m.store, source, self.changed)
            self._consumers[(mount_id, queue)] = asyncio.create_task(consumer.run())

    async def _recrawl(self, mounts: list[CatalogMount]) -> None:
        for m in mounts:
            if m.catalog.ttl <= 0:
                continue
            try:
                for prefix in await due(self.catalog, m.id, m.catalog.ttl):
                    done = await sync_parallel(
                        self.catalog, m.id, m.store, prefix, owner=self.owner
                    )
                    log.info(
                        "re-crawled mount %d prefix %r: %d listed, %d written, %d removed",
                        m.id, prefix, done.listed, done.changed, done.removed,
                    )  # fmt: skip
            except SyncBusy:
                continue
            except Exception as exc:
                log.warning("re-crawl of mount %d failed: %s", m.id, exc)
