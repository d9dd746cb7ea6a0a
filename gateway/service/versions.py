"""The one authority on "which version of this key is current, and is it cached".

`Versions` decides, for every read, write, peer, load and notification: what is current (the
worker's memory within the mount's TTL, the node's shared record of what its workers learnt,
the database's row of the key, a listing of its prefix, or the store, asked once for
concurrent askers), and opens a key the node knows nothing of (`open`: its version with its
block 0, in one store request, single flight across the node's requests, workers and fleet),
and what a change seen anywhere does to all of those. Behind it sit the in-process cache with
the node's change counters (metadata.py, generations.py, learnt.py), revalidation in bulk
(revalidation.py), `VersionRows` (version_rows.py: the database's `object_versions` rows, the
one writer of them) and the catalog's synced prefixes (which rows a read may trust without
asking the store), and the moves of an open (opening.py).

A read asks three verbs: `open` (None when the version is known), `current`, and `changed`
when the store says the version it read is gone or replaced.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from gateway import counters, errors
from gateway.cache import Fills, PageStore
from gateway.catalog.catalog import Catalog
from gateway.cluster.peers import Fleet, PeerUnavailable
from gateway.generations import OpenClaims
from gateway.service.listed import Listed
from gateway.service.metadata import MetadataCache
from gateway.service.namespace import MountHandle
from gateway.service.opening import Opened, from_peer, from_store, openers, sibling_opened
from gateway.service.revalidation import Revalidator
from gateway.service.store_errors import store_errors
from gateway.service.version_rows import VersionRows
from gateway.stores import ObjectInfo
from gateway.stores.etags import same

log = logging.getLogger(__name__)

# Keys after one an immutable mount's read found only in its row, whose rows are read with it
# (Versions._neighbours): a restarted node's epoch asks the database once per this many keys.
NEIGHBOURS = 1000
NEIGHBOURS_SHARED = 100  # of those, shared with the node's workers in one write


class Versions:
    """Which version of a key is current, and whether the node knows it (see the module)."""

    def __init__(
        self,
        metadata: MetadataCache,
        rows: VersionRows,
        catalog: Catalog,
        pages: PageStore,
        revalidator: Revalidator,
        fills: Fills,
        fleet: Fleet | None = None,
        claims: OpenClaims | None = None,
    ) -> None:
        self.metadata = metadata
        self.rows = rows
        self.catalog = catalog
        self.pages = pages
        self.revalidator = revalidator
        self._fills = fills
        self._fleet = fleet
        self._claims = claims  # None with one worker: nobody to share an open with
        self._opening: dict[tuple[int, str], asyncio.Future[None]] = {}
        self._asking: dict[tuple[int, str], asyncio.Future[ObjectInfo]] = {}
        self._asking_ids: dict[tuple[int, str, str], asyncio.Future[ObjectInfo]] = {}
        self._neighbouring: dict[int, asyncio.Task[None]] = {}  # by mount: one at a time

    # -- what is current ------------------------------------------------------------------------

    def fresh(self, handle: MountHandle, key: str, now: float | None = None) -> ObjectInfo | None:
        """The version known within the mount's TTL, with no I/O (the hit path), or None."""
        now = time.monotonic() if now is None else now
        if handle.ttl <= 0:
            return self.metadata.fresh(handle.id, key, handle.ttl, now)
        # Past its TTL, a version a listing within the TTL told (one this process has read,
        # no query) is fresh again from the listing's time, as `current` would find it.
        kept = self.revalidator.kept

        def listed(etag: str, size: int) -> float | None:
            found = kept(handle, key)
            if found is None or not _tells(found[0], etag, size):
                return None
            counters.revalidated("listing", "fresh")
            return found[1]

        return self.metadata.fresh(handle.id, key, handle.ttl, now, listed)

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
        info = self.fresh(handle, key, now)
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
        # Known since the asker found nothing fresh: a sibling worker shared it (a restarted
        # node's neighbours' rows), or an ask ahead of this one learnt it. Taken, not asked
        # again: a version known for good (an immutable mount's) would else be asked of the
        # store as though past its TTL.
        known = self.fresh(handle, key)
        if known is not None:
            return known
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
                        # Not listed: asked alone below before it is answered 404. Deletes
                        # are rare, and a listing that missed a key (a store that lists
                        # lazily) must never turn data that is there into a 404.
                        counters.revalidated("listing", "gone")
                    elif _lists(listed, previous):
                        counters.revalidated("listing", "fresh")
                        info = previous
                        now -= max(0.0, time.time() - listed.at)
                    else:
                        counters.revalidated("listing", "changed")  # asked alone below
            if info is None:
                asked = time.monotonic()
                with store_errors(key):
                    info = await handle.store.stat(key)
                if previous is not None:
                    counters.revalidated("head", "fresh" if same(previous.etag, info.etag)
                                         else "changed")  # fmt: skip
                await self._learnt_row(handle, key, info, previous, ticket, asked)
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
        held = {}
        for key in keys:
            info = self.metadata.peek(handle.id, key)
            if info is not None:
                held[key] = (info, self.metadata.ticket(handle.id, key))
        if len(held) <= 1:
            return
        await self.revalidator.cover(handle, list(held))
        # The keys listed as the version held are fresh again from the listing's time, all
        # at once (one write to the workers' shared record); the others are asked one by one
        # by their readers (changed, gone, or not spanned).
        listed = self.revalidator.lookup_many(handle, list(held))
        wall, now = time.time(), time.monotonic()
        fresh = []
        for key, found in listed.items():
            previous, ticket = held[key]
            if _lists(found, previous):
                fresh.append((key, previous, now - max(0.0, wall - found.at), ticket))
        if fresh:
            self.metadata.put_many(handle.id, fresh)
            counters.revalidated("listing", "fresh", len(fresh))

    def remaining(self, handle: MountHandle, key: str) -> float:
        """How much longer the version known of the key is fresh, in seconds (-1: for good, on
        an immutable mount): a lease handed to a client lasts no longer than what the node
        knows, so a read is never more than one TTL behind the store."""
        if handle.ttl < 0:
            return -1.0
        age = self.metadata.age(handle.id, key, time.monotonic())
        return handle.ttl if age is None else max(0.0, handle.ttl - age)

    async def _unknown(self, handle: MountHandle, key: str) -> bool:
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
            # Block 0 is here, but a sibling worker still holding its open claim has not told
            # the version yet (its fill committed first, its share retried while the record
            # was busy): open() waits for it, where the store would be asked instead.
            claims = self._claims
            return (
                claims is not None
                and not claims.free(claims.byte(handle.id, key))
                and self.metadata.peek(handle.id, key) is None
            )
        # Looked at again after the awaits above: a cold read that began and ended meanwhile
        # has told the version, and another would fetch block 0 again.
        return self.metadata.peek(handle.id, key) is None

    async def open(
        self,
        handle: MountHandle,
        key: str,
        *,
        here: bool = False,
        pinned: bool | None = None,
        force: bool = False,
        preload: bool = False,
    ) -> Opened | None:
        """The key opened when this node knows no version of it (`force`: even so, the one it
        knew being gone from the store): its version and block 0's bytes from one request,
        made by the peer that owns block 0 or, `here` (a peer's open) or when this node owns
        it, by this node's store, block 0 filled into its pages on the way. Single flight:
        one open of a key for the node's requests and workers (an open claim), the others wait
        and then find it known. None when the version is known, or became known while another
        request opened it: current() answers then, with no I/O. `pinned`: block 0 is kept
        pinned (a preload with --pin); None: as the mount says. `preload`: a preload job opens
        (its fill of block 0 is counted as the preload's, not as a client's miss)."""
        if not force and not await self._unknown(handle, key):
            return None
        at = (handle.id, key)
        opening = self._opening.get(at)
        if opening is not None:
            await asyncio.shield(opening)
            return None
        opening = asyncio.get_running_loop().create_future()
        self._opening[at] = opening
        claims, claimed = self._claims, -1
        try:
            if claims is not None:
                # One worker of the node opens the key; the others wait for it to have told
                # the version (learnt.py) and then follow its fill of block 0.
                byte = claims.byte(handle.id, key)
                if claims.take(byte):
                    claimed = byte
                    # A sibling may have opened it and let go between this request finding
                    # the key unknown and the claim: its version is known then, not fetched.
                    if self.fresh(handle, key):
                        return None
                elif await sibling_opened(claims, byte):
                    return None
            ticket = self.metadata.ticket(handle.id, key)
            # The version is learnt as of when it was asked for, not when the answer came: the
            # store may have had a newer one by then, and a loaded node or store can take
            # seconds to answer (a read is never more than one TTL behind the store).
            asked = time.monotonic()
            if handle.cache_enabled and not here:
                for node in openers(self._fleet, handle, key):
                    assert self._fleet is not None
                    asked = time.monotonic()
                    try:
                        info, head = await from_peer(self._fleet, node, handle, key)
                    except PeerUnavailable as exc:
                        log.warning("peer failed to open %s, trying the next: %s", key, exc)
                        continue
                    self.metadata.put(handle.id, key, info, asked, ticket)
                    return Opened(info, head, "forward")
                asked = time.monotonic()
            # Block 0's fill is claimed (its first bytes in) before the version is told to
            # this node's other workers: one that learnt it first could claim block 0 itself
            # and fetch it a second time while this fill, following that one, drops the bytes
            # it opened with.
            info, head = await from_store(self._fills, handle, key, pinned, preload)
            try:
                await self._opened(handle, key, info, ticket, asked)
            except BaseException:
                await head.aclose()
                raise
            return Opened(info, head, "miss" if handle.cache_enabled else "bypass")
        finally:
            if claimed >= 0:
                assert claims is not None
                claims.drop(claimed)
            del self._opening[at]
            # Waiters go again: with the version known they join the fill of block 0, which
            # is in flight now (the head is primed); if this failed, one of them tries anew.
            opening.set_result(None)

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

    async def _opened(
        self, handle: MountHandle, key: str, info: ObjectInfo, ticket: int, asked: float
    ) -> None:
        """This node opened the key at its store (the version with its block 0), asked under
        `ticket` at `asked` (monotonic): known to the node's other workers before its open
        claim goes, unless the key changed meanwhile."""
        if self.metadata.put(handle.id, key, info, asked, ticket):
            await self.metadata.published(handle.id, key)
            await self._learnt_row(handle, key, info, None, ticket, asked)

    async def changed(
        self, handle: MountHandle, key: str, seen: BaseException, ticket: int | None = None
    ) -> None:
        """The store said the version a read had (asked under `ticket`) is not what it has:
        gone (NoSuchKey) or replaced (VersionChanged) since it was learnt."""
        if isinstance(seen, errors.NoSuchKey):
            await self.gone(handle, key, ticket)
        else:
            await self.doubt(handle, key)

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
        if handle.ttl < 0 and handle.id not in self._neighbouring:
            task = asyncio.create_task(self._neighbours(handle, key))
            self._neighbouring[handle.id] = task
            task.add_done_callback(lambda done: self._neighboured(handle.id, done))
        return self.metadata.put(handle.id, key, info, time.monotonic() - age, ticket)

    def _neighboured(self, mount_id: int, task: asyncio.Task[None]) -> None:
        self._neighbouring.pop(mount_id, None)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("could not read the versions of a key's neighbours: %r", exc)

    async def _neighbours(self, handle: MountHandle, key: str) -> None:
        """The rows of up to NEIGHBOURS keys after `key` that this worker does not know, taken
        in (and shared with the node's workers) as single lookups take them (_remembered),
        each under the ticket taken before its row was asked for: an immutable mount's key
        found only in its row says the node has not learnt its neighbours either (it has
        restarted, or other nodes learnt them), and an epoch over them would otherwise read
        the database once per key."""
        keys = await self.rows.keys_after(handle.id, key, NEIGHBOURS)
        unknown = [k for k in keys if not self.metadata.holds(handle.id, k)]
        tickets = [self.metadata.ticket(handle.id, k) for k in unknown]
        found = await self.rows.lookup_many(handle.id, unknown) if unknown else {}
        now, wall = time.monotonic(), _utcnow()
        rows = [
            (k, entry.info, now - max(0.0, (wall - entry.at).total_seconds()), ticket)
            for k, ticket in zip(unknown, tickets, strict=True)
            if (entry := found.get(k)) is not None and entry.complete
        ]
        # Shared a slice at a time, the loop serving requests between: a thousand rows in one
        # transaction of the shared record held this worker's loop, and a sibling's write
        # waiting for the file, for tens of milliseconds.
        for at in range(0, len(rows), NEIGHBOURS_SHARED):
            if at:
                await asyncio.sleep(0)
            learnt = [
                row
                for row in rows[at : at + NEIGHBOURS_SHARED]
                if not self.metadata.holds(handle.id, row[0])
                # Else changed since its row was asked for: stale, not kept even as a hint.
                and self.metadata.ticket(handle.id, row[0]) == row[3]
            ]
            if learnt:
                self.metadata.put_many(handle.id, learnt)
                counters.NEIGHBOURS_LEARNT.inc(len(learnt))

    async def _learnt_row(
        self,
        handle: MountHandle,
        key: str,
        info: ObjectInfo,
        previous: ObjectInfo | None,
        ticket: int,
        asked: float,
    ) -> None:
        """The store told the key's version, asked under `ticket` at `asked` (monotonic).
        Under a synced prefix its row takes it before the answer (the catalog lists the truth
        through every node from then on: a row completed, or corrected after a change behind
        the gateway's back); an immutable mount's row is queued when it is news. Either row
        is stamped with the asking's time, not the answer's: a read trusts it for the
        mount's TTL from then, as it trusts what it asked itself. An answer from before a
        change of the key through the node writes no row: that change wrote its own."""
        if self.metadata.ticket(handle.id, key) != ticket:
            return
        at = _utcnow() - timedelta(seconds=max(0.0, time.monotonic() - asked))
        if self._covered(handle, key):
            if previous is not None and same(previous.etag, info.etag):
                self.rows.record(handle.id, key, info, at=at)  # the same version, seen again
            else:
                await self.rows.record_now(handle.id, key, info, at=at)
        elif handle.ttl < 0 and (previous is None or not same(previous.etag, info.etag)):
            self.rows.record(handle.id, key, info, at=at)

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


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _lists(listed: Listed, info: ObjectInfo) -> bool:
    """Whether a listing told this version of the key (the same ETag and size)."""
    return _tells(listed, info.etag, info.size)


def _tells(listed: Listed, etag: str, size: int) -> bool:
    return listed.etag is not None and same(listed.etag, etag) and listed.size == size
