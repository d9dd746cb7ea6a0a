"""The one authority on "which version of this key is current, and is it cached".

`Versions` decides, for every read, write, peer, load and notification: what is current (the
worker's memory within the mount's TTL, the node's shared record of what its workers learnt,
the database's row of the key, or the store, asked once for concurrent askers), whether the
node knows nothing of a key (a cold read then opens it: its version with its block 0, in one
store request), and what a change seen anywhere does to all of those. Behind it sit the
in-process cache with the node's change counters (metadata.py, generations.py, learnt.py),
`VersionRows` (the database's `object_versions` rows, read and written in batches) and the
catalog's synced prefixes (which rows a read may trust without asking the store).

Rows (gateway.meta.versions) are kept for immutable mounts (`metadata_ttl=-1`), so that a
restarted node still knows their versions, and for every key of a `catalog=on` mount, which its
listings answer from. A row of a key under a synced prefix, or of an immutable mount, is the
version a read trusts, if `complete` (a crawl's row knows only what a listing tells).

`VersionRows` queues what reads of immutable mounts learn and writes one transaction `delay`
(0.25 s) after the first of them, so that the misses of that time share it (a transaction
costs ~0.5-1 ms of CPU, a row little). A crash loses at most what was learnt in that time,
which the next miss learns again. The lookups of one turn of the event loop are one query. A
version a read learnt under a catalog's synced prefix (a listing-only row completed, or a row
corrected after a change behind the gateway's back) and a write through the gateway are
written at once (`record_now`), in one transaction with the statements given (a completed
upload's removal), and return once that transaction is over. Changes to one key are written
in the order they were made (a later change replaces a queued one, and waits for an older one
being written), so a delete is never overtaken by the miss that came before it, and a lookup
sees a queued change, or one being written, before the database does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from gateway import counters, errors
from gateway.cache import PageStore
from gateway.catalog.catalog import Catalog
from gateway.meta import MetaStore, MetaUnavailable
from gateway.meta.versions import object_versions
from gateway.service.metadata import MetadataCache
from gateway.service.namespace import MountHandle
from gateway.service.revalidation import Revalidator
from gateway.service.store_errors import store_errors
from gateway.stores import ObjectInfo
from gateway.stores.etags import same

log = logging.getLogger("gateway.service")

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

    def record(
        self, mount_id: int, key: str, info: ObjectInfo | None, complete: bool = True
    ) -> None:
        """Make `info` the key's row, or with None remove it: queued, written with others."""
        item = (mount_id, key)
        self._queued.pop(item, None)  # to the back: after what came before it
        self._queued[item] = None if info is None else Entry(info, complete, _utcnow())
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
    ) -> None:
        """`record`, written at once, with the statements `also` in the same transaction;
        returns when it is over. A change of the key still queued is older: this one replaces
        it, so it is never written after this. A change of the key being written is waited
        for. A failure is logged, never raised (the store has the write; the catalog catches
        up at its next crawl), and the caller's cancellation does not stop the transaction."""
        entry = None if info is None else Entry(info, complete, _utcnow())
        await self._ordered((mount_id, key), entry, [(mount_id, key, info, complete)], also)

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
    ) -> None:
        self._queued.pop(item, None)
        earlier = self._writing.get(item)
        writing = self._writing[item] = _Writing(entry)
        task = asyncio.create_task(self._now_write(item, writing, earlier, changes, also))
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
    ) -> None:
        try:
            if earlier is not None:
                await asyncio.shield(earlier.done)
            await self._meta.record_versions(changes, also=also)
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
                for item in list(self._queued)[:BATCH]:
                    batch.append((*item, self._queued.pop(item)))
                await self._write_after(batch)
        finally:
            self._task = None

    async def _write_after(self, batch: list[tuple[int, str, Entry | None]]) -> None:
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
            await self._write([_change(*one) for one in batch])
        finally:
            items = [(mount_id, key) for mount_id, key, _ in batch]
            for item in items:
                if (current := self._writing.get(item)) is not None and current.done is done:
                    del self._writing[item]
            if not done.done():
                done.set_result(None)

    async def _write(self, batch: list[tuple[int, str, ObjectInfo | None, bool]]) -> None:
        try:
            await self._meta.record_versions(batch)
        except MetaUnavailable as exc:
            log.warning("could not persist the versions of %d objects: %s", len(batch), exc)
        except sa_exc.IntegrityError:
            # A mount removed meanwhile fails its rows, and with them the whole batch: write
            # the rest one by one.
            for change in batch:
                try:
                    await self._meta.record_versions([change])
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


