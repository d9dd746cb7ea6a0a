"""The read operations: list buckets and objects, head and get objects through the cache.

A GET resolves the mount (in-process), the object's metadata (in-process within the mount's
TTL, else the store), checks conditions and range, then serves from the local cache or
fetches from the store while filling the cache (one fetch for concurrent misses).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass

from gateway import errors, metrics
from gateway.cache import BlockKey, PageStore
from gateway.cluster.placement import Node
from gateway.meta import MetaStore
from gateway.service.buckets import Buckets
from gateway.service.conditions import ByteRange, Conditions, check_conditions
from gateway.service.fleet import Fleet, PeerUnavailable
from gateway.service.metadata import MetadataCache
from gateway.service.multipart import Multipart
from gateway.service.namespace import MountHandle, Namespace
from gateway.service.recorder import MetadataRecorder
from gateway.service.store_errors import store_errors
from gateway.service.writes import ObjectWriter
from gateway.stores import (
    ListPage,
    ObjectInfo,
    VersionChanged,
)

log = logging.getLogger("gateway.service")

_WALKS_MAX = 4096  # versions whose last read block is remembered, to spot sequential readers


@dataclass(frozen=True, slots=True)
class ObjectResult:
    """What GET/HEAD answer: the version, the byte range [start, end) and the body."""

    info: ObjectInfo
    start: int
    end: int
    partial: bool  # a Range was asked for and satisfied (206)
    body: bytes | AsyncGenerator[bytes, None] | None  # None for HEAD
    cache: str  # "hit", "miss" or "bypass"


@functools.lru_cache(maxsize=1 << 16)
def block_key(mount_id: int, key: str, etag: str, block_size: int, index: int) -> BlockKey:
    """The cache's name for a block: hashed once per hot block, not once per request."""
    return BlockKey(mount_id, key, etag, block_size, index)


