"""Object metadata of immutable (TTL -1) mounts in the database, read and written in batches.

A cold miss learns an object's metadata; a write through the gateway makes or removes a
version. Both are remembered in the database so that a restarted node still knows them, but
no request waits for that: changes queue here and one task writes them, many to a
transaction, `delay` (0.25 s) after the first of them, so that the misses of that time share
it (one turn of the event loop, as before, held one or two at a few hundred misses a second;
a transaction costs ~0.5-1 ms of CPU, a row little). A crash loses at most what was learnt in
that time, which the next miss learns again. Before a cold miss goes to the store, it asks
whether the database remembers the key; the lookups of one turn of the event loop become one
query (with several worker processes the version known is what makes their fills one).

Changes to one key are written in the order they were made (a later change replaces a
queued one), so a delete is never overtaken by the miss that came before it, and a lookup
sees a queued change before the database does.
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy import exc as sa_exc

from gateway.meta import MetaStore, MetaUnavailable
from gateway.stores import ObjectInfo

log = logging.getLogger("gateway.service")

BATCH = 256  # changes a transaction at most
DELAY = 0.25  # seconds changes wait for others to share their transaction


class MetadataRecorder:
    def __init__(self, meta: MetaStore, delay: float = DELAY) -> None:
        self._meta = meta
        self._delay = delay
        self._queued: dict[tuple[int, str], ObjectInfo | None] = {}
        self._task: asyncio.Task[None] | None = None
        self._wanted: dict[tuple[int, str], asyncio.Future[ObjectInfo | None]] = {}
        self._finder: asyncio.Task[None] | None = None
        self._wake: asyncio.Future[None] | None = None  # ends the pause before a write

    async def lookup(self, mount_id: int, key: str) -> ObjectInfo | None:
        """What is remembered of the key (None: nothing, or the database is unavailable)."""
        item = (mount_id, key)
        if item in self._queued:
            return self._queued[item]
        wanted = self._wanted.get(item)
        if wanted is None:
            wanted = asyncio.get_running_loop().create_future()
            self._wanted[item] = wanted
            if self._finder is None:
                self._finder = asyncio.create_task(self._find())
        return await asyncio.shield(wanted)

    async def _find(self) -> None:
        batch: dict[tuple[int, str], asyncio.Future[ObjectInfo | None]] = {}
        try:
            while self._wanted:
                await asyncio.sleep(0)  # the lookups of this turn of the loop join in
                batch = {item: self._wanted.pop(item) for item in list(self._wanted)[:BATCH]}
                try:
                    found = await self._meta.find_objects(list(batch))
                except MetaUnavailable as exc:
                    log.warning("could not look up metadata of %d objects: %s", len(batch), exc)
                    found = {}
                except Exception as exc:
                    for wanted in batch.values():
                        wanted.set_exception(exc)
                        wanted.add_done_callback(_retrieved)
                    continue
                for item, wanted in batch.items():
                    wanted.set_result(found.get(item))
        finally:
            self._finder = None
            # Cancelled (at close): nobody is left without an answer.
            for wanted in [*batch.values(), *self._wanted.values()]:
                if not wanted.done():
                    wanted.set_result(None)

    def record(self, mount_id: int, key: str, info: ObjectInfo | None) -> None:
        """Remember `info` for the key, or with None that it has no version."""
        self._queued.pop((mount_id, key), None)  # to the back: after what came before it
        self._queued[(mount_id, key)] = info
        if self._task is None:
            self._task = asyncio.create_task(self._drain())
        elif len(self._queued) >= BATCH:
            self._hurry()

    @property
    def pending(self) -> int:
        return len(self._queued)

    async def _drain(self) -> None:
        try:
            while self._queued:
                # The requests running now, and those of the next `delay`, add theirs.
                await self._pause()
                batch = []
                for item in list(self._queued)[:BATCH]:
                    batch.append((*item, self._queued.pop(item)))
                await self._write(batch)
        finally:
            self._task = None

    async def _write(self, batch: list[tuple[int, str, ObjectInfo | None]]) -> None:
        try:
            await self._meta.record_objects(batch)
        except MetaUnavailable as exc:
            log.warning("could not persist metadata of %d objects: %s", len(batch), exc)
        except sa_exc.IntegrityError:
            # A mount removed meanwhile fails its rows, and with them the whole batch: write
            # the rest one by one.
            for change in batch:
                try:
                    await self._meta.record_objects([change])
                except (MetaUnavailable, sa_exc.IntegrityError) as exc:
                    log.info("metadata of %s not persisted: %s", change[1], exc)
        except Exception:
            log.exception("could not persist metadata of %d objects", len(batch))

    async def _pause(self) -> None:
        """`delay` seconds, or less: a full batch, or close(), ends it."""
        if len(self._queued) >= BATCH or self._delay <= 0:
            await asyncio.sleep(0)
            return
        loop = asyncio.get_running_loop()
        self._wake = wake = loop.create_future()
        timer = loop.call_later(self._delay, self._hurry)
        try:
            await wake
        finally:
            timer.cancel()
            self._wake = None

    def _hurry(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    async def close(self, wait: float = 5.0) -> None:
        """Write what is queued (for up to `wait` seconds); lookups in flight find nothing."""
        self._delay = 0.0  # what is queued now, and after, is written at once
        self._hurry()
        if self._finder is not None:
            self._finder.cancel()
        task = self._task
        if task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), wait)
        except TimeoutError:
            task.cancel()
            log.warning("metadata of %d objects not persisted at shutdown", len(self._queued))


def _retrieved(future: asyncio.Future[ObjectInfo | None]) -> None:
    future.exception()  # every waiter may have gone: not "never retrieved"
