"""The read side of the service: list, head and get objects through the cache; serve blocks
and opens for the peers.

A GET of a known version is a plan and a loop. `plan()` (plan.py) turns the version, the byte
range and the placement into the spans of blocks to read, in order, each naming who holds it:
this node's page store, or the peers that own it. `Reader._stream()` reads the spans in order,
each from its source (sources.py: this node's pages, the peers, the store), with the next
blocks fetched ahead of the reader. Which version is current, and the opening of a key the
node knows nothing of, are the version authority's (`Versions.current`, `Versions.open`); a
version the store no longer has is told to it (`Versions.changed`). The Reader moves blocks.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from collections.abc import AsyncGenerator, Iterator
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import NamedTuple, cast

from gateway import counters, errors
from gateway.cache import Arrival, BlockKey, FileRegion, FillFailed, Fills, PageStore
from gateway.cluster.peers import Fleet
from gateway.cluster.placement import Node
from gateway.service.conditions import ByteRange, Conditions, check_conditions
from gateway.service.inputs import ListQuery
from gateway.service.namespace import MountHandle, Namespace
from gateway.service.opening import Opened
from gateway.service.plan import Place, Span, block_key, here, plan
from gateway.service.shared import Shared
from gateway.service.sources import (
    Begun,
    BlockSource,
    Chunk,
    Fetched,
    PageSource,
    PeerSource,
    StoreSource,
    once,
    primed,
)
from gateway.service.store_errors import store_errors
from gateway.service.versions import Versions
from gateway.stores import ListPage, ObjectInfo, VersionChanged, VersionsPage
from gateway.stores import base as store_base

log = logging.getLogger(__name__)
# The stores' answer checks are counted in this process's metrics (stores import no counters).
store_base.answer_report = counters.store_answer

_WALKS_MAX = 4096  # versions whose last reads' ends are remembered, to spot sequential readers
_WALK_ENDS = 4  # ends remembered per version: as many sequential readers of it at once
_READ_TRIES = 4  # reads of an object that changes under them, before 503


@dataclass(frozen=True, slots=True)
class ObjectResult:
    """What GET/HEAD answer: the version, the byte range [start, end) and the body."""

    info: ObjectInfo
    start: int
    end: int
    partial: bool  # a Range was asked for and satisfied (206)
    body: bytes | FileRegion | AsyncGenerator[Chunk, None] | None  # None for HEAD
    cache: str  # "hit", "miss", "forward" or "bypass"


class HitAt(NamedTuple):
    """A one-block object this node may answer at once (Reader.hit_at)."""

    handle: MountHandle
    info: ObjectInfo
    bkey: BlockKey


# -- the reader -------------------------------------------------------------------------------


class Reader:
    """Reads objects through this node's cache; opens objects and serves blocks for peers."""

    def __init__(self, shared: Shared, readahead: int = 4) -> None:
        self.shared = shared
        # The shared parts under the names the read loop uses, one attribute away.
        self.pages: PageStore = shared.pages
        self.fills: Fills = shared.fills
        self.namespace: Namespace = shared.namespace
        self.versions: Versions = shared.versions
        self.fleet: Fleet | None = shared.fleet
        self.readahead = readahead
        self._opening: dict[tuple[int, str], asyncio.Future[None]] = {}
        self._walks: OrderedDict[tuple[int, str, str], tuple[int, ...]] = OrderedDict()

    def mount(self, bucket: str) -> MountHandle:
        return self.shared.mount(bucket)

    # -- buckets ---------------------------------------------------------------------------

    async def current_mount(self, bucket: str) -> MountHandle:
        """The bucket's mount as the node has it now (for work that no request begins, as a
        preload job's): re-read when mounts changed on the node, or the bucket is unknown."""
        await self.namespace.current()
        if self.namespace.mount(bucket) is None:
            await self.namespace.lookup_unknown_mount(bucket)
        return self.mount(bucket)

    async def list_objects(self, bucket: str, q: ListQuery) -> ListPage:
        handle = self.mount(bucket)
        if q.max_keys == 0:
            return ListPage([], [], None)
        try:
            if handle.catalog is not None:
                page = await self.shared.catalog.list_page(
                    handle.id, q.prefix, q.delimiter, q.token, q.start_after, q.max_keys
                )
                if page is not None:
                    return page
                token, start_after = self.shared.catalog.for_store(q.token, q.start_after)
                q = replace(q, token=token, start_after=start_after)
            with store_errors(q.prefix):
                return await handle.store.list_page(
                    q.prefix, q.delimiter, q.token, q.start_after, q.max_keys
                )
        except ValueError:
            raise errors.InvalidArgument(
                "The continuation token provided is incorrect", ArgumentName="continuation-token"
            ) from None

    async def list_versions(
        self, bucket: str, prefix: str, delimiter: str | None, key_marker: str | None,
        version_marker: str | None, max_keys: int,
    ) -> VersionsPage:  # fmt: skip
        """A page of the versions of a store that keeps them (ListObjectVersions)."""
        handle = self.mount(bucket)
        if max_keys == 0:
            return VersionsPage([], [], None, None)
        try:
            with store_errors(prefix):
                return await handle.store.list_versions(
                    prefix, delimiter, key_marker, version_marker, max_keys
                )
        except ValueError:
            raise errors.InvalidArgument(
                "Invalid version id specified", ArgumentName="version-id-marker",
                ArgumentValue=version_marker or "",
            ) from None  # fmt: skip

    # -- objects ---------------------------------------------------------------------------

    async def stat(self, handle: MountHandle, key: str) -> ObjectInfo:
        """The object's current version (versions.Versions.current)."""
        return await self.versions.current(handle, key)

    async def head_object(
        self, bucket: str, key: str, rng: ByteRange | None, cond: Conditions,
        version_id: str | None = None,
    ) -> ObjectResult:  # fmt: skip
        handle = self.mount(bucket)
        if version_id is None:
            info = await self.stat(handle, key)
        else:
            info = await self.versions.addressed(handle, key, version_id)
        check_conditions(cond, info)
        start, end = rng.resolve(info.size) if rng else (0, info.size)
        size = handle.block_size
        bkey = block_key(handle.id, info.key, info.etag, size, start // size)
        cached = handle.cache_enabled and self.pages.known(bkey)
        return ObjectResult(info, start, end, rng is not None, None, "hit" if cached else "miss")

    async def get_object(
        self, bucket: str, key: str, rng: ByteRange | None, cond: Conditions,
        version_id: str | None = None, zero_copy: bool = False,
    ) -> ObjectResult:  # fmt: skip
        """`zero_copy`: blocks of this node's cache may come as FileRegions (the HTTP server
        sends files itself)."""
        handle = self.mount(bucket)
        if version_id is not None and (version_id != "null" or handle.store.versions):
            return await self._get_version(handle, key, version_id, rng, cond, zero_copy)
        ticket = self.versions.ticket(handle, key)
        force = False  # open even a key whose version is known: the store no longer has it
        for _ in range(_READ_TRIES):
            try:
                if rng is None:
                    opened = await self.versions.open(handle, key, force=force)
                    if opened is not None:
                        return await self._from_opened(handle, opened, cond)
                info = await self.stat(handle, key)
                check_conditions(cond, info)
                start, end = rng.resolve(info.size) if rng else (0, info.size)
                body, how = await self._body(handle, info, start, end, zero_copy)
                return ObjectResult(info, start, end, rng is not None, body, how)
            except (VersionChanged, errors.NoSuchKey) as exc:
                await self.versions.changed(handle, key, exc, ticket)
                if isinstance(exc, errors.NoSuchKey):
                    raise
                # Overwritten since its version was learnt, and no byte sent yet: serve the
                # new version. A whole object is then opened, one request that tells the
                # version with the bytes, so that writes in a row cannot outrun it.
                force = True
            except FillFailed as exc:
                raise errors.ServiceUnavailable(f"The store's answer was cut: {exc}") from None
        raise errors.ServiceUnavailable("The object changed while it was read.")

    async def _get_version(
        self, handle: MountHandle, key: str, version_id: str, rng: ByteRange | None,
        cond: Conditions, zero_copy: bool = False,
    ) -> ObjectResult:  # fmt: skip
        """A GET of a version named by its id: through the cache as any version (its blocks are
        named by its ETag, shared with the key's current version when that is the same)."""
        info = await self.versions.addressed(handle, key, version_id)
        check_conditions(cond, info)
        start, end = rng.resolve(info.size) if rng else (0, info.size)
        try:
            body, how = await self._body(handle, info, start, end, zero_copy)
        except VersionChanged:
            # The store holds other bytes under that version id than it said (its ETag): it
            # was removed and the id is not what it named. Asked again on the next read.
            self.versions.forget(handle.id, key)
            raise errors.ServiceUnavailable("The version changed while it was read.") from None
        except FillFailed as exc:
            raise errors.ServiceUnavailable(f"The store's answer was cut: {exc}") from None
        return ObjectResult(info, start, end, rng is not None, body, how)

    def hit_at(self, bucket: str, key: str, disk: bool = True) -> HitAt | None:
        """Where a whole object would be answered from with no await and no wait for the disk:
        its version known within the TTL, one block this node serves, that block in the memory
        tier or (`disk`) on disk as far as the page store tells without I/O (take_hit() reads
        it only if all of it is in the page cache, checked first if this process has not read
        it before, whichever worker filled it). None for anything else (the full read path
        then answers). Nothing is counted or read: the edge asks this before it checks the
        request's signature, so that a miss is verified once, by the full path, and
        take_hit() follows only an authorized request. A version known whose block is gone
        is verified twice (here, then by the full path): a few µs on a miss."""
        handle = self.namespace.mount(bucket)
        if handle is None or not handle.cache_enabled:
            return None
        info = self.versions.fresh(handle, key)
        if info is None or not 0 < info.size <= handle.block_size:
            return None
        bkey = block_key(handle.id, info.key, info.etag, handle.block_size, 0)
        if not self.pages.may_answer(bkey, disk) or self.placer(handle, info)(0, bkey):
            return None
        return HitAt(handle, info, bkey)

    def take_hit(
        self, at: HitAt, disk: bool = True, zero_copy: bool = False, read_in: bool = True
    ) -> tuple[ObjectInfo, bytes | memoryview | FileRegion] | None:
        """The object hit_at() found, counted as a hit: the block from the memory tier or,
        all of it in the page cache, from disk (`disk` False: the memory tier only, for a HEAD,
        whose answer needs no byte of the block). With `zero_copy` (the caller sends files),
        a block on disk comes as a region of its file, checked as any (PageStore's
        peek_sendable), not as a copy, being read in on a thread if it is not all in the
        page cache (its `reading`; None then without `read_in`), and so does one of the memory
        tier past hot_file_min where its file may be sent (hot_region). None when it is not
        there after all."""
        handle, info, bkey = at
        pinned = handle.pinned(info.key)
        data: bytes | memoryview | FileRegion | None = self.pages.peek(bkey, pinned)
        if data is not None:
            if zero_copy and disk and info.size >= self.pages.hot_file_min:
                # Sent from the page cache rather than copied into the socket (hotfiles.py).
                data = self.pages.hot_region(bkey, info.size) or data
        else:
            if not disk:
                return None
            if zero_copy:
                data = self.pages.peek_sendable(bkey, info.size, pinned, read_in)
            else:
                data = self.pages.peek_disk(bkey, info.size, pinned)
            if data is None:
                return None
        # Not noted as a walk (_note_walk): no read can go on from the end of a whole object.
        return info, data

    async def serve_open(
        self, mount_id: int, key: str, block_size: int, pinned: bool, preload: bool = False
    ) -> tuple[ObjectInfo, bytes | AsyncGenerator[bytes, None]]:
        """For a peer: the key's current version and its block 0 (which this node owns): from
        the cache when the version is known here, else opened with one store request.
        `preload`: for this node's preload job, whose reads are counted apart."""
        handle = await self._mount_by_id(mount_id)
        if block_size != handle.block_size or not handle.cache_enabled:
            raise errors.InvalidArgument("The mount's cache settings differ between the nodes.")
        pinned = pinned or handle.pinned(key)
        for _ in range(_READ_TRIES):
            opened = await self.versions.open(
                handle, key, here=True, pinned=pinned, preload=preload
            )
            if opened is not None:
                return opened.info, opened.head
            # Known here (remembered, or block 0 kept across a restart): its bytes are here.
            info = await self.stat(handle, key)
            if info.size == 0:
                return info, b""
            try:
                length = min(block_size, info.size)
                body = await self.serve_block(
                    mount_id, info, block_size, 0, 0, length, pinned, preload=preload
                )
            except VersionChanged:
                self.versions.forget(mount_id, key)
                continue
            return info, body
        raise errors.ServiceUnavailable("The object changed while it was read.")

    async def _from_opened(
        self, handle: MountHandle, opened: Opened, cond: Conditions
    ) -> ObjectResult:
        """A whole object opened just now (its version and block 0 in one request), read on
        as any other."""
        info, head, how = opened.info, opened.head, opened.how
        try:
            check_conditions(cond, info)
        except BaseException:
            await head.aclose()
            raise
        if not handle.cache_enabled:
            return ObjectResult(info, 0, info.size, False, head, how)
        spans, _ = self._plan(handle, info, 0, info.size, self.placer(handle, info))
        body = await primed(self._stream(handle, info, spans, head))
        return ObjectResult(info, 0, info.size, False, body, how)

    async def _body(
        self, handle: MountHandle, info: ObjectInfo, start: int, end: int,
        zero_copy: bool = False,
    ) -> tuple[bytes | FileRegion | AsyncGenerator[Chunk, None], str]:  # fmt: skip
        """The bytes [start, end) and how they were found (hit, miss, bypass, forward).

        A streamed body has already produced its first chunk, so that what the store says
        first (gone, changed, unavailable) becomes an S3 error before any header is sent.
        With `zero_copy`, blocks read from this node's files
        come as FileRegions.
        """
        if not handle.cache_enabled:
            return await primed(StoreSource(handle, info).range(start, end)), "bypass"
        if start >= end:
            return b"", "hit"
        size = handle.block_size
        first = start // size
        bkey = block_key(handle.id, info.key, info.etag, size, first)
        place = self.placer(handle, info)
        local = not place(first, bkey)
        if local and first == (end - 1) // size:
            # Within one block of our own: a hit is one read, answered as one body.
            length = min(size, info.size - first * size)
            offset = first * size
            pinned = handle.pinned(info.key)
            a, b = start - offset, end - offset
            found: bytes | FileRegion | None = None
            if zero_copy:
                found = await self.pages.region(bkey, length, a, b, pinned)
            if found is None:
                found = await self.fills.read_hit(bkey, length, a, b, pinned=pinned)
            if found is not None:
                self._note_walk(handle, info, start, end)
                return found, "hit"
        spans, sequential = self._plan(handle, info, start, end, place)
        body = await primed(
            self._stream(handle, info, spans, regions=zero_copy, sparse=not sequential)
        )
        if not local:
            return body, "forward"
        # Once its first bytes are in, a block read from the disk is known; a fill is still
        # in flight (it ends after its file is written).
        if sequential:
            hit = self.pages.known(bkey) and not self.fills.filling(bkey)
        else:  # a random reader's range: its first block, or its sub-blocks there
            offset = first * size
            length = min(size, info.size - offset)
            hit = not self.fills.filling(bkey) and self.fills.known_range(
                bkey, length, start - offset, min(end - offset, length)
            )
        return body, "hit" if hit else "miss"

    def placer(self, handle: MountHandle, info: ObjectInfo) -> Place:
        """Who holds a block of this version: () when this node serves it itself (it owns it,
        or holds it as a replica), else its owners, best first."""
        fleet = self.fleet
        if fleet is None or fleet.alone:
            return here
        me = fleet.me.id
        known = self.pages.known

        def place(index: int, bkey: BlockKey) -> tuple[Node, ...]:
            owners = fleet.owners(handle.id, info.key, info.etag, index, handle.replicas)
            if owners[0].id == me or (known(bkey) and any(n.id == me for n in owners)):
                return ()
            return owners

        return place

    def _plan(
        self, handle: MountHandle, info: ObjectInfo, start: int, end: int, place: Place
    ) -> tuple[Iterator[Span], bool]:
        """The read's spans, and whether its reader is sequential (it is read ahead of then)."""
        size = handle.block_size
        last = (end - 1) // size
        sequential = self._note_walk(handle, info, start, end)
        horizon = last + self.readahead if sequential else last
        return plan(handle.id, info, size, start, end, horizon, place), sequential

    async def open_body(
        self, handle: MountHandle, info: ObjectInfo, start: int, end: int
    ) -> AsyncGenerator[bytes, None]:
        """Bytes [start, end) of a known version, from the cache where it can (copies)."""
        body, _ = await self._body(handle, info, start, end, zero_copy=False)
        if isinstance(body, bytes):
            return once(body)
        # Without zero_copy every piece is bytes.
        return cast(AsyncGenerator[bytes, None], body)

    async def _stream(
        self,
        handle: MountHandle,
        info: ObjectInfo,
        spans: Iterator[Span],
        head: AsyncGenerator[bytes, None] | None = None,
        regions: bool = False,
        sparse: bool = False,
    ) -> AsyncGenerator[Chunk, None]:
        """The bytes of the spans, in order, each from its source, the next `readahead` blocks
        fetched ahead of the reader. `head`, if given, is the first span's bytes, already
        opened (a cold read's one request). With `regions`, a block this node's page store
        can hand over as a region of its file (PageStore.region) comes as that. `sparse`: the
        reader is not sequential (small ranges of a block missed are filled as sub-blocks)."""
        store = StoreSource(handle, info)
        pages = PageSource(self.fills, store, handle.pinned(info.key), sparse)
        peers = PeerSource(self.fleet, pages, store) if self.fleet is not None else None
        pending: deque[Span] = deque()
        fetched: dict[int, Fetched] = {}  # peers' blocks fetched ahead
        opened: dict[int, Begun] = {}  # this node's spans begun before the first byte
        unsure: list[Arrival] = []  # fills of this read's blocks: confirmed before a byte
        sent = False
        version = (handle.id, info.key, info.etag, handle.block_size)
        self.pages.hold(version)  # what is cached of it stays so while this reader reads it
        try:
            while True:
                span = pending.popleft() if pending else next(spans, None)
                if span is None or not span.wanted:
                    return
                while len(pending) < self.readahead:
                    later = next(spans, None)
                    if later is None:
                        break
                    pending.append(later)
                    if not later.owners:
                        arrival = pages.ahead(later)
                        if later.wanted and not sent:
                            if arrival is None and (sparse or not pages.holds(later)):
                                # Not fetched ahead (sub-blocks, or no prefetch slot free):
                                # begun now all the same, so that its store answer is known
                                # before the read's first byte. A random reader's span is
                                # taken now even if it is here: its sub-blocks may be gone
                                # by its turn, and fetching them then could fail after bytes.
                                arrival = opened[later.index] = Begun(pages.read(later))
                            if arrival is not None:
                                unsure.append(arrival)
                    elif later.wanted:
                        assert peers is not None
                        fetched[later.index] = peer_ahead = Fetched(peers.read(later))
                        if not sent:
                            unsure.append(peer_ahead)
                ahead = fetched.pop(span.index, None)
                if ahead is not None:
                    data = await ahead.task
                    if unsure:
                        await self._confirm(unsure)
                        unsure = []
                    sent = True
                    yield data
                    continue
                if regions and not span.owners and head is None:
                    region = await pages.region(span)
                    if region is not None:
                        if unsure:
                            try:
                                await self._confirm(unsure)
                            except BaseException:
                                region.close()
                                raise
                            unsure = []
                        sent = True
                        yield region
                        continue
                source: BlockSource = pages if not span.owners else peers  # type: ignore[assignment]
                early = opened.pop(span.index, None)
                if early is not None:
                    chunks = early.read()
                elif head is None:
                    chunks = source.read(span, sent)
                else:
                    chunks = head
                head = None
                async with aclosing(chunks):
                    async for chunk in chunks:
                        if unsure:
                            await self._confirm(unsure)
                            unsure = []
                        sent = True
                        yield chunk
        finally:
            self.pages.release(version)
            for left in fetched.values():
                left.task.cancel()
            for begun in opened.values():
                await begun.aclose()
            if head is not None:
                await head.aclose()

    async def _confirm(self, fills: list[Arrival]) -> None:
        """Before the first byte of a read goes out: the blocks it fetches ahead, from the
        store or from the peers that own them, have begun to arrive, so that a version the
        store no longer has (overwritten behind the gateway's back within the metadata TTL)
        becomes a new read of the new version rather than a response cut after its first
        block. A fill that has failed and ended meanwhile (the store answered before the
        first block was read) still tells why."""
        for fill in fills:
            error = await fill.started()
            if isinstance(error, VersionChanged):
                raise error

    async def serve_block(
        self, mount_id: int, info: ObjectInfo, block_size: int, index: int, start: int, end: int,
        pinned: bool, sparse: bool = False, preload: bool = False,
    ) -> bytes | AsyncGenerator[bytes, None]:  # fmt: skip
        """For a peer: bytes [start, end) of a block this node owns, from its page store (one
        read on a hit), fetched from the store on a miss. Primed, so that errors come before
        any byte. `sparse`: the peer's reader is not sequential (sub-blocks, as here).
        `preload`: for this node's preload job, whose reads are counted apart."""
        handle = await self._mount_by_id(mount_id)
        offset = index * block_size
        length = min(block_size, info.size - offset)
        if not 0 <= start <= end <= length:
            raise errors.InvalidRange()
        bkey = block_key(mount_id, info.key, info.etag, block_size, index)
        data = await self.fills.read_hit(bkey, length, start, end, pinned=pinned, preload=preload)
        if data is not None:
            return data
        span = Span(index, bkey, offset, length, start, end)
        source = PageSource(self.fills, StoreSource(handle, info), pinned, sparse, preload)
        return await primed(source.read(span))

    async def _mount_by_id(self, mount_id: int) -> MountHandle:
        """The mount a peer names by id; one this node has not seen yet is looked up. What
        changed on the node (a mount, a synced prefix) is re-read first, as for a client's
        request: a peer is answered as this node's other workers would answer it."""
        if self.namespace.stale():
            await self.namespace.current()
        handle = self.namespace.by_id(mount_id)
        if handle is None:
            await self.namespace.lookup_unknown_mount(mount_id=mount_id)
            handle = self.namespace.by_id(mount_id)
        if handle is None:
            raise errors.NoSuchBucket()
        return handle

    def forget(self, mount_id: int, key: str) -> None:
        """A peer wrote `key`: drop what this node knows of its old version."""
        self.versions.forget(mount_id, key, self.namespace.by_id(mount_id))

    def _note_walk(self, handle: MountHandle, info: ObjectInfo, start: int, end: int) -> bool:
        """Remember where a read of bytes [start, end) of this version ends; whether it starts
        exactly where one of the last few reads of it ended (a sequential reader of ranges,
        or several at once): it is read ahead of then, and fills whole blocks. Byte-exact, so
        that a random reader landing near where another stopped is not taken for one (each
        such guess cost a block and `readahead` more)."""
        walk = (handle.id, info.key, info.etag)
        ends = self._walks.pop(walk, ())
        self._walks[walk] = (*[e for e in ends if e != start][-(_WALK_ENDS - 1) :], end)
        if len(self._walks) > _WALKS_MAX:
            del self._walks[next(iter(self._walks))]
        return start > 0 and start in ends