class Gateway:
    """The service every S3 front end calls; owns the namespace, metadata and the cache."""

    def __init__(
        self,
        meta: MetaStore,
        pages: PageStore,
        default_ttl: float,
        *,
        bucket_store: str | None = None,
        bucket_store_options: Mapping[str, str] | None = None,
        multipart_max_age: float = 7 * 86400,
        block_size: int = 4 << 20,
        readahead: int = 4,
    ) -> None:
        self.meta = meta
        self.pages = pages
        self.readahead = readahead
        self.namespace = Namespace(meta, default_ttl, block_size, self._mounts_changed)
        self.metadata = MetadataCache()
        self.recorder = MetadataRecorder(meta)
        self.writer = ObjectWriter(self)
        self.multipart = Multipart(self, multipart_max_age)
        self.buckets = Buckets(self, bucket_store, bucket_store_options or {})
        self.fleet: Fleet | None = None  # set when the node runs in a fleet
        self._opening: dict[tuple[int, str], asyncio.Future[None]] = {}
        self._stats: dict[tuple[int, str], asyncio.Future[ObjectInfo]] = {}
        self._walks: OrderedDict[tuple[int, str, str], int] = OrderedDict()

    async def close(self) -> None:
        await self.recorder.close()  # metadata learnt or written, briefly
        await self.namespace.close()

    def _mounts_changed(self, handles: list[MountHandle]) -> None:
        self.pages.set_quotas({h.id: h.quota for h in handles if h.quota is not None})

    def invalidate(self, handle: MountHandle, info: ObjectInfo) -> None:
        """Forget the cached blocks of this version on this node."""
        self.pages.invalidate(handle.id, info.key, info.etag, info.size, handle.block_size)

    # -- buckets ---------------------------------------------------------------------------

    def mount(self, bucket: str) -> MountHandle:
        handle = self.namespace.mount(bucket)
        if handle is None:
            raise errors.NoSuchBucket(BucketName=bucket)
        return handle

    def list_buckets(self) -> list[MountHandle]:
        return self.namespace.mounts()

    async def list_objects(
        self,
        bucket: str,
        prefix: str,
        delimiter: str | None,
        token: str | None,
        start_after: str | None,
        max_keys: int,
    ) -> ListPage:
        handle = self.mount(bucket)
        if max_keys == 0:
            return ListPage([], [], None)
        try:
            with store_errors(prefix):
                return await handle.store.list_page(prefix, delimiter, token, start_after, max_keys)
        except ValueError:
            raise errors.InvalidArgument(
                "The continuation token provided is incorrect", ArgumentName="continuation-token"
            ) from None

    # -- objects ---------------------------------------------------------------------------

    async def stat(self, handle: MountHandle, key: str) -> ObjectInfo:
        """The object's current version, per the mount's TTL; no I/O when fresh in-process.
        Concurrent revalidations of one key make one store request."""
        now = time.monotonic()
        info = self.metadata.fresh(handle.id, key, handle.ttl, now)
        if info is not None:
            return info
        if handle.ttl == 0:
            # "Always revalidate": a request must not take the answer to one sent before it.
            return await self._revalidate(handle, key, now)
        pending = self._stats.get((handle.id, key))
        if pending is None:
            pending = asyncio.ensure_future(self._revalidate(handle, key, now))
            self._stats[(handle.id, key)] = pending

            def done(
                future: asyncio.Future[ObjectInfo], at: tuple[int, str] = (handle.id, key)
            ) -> None:
                self._stats.pop(at, None)
                if not future.cancelled():
                    future.exception()  # retrieved here: every waiter may have gone

            pending.add_done_callback(done)
        return await asyncio.shield(pending)

    async def _revalidate(self, handle: MountHandle, key: str, now: float) -> ObjectInfo:
        previous = self.metadata.peek(handle.id, key)
        if previous is None and await self._remembered(handle, key):
            found = self.metadata.peek(handle.id, key)
            assert found is not None
            return found
        try:
            with store_errors(key):
                info = await handle.store.stat(key)
        except errors.NoSuchKey:
            self.metadata.forget(handle.id, key)
            raise
        except errors.ServiceUnavailable:
            if previous is None:
                raise
            # The store cannot be asked: serve the version we know (stale-if-error) rather
            # than fail readers of cached data; it is revalidated once the store answers.
            log.warning("store unavailable, serving last known version of %s", key)
            return previous
        self.metadata.put(handle.id, key, info, now)
        if previous is not None and previous.etag != info.etag:
            self.invalidate(handle, previous)
        if handle.ttl < 0 and (previous is None or previous.etag != info.etag):
            self.recorder.record(handle.id, key, info)
        return info

    async def _remembered(self, handle: MountHandle, key: str) -> bool:
        """Immutable mounts (TTL -1) remember metadata across restarts in the database: load
        it into the in-process cache if it is there."""
        if handle.ttl >= 0:
            return False
        found = await self.recorder.lookup(handle.id, key)
        if found is None:
            return False
        self.metadata.put(handle.id, key, found, time.monotonic())
        return True

    async def head_object(
        self, bucket: str, key: str, rng: ByteRange | None, cond: Conditions
    ) -> ObjectResult:
        handle = self.mount(bucket)
        info = await self.stat(handle, key)
        check_conditions(cond, info)
        start, end = rng.resolve(info.size) if rng else (0, info.size)
        size = handle.block_size
        bkey = block_key(handle.id, info.key, info.etag, size, start // size)
        cached = handle.cache_enabled and self.pages.known(bkey)
        return ObjectResult(info, start, end, rng is not None, None, "hit" if cached else "miss")

    async def get_object(
        self, bucket: str, key: str, rng: ByteRange | None, cond: Conditions
    ) -> ObjectResult:
        handle = self.mount(bucket)
        if (
            rng is None
            and (self.fleet is None or self.fleet.alone)
            and self.metadata.peek(handle.id, key) is None
            and not await self._remembered(handle, key)
        ):
            return await self._get_cold(handle, key, cond)
        for attempt in range(2):
            info = await self.stat(handle, key)
            check_conditions(cond, info)
            start, end = rng.resolve(info.size) if rng else (0, info.size)
            try:
                body, how = await self._body(handle, info, start, end)
            except VersionChanged:
                # Overwritten between stat and read: revalidate once and serve the new version.
                self.metadata.forget(handle.id, key)
                if attempt:
                    raise errors.ServiceUnavailable(
                        "The object changed while it was read."
                    ) from None
                continue
            return ObjectResult(info, start, end, rng is not None, body, how)
        raise AssertionError("unreachable")

    async def _get_cold(self, handle: MountHandle, key: str, cond: Conditions) -> ObjectResult:
        """A whole object never seen: metadata and its first block from one store request (not
        a HEAD and then a GET); concurrent cold readers of the key wait for that one."""
        opening = self._opening.get((handle.id, key))
        if opening is not None:
            await asyncio.shield(opening)  # then the metadata is known: the warm path joins
            return await self.get_object(handle.bucket, key, None, cond)
        opening = asyncio.get_running_loop().create_future()
        self._opening[(handle.id, key)] = opening
        try:
            with store_errors(key):
                info, stream = await handle.store.open(
                    key, handle.block_size if handle.cache_enabled else None
                )
            self.metadata.put(handle.id, key, info, time.monotonic())
            if handle.ttl < 0:
                self.recorder.record(handle.id, key, info)
            try:
                check_conditions(cond, info)
            except BaseException:
                await stream.aclose()
                raise
            source = self._counted(handle, _mapped(stream, key))
            if not handle.cache_enabled:
                return ObjectResult(info, 0, info.size, False, await _primed(source), "bypass")
            # Primed before the waiters wake: block 0's fill is then in flight for them to join.
            body = await _primed(self._blocks(handle, info, 0, info.size, first=source))
            return ObjectResult(info, 0, info.size, False, body, "miss")
        finally:
            del self._opening[(handle.id, key)]
            # Waiters go again: with the metadata known they join the fill; if this failed,
            # one of them tries anew.
            opening.set_result(None)

    async def _body(
        self, handle: MountHandle, info: ObjectInfo, start: int, end: int
    ) -> tuple[bytes | AsyncGenerator[bytes, None], str]:
        """The bytes [start, end) and how they were found (hit, miss, bypass, forward).

        A streamed body has already produced its first chunk, so that what the store says
        first (gone, changed, unavailable) becomes an S3 error before any header is sent.
        """
        if not handle.cache_enabled:
            return await _primed(self._from_store(handle, info, start, end)), "bypass"
        if start >= end:
            return b"", "hit"
        size = handle.block_size
        first = start // size
        bkey = block_key(handle.id, info.key, info.etag, size, first)
        local = self._owner(handle, info, first, bkey) is None
        if local and first == (end - 1) // size:
            # Within one block of our own: a hit is one read, answered as one body.
            length = min(size, info.size - first * size)
            offset = first * size
            data = await self.pages.read_hit(
                bkey, length, start - offset, end - offset, pinned=handle.pinned(info.key)
            )
            if data is not None:
                self._note_sequential(handle, info, first)
                return data, "hit"
        how = "forward" if not local else "hit" if self.pages.known(bkey) else "miss"
        return await _primed(self._blocks(handle, info, start, end)), how

    def _owner(
        self, handle: MountHandle, info: ObjectInfo, index: int, bkey: BlockKey
    ) -> tuple[Node, ...] | None:
        """None when this node serves the block itself, else the nodes to ask, best first."""
        fleet = self.fleet
        if fleet is None or fleet.alone:
            return None
        blocks = max(1, -(-info.size // handle.block_size))
        owners = fleet.owners(handle.id, info.key, info.etag, index, blocks, handle.replicas)
        me = fleet.me.id
        if owners[0].id == me or (self.pages.known(bkey) and any(n.id == me for n in owners)):
            return None
        return owners

    async def open_body(
        self, handle: MountHandle, info: ObjectInfo, start: int, end: int
    ) -> AsyncGenerator[bytes, None]:
        """Bytes [start, end) of a known version, from the cache where it can (copies)."""
        body, _ = await self._body(handle, info, start, end)
        return _once(body) if isinstance(body, bytes) else body

    async def _blocks(
        self,
        handle: MountHandle,
        info: ObjectInfo,
        start: int,
        end: int,
        first: AsyncGenerator[bytes, None] | None = None,
    ) -> AsyncGenerator[bytes, None]:
        """Bytes [start, end) block by block, each from this node's page store or from the
        peer that owns it, with the next blocks fetched ahead of the reader. `first`, if
        given, is an open stream of block 0's bytes (the cold path's one request), used if
        this node fills block 0 and closed otherwise."""
        size = handle.block_size
        lo, hi = start // size, (end - 1) // size
        horizon = self._note_sequential(handle, info, hi, lo)
        limit = min(max(hi, horizon), (info.size - 1) // size)
        pinned = handle.pinned(info.key)
        following = lo + 1  # the next block this reader has not asked to prefetch
        remote: dict[int, asyncio.Task[bytes]] = {}  # peers' blocks fetched ahead
        used = False

        def fetch(index: int) -> Callable[[], AsyncGenerator[bytes, None]]:
            def open_block() -> AsyncGenerator[bytes, None]:
                nonlocal used
                if index == 0 and first is not None and not used:
                    used = True
                    return first
                offset = index * size
                return self._from_store(handle, info, offset, min(info.size, offset + size))

            return open_block

        def span(index: int) -> tuple[BlockKey, int, int, int]:
            offset = index * size
            length = min(size, info.size - offset)
            a, b = max(start, offset) - offset, min(end, offset + length) - offset
            return block_key(handle.id, info.key, info.etag, size, index), length, a, b

        try:
            for index in range(lo, hi + 1):
                # Read-ahead: inside this request, and past it for a reader walking the object.
                while following <= min(index + self.readahead, limit):
                    bkey, length, a, b = span(following)
                    owners = self._owner(handle, info, following, bkey)
                    if owners is None:
                        if not self.pages.known(bkey):
                            self.pages.prefetch(bkey, length, fetch(following), pinned=pinned)
                    elif following <= hi:
                        body = self._remote(handle, info, owners, following, a, b, pinned)
                        remote[following] = asyncio.create_task(_collect(body))
                    following += 1
                bkey, length, a, b = span(index)
                ahead = remote.pop(index, None)
                if ahead is not None:
                    yield await ahead
                    continue
                owners = self._owner(handle, info, index, bkey)
                if owners is None:
                    chunks = self.pages.read(bkey, length, a, b, fetch(index), pinned=pinned)
                else:
                    chunks = self._remote(handle, info, owners, index, a, b, pinned)
                async with aclosing(chunks):
                    async for chunk in chunks:
                        yield chunk
                if first is not None and not used:
                    used = True
                    await first.aclose()
        finally:
            for task in remote.values():
                task.cancel()
            if first is not None and not used:
                await first.aclose()

    async def _remote(
        self,
        handle: MountHandle,
        info: ObjectInfo,
        owners: tuple[Node, ...],
        index: int,
        start: int,
        end: int,
        pinned: bool,
    ) -> AsyncGenerator[bytes, None]:
        """Bytes [start, end) of block `index` from its owners in turn, each from where the
        one before it stopped; from the store itself when none of them answers."""
        assert self.fleet is not None
        size = handle.block_size
        params: dict[str, str | int] = {
            "m": handle.id, "k": info.key, "e": info.etag, "s": info.size,
            "b": size, "i": index, "p": int(pinned),
        }  # fmt: skip
        pos = start
        for node in owners:
            if node.id == self.fleet.me.id:
                # Our turn among the replicas: serve it as its owner would.
                body = await self.serve_block(handle.id, info, size, index, pos, end, pinned)
                if isinstance(body, bytes):
                    yield body
                    return
                async with aclosing(body) as chunks:
                    async for chunk in chunks:
                        yield chunk
                return
            try:
                async with aclosing(self.fleet.read_block(node, params, pos, end)) as chunks:
                    async for chunk in chunks:
                        pos += len(chunk)
                        yield chunk
                return
            except PeerUnavailable as exc:
                log.warning("peer failed, trying the next: %s", exc)
        offset = index * size
        async with aclosing(self._from_store(handle, info, offset + pos, offset + end)) as rest:
            async for chunk in rest:
                yield chunk

    async def serve_block(
        self, mount_id: int, info: ObjectInfo, block_size: int, index: int, start: int, end: int,
        pinned: bool,
    ) -> bytes | AsyncGenerator[bytes, None]:  # fmt: skip
        """For a peer: bytes [start, end) of a block this node owns, from its page store (one
        read on a hit), fetched from the store on a miss. Primed, so that errors come before
        any byte."""
        handle = self.namespace.by_id(mount_id)
        if handle is None:
            raise errors.NoSuchBucket()
        offset = index * block_size
        length = min(block_size, info.size - offset)
        if not 0 <= start <= end <= length:
            raise errors.InvalidRange()
        bkey = block_key(mount_id, info.key, info.etag, block_size, index)
        data = await self.pages.read_hit(bkey, length, start, end, pinned=pinned)
        if data is not None:
            return data

        def fetch() -> AsyncGenerator[bytes, None]:
            return self._from_store(handle, info, offset, offset + length)

        return await _primed(self.pages.read(bkey, length, start, end, fetch, pinned=pinned))

    def forget(self, mount_id: int, key: str) -> None:
        """A peer wrote `key`: drop what this node knows of its old version."""
        handle = self.namespace.by_id(mount_id)
        previous = self.metadata.peek(mount_id, key)
        if handle is not None and previous is not None:
            self.invalidate(handle, previous)
        self.metadata.forget(mount_id, key)

    def _prefetch(
        self,
        handle: MountHandle,
        info: ObjectInfo,
        index: int,
        fetch: Callable[[], AsyncGenerator[bytes, None]],
        pinned: bool,
    ) -> None:
        size = handle.block_size
        offset = index * size
        if offset >= info.size:
            return
        bkey = block_key(handle.id, info.key, info.etag, size, index)
        if not self.pages.known(bkey):
            self.pages.prefetch(bkey, min(size, info.size - offset), fetch, pinned=pinned)

    def _note_sequential(
        self, handle: MountHandle, info: ObjectInfo, last: int, first: int | None = None
    ) -> int:
        """Remember where a reader of this version stopped; returns how far to read ahead:
        past `last` when this read starts where the previous one ended (a sequential reader
        of ranges), else `last`."""
        walk = (handle.id, info.key, info.etag)
        previous = self._walks.pop(walk, None)
        self._walks[walk] = last
        if len(self._walks) > _WALKS_MAX:
            del self._walks[next(iter(self._walks))]
        if first is not None and previous is not None and previous <= first <= previous + 1:
            return last + self.readahead
        return last

    async def _from_store(
        self, handle: MountHandle, info: ObjectInfo, start: int, end: int
    ) -> AsyncGenerator[bytes, None]:
        if start >= end:
            return
        with store_errors(info.key):
            async with aclosing(handle.store.read(info.key, start, end, info.etag)) as chunks:
                async for chunk in chunks:
                    metrics.store_bytes(handle.kind, len(chunk))
                    yield chunk

    async def _counted(
        self, handle: MountHandle, source: AsyncGenerator[bytes, None]
    ) -> AsyncGenerator[bytes, None]:
        async with aclosing(source) as chunks:
            async for chunk in chunks:
                metrics.store_bytes(handle.kind, len(chunk))
                yield chunk


async def _collect(body: AsyncGenerator[bytes, None]) -> bytes:
    async with aclosing(body) as chunks:
        return b"".join([chunk async for chunk in chunks])


async def _once(data: bytes) -> AsyncGenerator[bytes, None]:
    yield data


async def _primed(gen: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
    try:
        first = await gen.__anext__()
    except StopAsyncIteration:
        return _once(b"")
    except BaseException:
        await gen.aclose()
        raise
    return _chained(first, gen)


async def _chained(first: bytes, rest: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
    try:
        yield first
        async for chunk in rest:
            yield chunk
    finally:
        await rest.aclose()


async def _mapped(stream: AsyncGenerator[bytes, None], key: str) -> AsyncGenerator[bytes, None]:
    """A store's byte stream with its errors mapped to S3's."""
    async with aclosing(stream) as chunks:
        with store_errors(key):
            async for chunk in chunks:
                yield chunk
