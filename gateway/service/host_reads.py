"""What a client on this host is handed (short-circuit reads, gateway/s3/local.py): each
key's version, how long it may trust it, and the files of the blocks this node serves; and
lease renewals, many keys a request, with no file. Over the Reader's parts: its version
authority, its fills and page store, its placement."""

from __future__ import annotations

import asyncio
import time
from contextlib import aclosing
from dataclasses import dataclass
from typing import cast

from gateway import errors
from gateway.cache import FillFailed
from gateway.cache.layout import block_path
from gateway.service.namespace import MountHandle
from gateway.service.plan import block_key
from gateway.service.reads import Reader
from gateway.stores import ObjectInfo, VersionChanged

# Versions of keys past their TTL asked of the store at once for one short-circuit request.
STAT_CONCURRENCY = 32


@dataclass(frozen=True, slots=True)
class LocalBlocks:
    """What a client on this host is handed for an object: its version, how it is cut into
    blocks, how long it may trust them (the mount's metadata TTL; -1: for good), and the
    files of the blocks this node holds, as (index, length, path)."""

    info: ObjectInfo
    block_size: int
    ttl: float
    files: list[tuple[int, int, str]]


class HostReads:
    """The short-circuit requests of clients on this host, over the node's Reader."""

    def __init__(self, reader: Reader) -> None:
        self._reader = reader
        self.versions = reader.versions
        self.fills = reader.fills
        self.pages = reader.pages

    async def local_blocks(self, bucket: str, key: str, first: int, count: int) -> LocalBlocks:
        """For a client on this host: the key's current version, and (index, length, path) of
        the files of its blocks [first, first + count) that this node serves, each fetched
        into the cache first if it is not there. Blocks of peers, and blocks the cache could
        not keep, are left out: the client reads them over HTTP."""
        handle = self._reader.mount(bucket)
        info = await self._reader.stat(handle, key)
        if not handle.cache_enabled or info.size == 0:
            return LocalBlocks(info, handle.block_size, handle.ttl, [])
        size = handle.block_size
        place = self._reader.placer(handle, info)
        pinned = handle.pinned(info.key)
        found = []
        for index in range(max(0, first), min(first + count, -(-info.size // size))):
            length = min(size, info.size - index * size)
            bkey = block_key(handle.id, info.key, info.etag, size, index)
            if place(index, bkey):
                continue
            path = await self.fills.block_file(bkey)
            if path is None:
                try:
                    body = await self._reader.serve_block(
                        handle.id, info, size, index, 0, length, pinned
                    )
                    if not isinstance(body, bytes):
                        async with aclosing(body) as chunks:  # filled; the bytes are not kept
                            async for _ in chunks:
                                pass
                except (FillFailed, VersionChanged) as exc:  # this key's answer, not the request's
                    raise errors.ServiceUnavailable(f"A block was not fetched: {exc}") from None
                path = await self.fills.block_file(bkey)
            if path is not None:
                found.append((index, length, path))
        return LocalBlocks(info, size, handle.ttl, found)

    async def local_files(
        self, bucket: str, keys: list[str], count: int
    ) -> list[LocalBlocks | errors.S3Error]:
        """local_blocks() of many keys at once for a client on this host (short-circuit), with
        no thread hop: each key's version (no I/O when fresh in-process) and, for its first
        `count` blocks that this node serves, where their files are in the page store, not
        checked: the caller opens them, and asks local_blocks() for a key of which a file is
        not there (which fetches it). An error of one key is that key's answer."""
        handle = self._reader.mount(bucket)
        root, size = self.pages.root, handle.block_size
        found: list[LocalBlocks | errors.S3Error] = []
        for info in await self._versions(handle, keys, count > 0 and handle.cache_enabled):
            if isinstance(info, errors.S3Error):
                found.append(info)
                continue
            files = []
            if handle.cache_enabled and info.size:
                place = self._reader.placer(handle, info)
                for index in range(min(count, -(-info.size // size))):
                    bkey = block_key(handle.id, info.key, info.etag, size, index)
                    if not place(index, bkey):
                        length = min(size, info.size - index * size)
                        files.append((index, length, block_path(root, handle.id, bkey.name)))
            ttl = self.versions.remaining(handle, info.key)
            found.append(LocalBlocks(info, size, ttl, files))
        return found

    async def local_versions(
        self, bucket: str, keys: list[str], fresh_for: float = 0.0
    ) -> list[LocalBlocks | errors.S3Error]:
        """For a lease renewal of a client on this host (short-circuit): each key's current
        version and how long it stays fresh (Versions.remaining), no file, or its error. Keys
        the node knows for less than `fresh_for` more seconds are revalidated first, from
        listings of their prefixes asked within the TTL less `fresh_for` (listed now where the
        newest is older): a client renewing ahead of its lapse is answered a newer listing's
        time, not the same end again, and never a listing older than the TTL."""
        handle = self._reader.mount(bucket)
        versions = self.versions
        if handle.ttl > 0 and fresh_for > 0:
            fresh_for = min(fresh_for, handle.ttl / 2)
            near = [k for k in keys if versions.remaining(handle, k) < fresh_for]
            if len(near) > 1:
                await versions.revalidator.cover(handle, near, fresh_for)
                await versions.revalidating(handle, near)
        size = handle.block_size
        found: list[LocalBlocks | errors.S3Error] = []
        for info in await self._versions(handle, keys):
            if isinstance(info, errors.S3Error):
                found.append(info)
            else:
                found.append(LocalBlocks(info, size, versions.remaining(handle, info.key), []))
        return found

    async def _open_for_lease(self, handle: MountHandle, key: str) -> None:
        """Open the key for a client on this host, if this node knows no version of it: its
        block 0 filled here, or by the peer that owns it (whose bytes are not read: the client
        reads them from it)."""
        opened = await self.versions.open(handle, key)
        if opened is None:
            return  # known, or opened by another request meanwhile
        async with aclosing(opened.head) as chunks:
            if opened.how != "forward":
                async for _ in chunks:  # the fill's end: block 0 is committed
                    pass

    async def _versions(
        self, handle: MountHandle, keys: list[str], opening: bool = False
    ) -> list[ObjectInfo | errors.S3Error]:
        """stat() of many keys: those fresh in memory at once, the others asked of the store
        STAT_CONCURRENCY at a time (one after another, a thousand keys past their TTL took a
        thousand round trips, longer than the TTL they were renewed for). `opening`: a key
        whose version this node does not know is opened instead, as a cold GET opens it
        (its version and block 0 in one store request, block 0 filled into the cache), so
        that a lease of keys never read costs a store request each, made together, not a
        HEAD and then a GET of each in turn (21 objects/s over a 20 ms WAN)."""
        now = time.monotonic()
        found: list[ObjectInfo | errors.S3Error | None] = [
            self.versions.fresh(handle, key, now) for key in keys
        ]
        stale = [i for i, info in enumerate(found) if info is None]
        if stale:
            await self.versions.revalidating(handle, [keys[i] for i in stale])
            # Those the listings found unchanged are fresh now: no task each.
            now = time.monotonic()
            for i in stale:
                found[i] = self.versions.fresh(handle, keys[i], now)
            stale = [i for i in stale if found[i] is None]
            slots = asyncio.Semaphore(STAT_CONCURRENCY)

            async def one(i: int) -> None:
                async with slots:
                    try:
                        if opening:
                            await self._open_for_lease(handle, keys[i])
                        found[i] = await self._reader.stat(handle, keys[i])
                    except errors.S3Error as exc:
                        found[i] = exc
                    except FillFailed as exc:
                        found[i] = errors.ServiceUnavailable(f"The store's answer was cut: {exc}")

            await asyncio.gather(*(one(i) for i in stale))
        return cast(list[ObjectInfo | errors.S3Error], found)  # every one filled in