class Versions:
    """Which version of a key is current, and whether the node knows it (see the module)."""

    def __init__(
        self,
        metadata: MetadataCache,
        rows: VersionRows,
        catalog: Catalog,
        pages: PageStore,
        revalidator: Revalidator,
    ) -> None:
        self.metadata = metadata
        self.rows = rows
        self.catalog = catalog
        self.pages = pages
        self.revalidator = revalidator
        self._asking: dict[tuple[int, str], asyncio.Future[ObjectInfo]] = {}
        self._asking_ids: dict[tuple[int, str, str], asyncio.Future[ObjectInfo]] = {}

    # -- what is current ------------------------------------------------------------------------

    def fresh(self, handle: MountHandle, key: str, now: float | None = None) -> ObjectInfo | None:
        """The version known within the mount's TTL, with no I/O (the hit path), or None."""
        now = time.monotonic() if now is None else now
        return self.metadata.fresh(handle.id, key, handle.ttl, now)

    def hint(self, mount_id: int, key: str) -> ObjectInfo | None:
        """The last version known on this node, however old: a hint, checked with the store."""
        return self.metadata.peek(mount_id, key)

    def ticket(self, handle: MountHandle, key: str) -> int:
        """What a question about the key asked next is answered under (MetadataCache.ticket):
        taken by a writer before it sends its write to the store."""
        return self.metadata.ticket(handle.id, key)

    async def current(self, handle: MountHandle, key: str) -> ObjectInfo:
        """The key's current version, per the mount's TTL; no I/O when fresh in-process.
        Concurrent askers of one key make one lookup (and at most one store request), unless
        the key changed between their asking: a request never takes the answer to a question
        sent before a change it could know of (read-after-write and read-after-delete)."""
        now = time.monotonic()
        ticket = self.metadata.ticket(handle.id, key)
        info = self.metadata.fresh(handle.id, key, handle.ttl, now)
        if info is not None:
            return info
        if handle.ttl == 0:
            # "Always revalidate": a request must not take the answer to one sent before it.
            return await self._revalidate(handle, key, now, ticket)
        return await joined(
            self._asking,
            (handle.id, key, ticket),
            lambda: self._revalidate(handle, key, now, ticket),
        )

    async def _revalidate(
        self, handle: MountHandle, key: str, now: float, ticket: int
    ) -> ObjectInfo:
        previous = self.metadata.peek(handle.id, key)
        if previous is None and await self._remembered(handle, key, ticket):
            found = self.metadata.peek(handle.id, key)
            assert found is not None
            return found
        try:
            info = None
            if previous is not None and self._covered(handle, key):
                # A synced prefix's row (a crawl or a notification may have news).
                trusted = await self._trusted(handle, key)
                if trusted is not None:
                    info, age = trusted
                    now -= age
            if info is None and previous is not None:
                # A listing of its prefix within the TTL (or made now: many of the prefix
                # are past their TTL) confirms the version held, or says it is gone.
                listed = await self.revalidator.find(handle, key)
                if listed is not None:
                    if listed.etag is None:
                        counters.revalidated("listing", "gone")
                        raise errors.NoSuchKey(Key=key)
                    if same(listed.etag, previous.etag) and listed.size == previous.size:
                        counters.revalidated("listing", "fresh")
                        info = previous
                        now -= max(0.0, time.time() - listed.at)
                    else:
                        counters.revalidated("listing", "changed")  # asked alone below
            if info is None:
                with store_errors(key):
                    info = await handle.store.stat(key)
                if previous is not None:
                    counters.revalidated("head", "fresh" if same(previous.etag, info.etag)
                                         else "changed")  # fmt: skip
                await self._learnt_row(handle, key, info, previous, ticket)
        except errors.NoSuchKey:
            await self.gone(handle, key, ticket)
            raise
        except errors.ServiceUnavailable:
            if previous is None:
                raise
            # The store cannot be asked: serve the version we know (stale-if-error) rather
            # than fail readers of cached data; it is revalidated once the store answers.
            log.warning("store unavailable, serving last known version of %s", key)
            return previous
        self.metadata.put(handle.id, key, info, now, ticket)
        if previous is not None and not same(previous.etag, info.etag):
            self._invalidate(handle, previous)
        return info

    async def revalidating(self, handle: MountHandle, keys: list[str]) -> None:
        """Many keys are about to be asked for past their TTL (a lease renewal): those this
        node holds a version of are spanned by listings of their prefixes first, so that each
        is answered from a listing rather than a request of its own."""
        held = [k for k in keys if self.metadata.peek(handle.id, k) is not None]
        await self.revalidator.cover(handle, held)

    def remaining(self, handle: MountHandle, key: str) -> float:
        """How much longer the version known of the key is fresh, in seconds (-1: for good, on
        an immutable mount): a lease handed to a client lasts no longer than what the node
        knows, so a read is never more than one TTL behind the store."""
        if handle.ttl < 0:
            return -1.0
        age = self.metadata.age(handle.id, key, time.monotonic())
        return handle.ttl if age is None else max(0.0, handle.ttl - age)

    async def unknown(self, handle: MountHandle, key: str) -> bool:
        """Whether this node knows nothing of the key's version: not in memory (this worker's
        or the node's shared record), no trusted row of it under a catalog's synced prefix,
        no block 0 of it in its cache (kept before a restart, or by another worker: then the
        row of an immutable mount, or else the store's metadata, tells its version).

        The database is not asked for a key whose block 0 is not cached here (but under a
        synced prefix): the read needs a store request for that block either way, and opening
        is that one request (its version with the bytes), where a lookup first cost a
        transaction per cold miss (docs/architecture.md, "Counting the miss path"). Several
        workers opening one key make one request: the open claim (generations.OpenClaims)
        holds the others until the version is in the node's shared record."""
        ticket = self.metadata.ticket(handle.id, key)
        if self.metadata.peek(handle.id, key) is not None:
            return False
        if self._covered(handle, key) and await self._remembered(handle, key, ticket):
            return False
        if handle.cache_enabled and await self.pages.cached_version(handle.id, key):
            return False
        # Looked at again after the awaits above: a cold read that began and ended meanwhile
        # has told the version, and another would fetch block 0 again.
        return self.metadata.peek(handle.id, key) is None

    async def addressed(self, handle: MountHandle, key: str, version_id: str) -> ObjectInfo:
        """The version of the key a request names by id. Of a store that keeps versions, asked
        of it once and then known for good (a version never changes) until the key is written
        or deleted through the gateway; concurrent askers make one request. A store that keeps
        one version has only "null", the current one (as S3's never-versioned buckets)."""
        if not handle.store.versions:
            if version_id == "null":
                return await self.current(handle, key)
            raise errors.InvalidArgument(
                "Invalid version id specified", ArgumentName="versionId", ArgumentValue=version_id
            )
        info = self.metadata.version(handle.id, key, version_id)
        if info is not None:
            return info

        ticket = self.metadata.ticket(handle.id, key)

        async def ask() -> ObjectInfo:
            with store_errors(key):
                found = await handle.store.stat_version(key, version_id)
            self.metadata.put_version(handle.id, key, found, ticket)
            return found

        return await joined(self._asking_ids, (handle.id, key, version_id, ticket), ask)

    # -- what was seen --------------------------------------------------------------------------

    async def opened(self, handle: MountHandle, key: str, info: ObjectInfo, ticket: int) -> None:
        """This node opened the key at its store (the version with its block 0), asked under
        `ticket`: known to the node's other workers before its open claim goes
        (reads._open_once), unless the key changed meanwhile."""
        if self.metadata.put(handle.id, key, info, time.monotonic(), ticket):
            await self.metadata.published(handle.id, key)
            await self._learnt_row(handle, key, info, None, ticket)

    def told(self, handle: MountHandle, key: str, info: ObjectInfo, ticket: int) -> None:
        """A peer that opened the key, asked under `ticket`, told its version."""
        self.metadata.put(handle.id, key, info, time.monotonic(), ticket)

    async def gone(self, handle: MountHandle, key: str, ticket: int | None = None) -> None:
        """The store has no such key (asked under `ticket`; None: as of now). An answer from
        before a change of the key changes no row: the change has its own."""
        if ticket is not None and self.metadata.ticket(handle.id, key) != ticket:
            return  # a write through the node since: its version is the news, not this
        self.metadata.forget(handle.id, key)
        if self._covered(handle, key):
            await self.rows.record_now(handle.id, key, None)  # listed no more, fleet-wide
        elif handle.ttl < 0:
            self.rows.record(handle.id, key, None)

    async def doubt(self, handle: MountHandle, key: str) -> None:
        """The version known was not found at the store (it changed under a read)."""
        self.metadata.forget(handle.id, key)
        if self._kept(handle, key):
            await self.rows.doubt(handle.id, key)

    def forget(self, mount_id: int, key: str, handle: MountHandle | None = None) -> None:
        """The key changed (a peer or a notification said so): what this node knows of its
        old version goes, its blocks with it, and the node's other workers hear of it."""
        previous = self.metadata.peek(mount_id, key)
        if handle is not None and previous is not None:
            self._invalidate(handle, previous)
        self.metadata.forget(mount_id, key)

    async def noticed(self, handle: MountHandle, key: str, info: ObjectInfo | None) -> None:
        """A store's notification: `info` is the key's version as its store says now (None:
        it has none). Its row takes it, and this node forgets the old one."""
        await self.rows.record_now(handle.id, key, info)
        self.forget(handle.id, key, handle)

    async def written(
        self,
        handle: MountHandle,
        key: str,
        info: ObjectInfo | None,
        ticket: int | None,
        remember: bool = True,
        also: Sequence[sa.Executable] = (),
    ) -> None:
        """A write through this node made `info` the key's version (None: deleted it); the
        writer took `ticket` before sending it to the store. The old version is forgotten at
        once, by every worker of the node (its blocks too, unless `info` is that version,
        remembered). The new one is trusted by reads only if no other change of the key was
        heard of since `ticket` (None: not trusted): two writes of a key at once leave the
        store's word, not the last answer's, to the next read. remember=False keeps the new
        version's metadata out of every cache (SSE-C: a HEAD without the key must reach the
        store, which refuses it): a catalog lists it by an incomplete row, no read trusts it.

        The row and the statements `also` are one transaction, committed before this returns
        when there is more than the row of an immutable mount (which is queued); a failure of
        it is logged, not the client's (the store has the write)."""
        previous = self.metadata.peek(handle.id, key)
        if previous is not None and (
            info is None or not remember or not same(previous.etag, info.etag)
        ):
            self._invalidate(handle, previous)
        after = self.metadata.forget(handle.id, key)
        if info is not None and remember and ticket is not None:
            # Our own change is the one since `ticket`, or there was another.
            alone = after == (ticket + 1) & 0xFFFF_FFFF_FFFF_FFFF
            self.metadata.put(handle.id, key, info, time.monotonic(), after if alone else ticket)
        if handle.catalog is not None:  # listed through every node from now on
            await self.rows.record_now(handle.id, key, info, remember, also)
        elif handle.ttl < 0 and also:
            await self.rows.record_now(handle.id, key, info if remember else None, True, also)
        elif handle.ttl < 0:
            self.rows.record(handle.id, key, info if remember else None)
        elif also:
            await self.rows.apply_now(also)

    # -- the parts ------------------------------------------------------------------------------

    def _covered(self, handle: MountHandle, key: str) -> bool:
        """Whether the key is under a synced prefix of the mount's catalog."""
        return handle.catalog is not None and self.catalog.covers(handle.id, key)

    def _kept(self, handle: MountHandle, key: str) -> bool:
        """Whether the key's version is kept in a row: an immutable mount's, or a catalog's."""
        return handle.ttl < 0 or handle.catalog is not None

    async def _trusted(self, handle: MountHandle, key: str) -> tuple[ObjectInfo, float] | None:
        """The key's row if a read may take it for the current version, asked of no store,
        with its age in seconds: a row that knows the whole version, written within the
        mount's TTL (an immutable mount's, TTL -1: whenever). A catalog is for listings; the
        bytes of its keys are as fresh as any mount's."""
        entry = await self.rows.lookup(handle.id, key)
        if entry is None or not entry.complete:
            return None
        age = max(0.0, (_utcnow() - entry.at).total_seconds())
        if handle.ttl >= 0 and age >= handle.ttl:
            return None
        return entry.info, age

    async def _remembered(self, handle: MountHandle, key: str, ticket: int) -> bool:
        """An immutable mount's row, or a synced prefix's: taken into the in-process cache if
        there is one a read may trust (looked up under `ticket`), as learnt when written."""
        if handle.ttl >= 0 and not self._covered(handle, key):
            return False
        trusted = await self._trusted(handle, key)
        if trusted is None:
            return False
        info, age = trusted
        return self.metadata.put(handle.id, key, info, time.monotonic() - age, ticket)

    async def _learnt_row(
        self,
        handle: MountHandle,
        key: str,
        info: ObjectInfo,
        previous: ObjectInfo | None,
        ticket: int,
    ) -> None:
        """The store told the key's version, asked under `ticket`. Under a synced prefix its
        row takes it before the answer (the catalog lists the truth through every node from
        then on: a row completed, or corrected after a change behind the gateway's back); an
        immutable mount's row is queued when it is news. An answer from before a change of
        the key through the node writes no row: that change wrote its own."""
        if self.metadata.ticket(handle.id, key) != ticket:
            return
        if self._covered(handle, key):
            if previous is not None and same(previous.etag, info.etag):
                self.rows.record(handle.id, key, info)  # the same version, seen again now
            else:
                await self.rows.record_now(handle.id, key, info)
        elif handle.ttl < 0 and (previous is None or not same(previous.etag, info.etag)):
            self.rows.record(handle.id, key, info)

    def _invalidate(self, handle: MountHandle, info: ObjectInfo) -> None:
        """Forget the cached blocks of this version on this node."""
        self.pages.invalidate(handle.id, info.key, info.etag, info.size, handle.block_size)


async def joined(
    table: dict[Any, asyncio.Future[ObjectInfo]],
    at: Any,
    ask: Callable[[], Awaitable[ObjectInfo]],
) -> ObjectInfo:
    """One `ask()` for concurrent callers with the same `at`: the first starts it (in `table`
    while it runs), the others wait for its answer; none of them cancels it by leaving."""
    pending = table.get(at)
    if pending is None:
        pending = asyncio.ensure_future(ask())
        table[at] = pending

        def done(future: asyncio.Future[ObjectInfo]) -> None:
            table.pop(at, None)
            if not future.cancelled():
                future.exception()  # retrieved here: every waiter may have gone

        pending.add_done_callback(done)
    return await asyncio.shield(pending)
