"""The database's rows of object versions (gateway.meta.versions), read and written in batches,
each key's changes in order: the one writer of version rows, for the version authority.

Rows are kept for immutable mounts (`metadata_ttl=-1`), so that a restarted node still knows
their versions, and for every key of a `catalog=on` mount, which its listings answer from.
`VersionRows` queues what reads of immutable mounts learn and writes one transaction `delay`
(0.25 s) after the first of them, so that the misses of that time share it (a transaction
costs ~0.5-1 ms of CPU, a row little). A crash loses at most what was learnt in that time,
which the next miss learns again. The lookups of one turn of the event loop are one query. A
version a read learnt under a catalog's synced prefix and a write through the gateway are
written at once (`record_now`), in one transaction with the statements given (a completed
upload's removal), and return once that transaction is over. Changes to one key are written
in the order they were made (a later change replaces a queued one, and waits for an older one
being written), so a delete is never overtaken by the miss that came before it, and a lookup
sees a queued change, or one being written, before the database does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import NamedTuple

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from gateway.meta import MetaStore, MetaUnavailable
from gateway.meta.versions import object_versions
from gateway.stores import ObjectInfo

log = logging.getLogger(__name__)

BATCH = 256  # changes a transaction at most
DELAY = 0.25  # seconds changes wait for others to share their transaction

Item = tuple[int, str]  # (mount id, key)


class Entry(NamedTuple):
    """A key's row: its version, whether the row knows all of it (a crawl's row knows only
    what a listing tells: no content type, no user metadata), and when it was written (what
    the store said then: a read trusts it for the mount's TTL from then)."""

    info: ObjectInfo
    complete: bool
    at: datetime


@dataclass(eq=False, slots=True)
class _Writing:
    """A change of a key whose transaction is under way; `done` when it is over (committed
    or not). A newer change of the key waits for it."""

    entry: Entry | None
    done: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class VersionRows:
    """The database's rows of object versions (gateway.meta.versions), looked up and written
    in batches, each key's changes in order."""

    def __init__(self, meta: MetaStore, delay: float = DELAY) -> None:
        self._meta = meta
        self._delay = delay
        self._queued: dict[Item, Entry | None] = {}
        # When the store was asked what a queued row says, where a reader said (record's
        # `at`): its written_at. Others are stamped when written, as writes are.
        self._asked: dict[Item, datetime] = {}
        self._task: asyncio.Task[None] | None = None
        self._wanted: dict[Item, asyncio.Future[Entry | None]] = {}
        self._finder: asyncio.Task[None] | None = None
        self._wake: asyncio.Future[None] | None = None  # ends the pause before a write
        self._writing: dict[Item, _Writing] = {}  # the newest change of each key under way
        self._now: set[asyncio.Task[None]] = set()  # record_now's transactions

    async def lookup(self, mount_id: int, key: str) -> Entry | None:
        """The key's row (None: none, or the database is unavailable). The lookups of one turn
        of the event loop are one query: a connection and a transaction each cost more than
        the row, and concurrent cold readers would queue for the pool's connections."""
        item = (mount_id, key)
        if item in self._queued:
            return self._queued[item]
        writing = self._writing.get(item)
        if writing is not None:
            return writing.entry
        wanted = self._wanted.get(item)
        if wanted is None:
            wanted = asyncio.get_running_loop().create_future()
            self._wanted[item] = wanted
            if self._finder is None:
                self._finder = asyncio.create_task(self._find())
        return await asyncio.shield(wanted)

    async def _find(self) -> None:
        batch: dict[Item, asyncio.Future[Entry | None]] = {}
        try:
            while self._wanted:
                await asyncio.sleep(0)  # the lookups of this turn of the loop join in
                batch = {item: self._wanted.pop(item) for item in list(self._wanted)[:BATCH]}
                try:
                    found = await self._meta.find_versions(list(batch))
                except MetaUnavailable as exc:
                    log.warning("could not look up the versions of %d objects: %s", len(batch), exc)
                    found = {}
                except Exception as exc:
                    for wanted in batch.values():
                        wanted.set_exception(exc)
                        wanted.add_done_callback(_retrieved)
                    continue
                for item, wanted in batch.items():
                    row = found.get(item)
                    wanted.set_result(None if row is None else Entry(*row))
        finally:
            self._finder = None
            # Cancelled (at close): nobody is left without an answer.
            for wanted in [*batch.values(), *self._wanted.values()]:
                if not wanted.done():
                    wanted.set_result(None)

    async def keys_after(self, mount_id: int, key: str, limit: int) -> list[str]:
        """Up to `limit` keys with a row, after `key` in key order ([]: the database is
        unavailable)."""
        try:
            return await self._meta.version_keys_after(mount_id, key, limit)
        except MetaUnavailable as exc:
            log.warning("could not list the versions after %r: %s", key, exc)
            return []

    async def lookup_many(self, mount_id: int, keys: Sequence[str]) -> dict[str, Entry]:
        """The rows of many keys in one query, as lookup() gives each: a key with a change
        queued or being written is left out (its row is not yet what was learnt)."""
        try:
            found = await self._meta.find_versions([(mount_id, key) for key in keys])
        except MetaUnavailable as exc:
            log.warning("could not look up the versions of %d objects: %s", len(keys), exc)
            return {}
        return {
            key: Entry(*row)
            for (_, key), row in found.items()
            if (mount_id, key) not in self._queued and (mount_id, key) not in self._writing
        }

    def record(
        self,
        mount_id: int,
        key: str,
        info: ObjectInfo | None,
        complete: bool = True,
        at: datetime | None = None,
    ) -> None:
        """Make `info` the key's row, or with None remove it: queued, written with others.
        `at`: when the store was asked what the row says (a read trusts the row for the
        mount's TTL from then); now when not given."""
        item = (mount_id, key)
        self._queued.pop(item, None)  # to the back: after what came before it
        self._queued[item] = None if info is None else Entry(info, complete, at or _utcnow())
        if at is not None and info is not None:
            self._asked[item] = at
        else:
            self._asked.pop(item, None)
        if self._task is None:
            self._task = asyncio.create_task(self._drain())
        elif len(self._queued) >= BATCH:
            self._hurry()

    async def record_now(
        self,
        mount_id: int,
        key: str,
        info: ObjectInfo | None,
        complete: bool = True,
        also: Sequence[sa.Executable] = (),
        at: datetime | None = None,
    ) -> None:
        """`record`, written at once, with the statements `also` in the same transaction;
        returns when it is over. A change of the key still queued is older: this one replaces
        it, so it is never written after this. A change of the key being written is waited
        for. A failure is logged, never raised (the store has the write; the catalog catches
        up at its next crawl), and the caller's cancellation does not stop the transaction."""
        item = (mount_id, key)
        entry = None if info is None else Entry(info, complete, at or _utcnow())
        stamps = {item: at} if at is not None and info is not None else None
        await self._ordered(item, entry, [(mount_id, key, info, complete)], also, stamps)

    async def doubt(self, mount_id: int, key: str) -> None:
        """The row's version was not found at the store: listed still, but not trusted for
        reads until the store has been asked again."""
        v = object_versions
        query = sa.update(v).where(v.c.mount_id == mount_id, v.c.key == key)
        await self._ordered((mount_id, key), None, [], [query.values(complete=False)])

    async def _ordered(
        self,
        item: Item,
        entry: Entry | None,
        changes: list[tuple[int, str, ObjectInfo | None, bool]],
        also: Sequence[sa.Executable],
        stamps: dict[Item, datetime] | None = None,
    ) -> None:
        self._queued.pop(item, None)
        self._asked.pop(item, None)
        earlier = self._writing.get(item)
        writing = self._writing[item] = _Writing(entry)
        task = asyncio.create_task(self._now_write(item, writing, earlier, changes, also, stamps))
        self._now.add(task)
        task.add_done_callback(self._now.discard)
        await asyncio.shield(task)

    async def _now_write(
        self,
        item: Item,
        writing: _Writing,
        earlier: _Writing | None,
        changes: list[tuple[int, str, ObjectInfo | None, bool]],
        also: Sequence[sa.Executable],
        stamps: dict[Item, datetime] | None,
    ) -> None:
        try:
            if earlier is not None:
                await asyncio.shield(earlier.done)
            await self._meta.record_versions(changes, also=also, stamps=stamps)
        except (MetaUnavailable, sa_exc.IntegrityError) as exc:  # or the mount removed meanwhile
            log.warning("bookkeeping of the change of %s not recorded: %s", item[1], exc)
        except Exception:
            log.exception("bookkeeping of the change of %s not recorded", item[1])
        finally:
            if self._writing.get(item) is writing:
                del self._writing[item]
            writing.done.set_result(None)

    async def apply_now(self, statements: Sequence[sa.Executable]) -> None:
        """Statements of a write's bookkeeping with no row to them, in one transaction of
        their own that the caller's cancellation does not stop; a failure is logged."""
        task = asyncio.create_task(self._apply(statements))
        self._now.add(task)
        task.add_done_callback(self._now.discard)
        await asyncio.shield(task)

    async def _apply(self, statements: Sequence[sa.Executable]) -> None:
        try:
            await self._meta.record_versions([], also=statements)
        except (MetaUnavailable, sa_exc.IntegrityError) as exc:
            log.warning("bookkeeping of a write not recorded: %s", exc)
        except Exception:
            log.exception("bookkeeping of a write not recorded")

    @property
    def pending(self) -> int:
        return len(self._queued)

    async def _drain(self) -> None:
        try:
            while self._queued:
                # The requests running now, and those of the next `delay`, add theirs.
                await self._pause()
                batch = []
                stamps = {}
                for item in list(self._queued)[:BATCH]:
                    batch.append((*item, self._queued.pop(item)))
                    if (asked := self._asked.pop(item, None)) is not None:
                        stamps[item] = asked
                await self._write_after(batch, stamps)
        finally:
            self._task = None

    async def _write_after(
        self, batch: list[tuple[int, str, Entry | None]], stamps: dict[Item, datetime]
    ) -> None:
        """Write the batch after the changes of its keys already under way (record_now's)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        earlier = []
        for mount_id, key, entry in batch:
            before = self._writing.get((mount_id, key))
            if before is not None:
                earlier.append(before.done)
            self._writing[(mount_id, key)] = _Writing(entry, done)
        try:
            for wait in earlier:
                await asyncio.shield(wait)
            await self._write([_change(*one) for one in batch], stamps)
        finally:
            items = [(mount_id, key) for mount_id, key, _ in batch]
            for item in items:
                if (current := self._writing.get(item)) is not None and current.done is done:
                    del self._writing[item]
            if not done.done():
                done.set_result(None)

    async def _write(
        self,
        batch: list[tuple[int, str, ObjectInfo | None, bool]],
        stamps: dict[Item, datetime],
    ) -> None:
        try:
            await self._meta.record_versions(batch, stamps=stamps)
        except MetaUnavailable as exc:
            log.warning("could not persist the versions of %d objects: %s", len(batch), exc)
        except sa_exc.IntegrityError:
            # A mount removed meanwhile fails its rows, and with them the whole batch: write
            # the rest one by one.
            for change in batch:
                try:
                    await self._meta.record_versions([change], stamps=stamps)
                except (MetaUnavailable, sa_exc.IntegrityError) as exc:
                    log.info("version of %s not persisted: %s", change[1], exc)
        except Exception:
            log.exception("could not persist the versions of %d objects", len(batch))

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
        tasks = [*self._now, *([self._task] if self._task is not None else [])]
        if not tasks:
            return
        _, late = await asyncio.wait(tasks, timeout=wait)
        for task in late:
            task.cancel()
        if late:
            log.warning("versions of %d objects not persisted at shutdown", len(self._queued))


def _change(
    mount_id: int, key: str, entry: Entry | None
) -> tuple[int, str, ObjectInfo | None, bool]:
    return (mount_id, key, None, True) if entry is None else (mount_id, key, *entry[:2])


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _retrieved(future: asyncio.Future[Entry | None]) -> None:
    future.exception()  # every waiter may have gone: not "never retrieved"
