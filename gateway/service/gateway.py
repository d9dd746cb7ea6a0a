"""The read operations: list buckets and objects, head and get objects through the cache.

A GET resolves the mount (in-process), the object's metadata (in-process within the mount's
TTL, else the store), checks conditions and range, then serves from the local cache or
fetches from the store while filling the cache (one fetch for concurrent misses).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncGenerator, Coroutine, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from gateway import errors
from gateway.cache import CacheEntry, CacheKey, CacheMiss, Fill, ObjectCache
from gateway.meta import MetaStore, MetaUnavailable
from gateway.service.buckets import Buckets
from gateway.service.conditions import ByteRange, Conditions, check_conditions
from gateway.service.metadata import MetadataCache
from gateway.service.multipart import Multipart
from gateway.service.namespace import MountHandle, Namespace
from gateway.service.store_errors import store_errors
from gateway.service.writes import ObjectWriter
from gateway.stores import (
    ListPage,
    ObjectInfo,
    StoreError,
    VersionChanged,
)

log = logging.getLogger("gateway.service")

# Ranges up to this size are answered as one body from one read; larger ones stream.
SMALL_READ = 1 << 20
MAX_BACKGROUND_FILLS = 8


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
def cache_key(mount_id: int, key: str, etag: str) -> CacheKey:
    """The cache's name for a version: hashed once per hot object, not once per request."""
    return CacheKey(mount_id, key, etag)


class Gateway:
    """The service every S3 front end calls; owns the namespace, metadata and the cache."""

    def __init__(
        self,
        meta: MetaStore,
        cache: ObjectCache,
        default_ttl: float,
        *,
        bucket_store: str | None = None,
        bucket_store_options: Mapping[str, str] | None = None,
        multipart_max_age: float = 7 * 86400,
    ) -> None:
        self.meta = meta
        self.cache = cache
        self.namespace = Namespace(meta, default_ttl)
        self.metadata = MetadataCache()
        self.writer = ObjectWriter(self)
        self.multipart = Multipart(self, multipart_max_age)
        self.buckets = Buckets(self, bucket_store, bucket_store_options or {})
        self._fill_slots = asyncio.Semaphore(MAX_BACKGROUND_FILLS)
        self._tasks: set[asyncio.Task[Any]] = set()

    async def close(self) -> None:
        # Let metadata writes and fills in flight finish briefly; then give up on them.
        if self._tasks:
            _, pending = await asyncio.wait(list(self._tasks), timeout=5)
            for task in pending:
                task.cancel()
        await self.writer.close()
        await self.namespace.close()

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
        """The object's current version, per the mount's TTL; no I/O when fresh in-process."""
        now = time.monotonic()
        info = self.metadata.fresh(handle.id, key, handle.ttl, now)
        if info is not None:
            return info
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
            self.cache.invalidate(CacheKey(handle.id, key, previous.etag))
        if handle.ttl < 0 and (previous is None or previous.etag != info.etag):
            self._spawn(self._remember(handle.id, info))
        return info

    async def _remembered(self, handle: MountHandle, key: str) -> bool:
        """Immutable mounts (TTL -1) remember metadata across restarts in the database: load
        it into the in-process cache if it is there."""
        if handle.ttl >= 0:
            return False
        with contextlib.suppress(MetaUnavailable):
            found = await self.meta.get_object_meta(handle.id, key)
            if found is not None:
                self.metadata.put(handle.id, key, found[0], time.monotonic())
                return True
        return False

    async def head_object(
        self, bucket: str, key: str, rng: ByteRange | None, cond: Conditions
    ) -> ObjectResult:
        handle = self.mount(bucket)
        info = await self.stat(handle, key)
        check_conditions(cond, info)
        start, end = rng.resolve(info.size) if rng else (0, info.size)
        cached = handle.cache_enabled and self.cache.lookup(self._ckey(handle, info)) is not None
        return ObjectResult(info, start, end, rng is not None, None, "hit" if cached else "miss")

    async def get_object(
        self, bucket: str, key: str, rng: ByteRange | None, cond: Conditions
    ) -> ObjectResult:
        handle = self.mount(bucket)
        if (
            rng is None
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
        """A whole object never seen: metadata and bytes from one store request (not a HEAD
        and then a GET), cached on the way when it fits."""
        with store_errors(key):
            info, stream = await handle.store.open(key)
        self.metadata.put(handle.id, key, info, time.monotonic())
        if handle.ttl < 0:
            self._spawn(self._remember(handle.id, info))
        try:
            check_conditions(cond, info)
        except BaseException:
            await stream.aclose()
            raise
        source = _mapped(stream, key)
        how = "bypass"
        if handle.cache_enabled and self.cache.admits(info.size):
            how = "miss"
            fill = self.cache.begin_fill(self._ckey(handle, info), info.size)
            if fill is not None:
                source = self._fill_and_stream(source, fill)
        return ObjectResult(info, 0, info.size, False, await _primed(source), how)

    async def _body(
        self, handle: MountHandle, info: ObjectInfo, start: int, end: int
    ) -> tuple[bytes | AsyncGenerator[bytes, None], str]:
        """The bytes [start, end) and how they were found (hit, miss, bypass).

        A streamed body has already produced its first chunk, so that what the store says
        first (gone, changed, unavailable) becomes an S3 error before any header is sent.
        """
        body, how = await self._body_unprimed(handle, info, start, end)
        if isinstance(body, bytes):
            return body, how
        return await _primed(body), how

    async def _body_unprimed(
        self, handle: MountHandle, info: ObjectInfo, start: int, end: int
    ) -> tuple[bytes | AsyncGenerator[bytes, None], str]:
        if not handle.cache_enabled or not self.cache.admits(info.size):
            return self._from_store(handle, info, start, end), "bypass"
        ckey = self._ckey(handle, info)
        entry = self.cache.lookup(ckey)
        if entry is None:
            fill = self.cache.begin_fill(ckey, info.size)
            if fill is None and (start, end) != (0, info.size):
                # Another reader is filling the whole object: a range does not wait for all
                # of it, it reads its own bytes from the store.
                return self._from_store(handle, info, start, end), "miss"
            if fill is None:
                entry = await self.cache.wait(ckey)
            elif start == 0 and end == info.size:
                source = self._from_store(handle, info, 0, info.size)
                return self._fill_and_stream(source, fill), "miss"
            else:
                # A part of the object: serve it straight from the store while the whole
                # object is cached in the background for the next reader.
                self._spawn(self._fill_in_background(handle, info, fill))
                return self._from_store(handle, info, start, end), "miss"
        if entry is None:
            return self._from_store(handle, info, start, end), "miss"
        if entry.size != info.size:
            # Same version, other length: a damaged file. Drop it rather than serve it.
            self.cache.invalidate(ckey)
            return self._from_store(handle, info, start, end), "miss"
        try:
            if end - start <= SMALL_READ:
                return await self.cache.read(entry, start, end), "hit"
        except CacheMiss:
            return self._from_store(handle, info, start, end), "miss"
        return self._stream_cached(handle, info, entry, start, end), "hit"

    async def open_body(
        self, handle: MountHandle, info: ObjectInfo, start: int, end: int
    ) -> AsyncGenerator[bytes, None]:
        """Bytes [start, end) of a known version, from the cache where it can (copies)."""
        body, _ = await self._body(handle, info, start, end)
        return _once(body) if isinstance(body, bytes) else body

    async def _stream_cached(
        self, handle: MountHandle, info: ObjectInfo, entry: CacheEntry, start: int, end: int
    ) -> AsyncGenerator[bytes, None]:
        try:
            async with aclosing(self.cache.stream(entry, start, end)) as chunks:
                async for chunk in chunks:
                    yield chunk
                    start += len(chunk)
        except CacheMiss:
            # The file went away under us (eviction): finish from the store.
            async with aclosing(self._from_store(handle, info, start, end)) as rest:
                async for chunk in rest:
                    yield chunk

    async def _from_store(
        self, handle: MountHandle, info: ObjectInfo, start: int, end: int
    ) -> AsyncGenerator[bytes, None]:
        if start >= end:
            return
        with store_errors(info.key):
            async with aclosing(handle.store.read(info.key, start, end, info.etag)) as chunks:
                async for chunk in chunks:
                    yield chunk

    async def _fill_and_stream(
        self, source: AsyncGenerator[bytes, None], fill: Fill
    ) -> AsyncGenerator[bytes, None]:
        committed = False
        try:
            async with aclosing(source) as chunks:
                async for chunk in chunks:
                    await fill.write(chunk)
                    yield chunk
            await fill.commit()
            committed = True
        finally:
            if not committed:
                await fill.abort()

    async def _fill_in_background(self, handle: MountHandle, info: ObjectInfo, fill: Fill) -> None:
        try:
            async with self._fill_slots:
                async with aclosing(self._from_store(handle, info, 0, info.size)) as chunks:
                    async for chunk in chunks:
                        await fill.write(chunk)
                await fill.commit()
        except (StoreError, errors.S3Error, OSError) as exc:
            log.warning("background fill of %s/%s failed: %s", handle.bucket, info.key, exc)
        finally:
            await fill.abort()  # no-op after a commit

    async def _remember(self, mount_id: int, info: ObjectInfo) -> None:
        try:
            await self.meta.put_object_meta(mount_id, info)
        except MetaUnavailable as exc:
            log.warning("could not persist metadata of %s: %s", info.key, exc)

    @staticmethod
    def _ckey(handle: MountHandle, info: ObjectInfo) -> CacheKey:
        return cache_key(handle.id, info.key, info.etag)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


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
