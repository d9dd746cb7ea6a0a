"""The one face a preload job (gateway/jobs/) loads through: a bucket's mount and a key's
version, a block warmed here or at a peer through the page store's single flight, the job's
fill budget and the fills in flight, and the unpin of a version's blocks on this disk."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from datetime import UTC, datetime

from gateway.cache import BlockKey
from gateway.cache.layout import block_path, file_size, inflight_path
from gateway.catalog import Catalog
from gateway.cluster import Fleet, Node, PeerUnavailable, Placement
from gateway.service.namespace import MountHandle
from gateway.service.plan import block_key
from gateway.service.reads import Reader
from gateway.service.sources import StoreSource
from gateway.service.store_errors import store_errors
from gateway.stores import ObjectInfo, VersionChanged
from gateway.stores.etags import bare, quoted, same

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def listed_info(key: str, size: int, etag: str) -> ObjectInfo:
    """The version a listing named: enough to read its blocks (under If-Match on the ETag)."""
    return ObjectInfo(key=key, size=size, etag=etag, last_modified=_EPOCH)


@dataclass(frozen=True, slots=True)
class Block:
    """Block `index` of a version of a mount's key (`length` bytes), as a load names it."""

    handle: MountHandle
    info: ObjectInfo
    index: int
    length: int
    key: BlockKey  # the page store's name for it

    @property
    def on_disk(self) -> int:
        """The bytes its file takes, as the janitor counts them: with its checksums."""
        return file_size(self.length)


@dataclass(frozen=True, slots=True)
class FillBudget:
    """What a job may fill on this node: its mount's quota within the cache's capacity, less
    what is pinned (pinned blocks are never evicted)."""

    capacity: int  # the node's cache
    quota: int | None  # the mount's
    pinned: int | None  # bytes of pinned blocks on the disk, as the janitor last counted

    @property
    def limit(self) -> int:
        return min(self.capacity, self.quota if self.quota is not None else self.capacity)


@dataclass(frozen=True, slots=True)
class Unpinned:
    """What an unpin took off this node's disk: the indices of the blocks unpinned, and why
    some pins stay, if any did."""

    indices: list[int]
    trouble: str | None


class Loads:
    """One per node process, over its Reader: every load of a preload job goes through here,
    so that a client reading a block joins the job's fill and the job joins a client's."""

    def __init__(self, reader: Reader) -> None:
        self._reader = reader
        self._pages = reader.shared.pages
        self._fills = reader.shared.fills
        self._fleet = reader.shared.fleet
        self.catalog: Catalog = reader.shared.catalog  # the keys of catalog=on mounts
        self.cache_root: str = self._pages.root  # where the node's workers share files

    # -- mounts and versions -------------------------------------------------------------

    async def mount(self, bucket: str) -> MountHandle:
        """The bucket's mount as the node has it now (re-read when mounts changed)."""
        return await self._reader.current_mount(bucket)

    def placement(self) -> Placement | None:
        """The fleet's placement of blocks; None on a node that runs alone."""
        return None if self._fleet is None else self._fleet.placement

    def changed(self, handle: MountHandle, key: str, etag: str) -> bool:
        """Whether the last version of the key known on this node, however old, is another
        than the one listed with `etag` (ETags compared by value: quoted or bare)."""
        known = self._reader.versions.hint(handle.id, key)
        return known is not None and not same(known.etag, etag)

    def forget(self, handle: MountHandle, key: str) -> None:
        """Drop what this node knows of the key's version: the next load opens it anew."""
        self._reader.forget(handle.id, key)

    async def current(self, handle: MountHandle, key: str) -> ObjectInfo:
        """The key's current version, as a client's HEAD has it (and this node keeps it)."""
        return await self._reader.stat(handle, key)

    # -- blocks ----------------------------------------------------------------------------

    def block(self, handle: MountHandle, info: ObjectInfo, index: int) -> Block:
        size = handle.block_size
        length = min(size, info.size - index * size)
        bkey = block_key(handle.id, info.key, info.etag, size, index)
        return Block(handle, info, index, length, bkey)

    def present(self, block: Block) -> bool:
        """Whether the block's file is committed on this node's disk: one stat, made on the
        event loop as the page store's look for a key's record is (a few µs there, where a
        thread hop costs ~50 µs of CPU)."""
        return os.path.exists(block_path(self.cache_root, block.handle.id, block.key.name))

    async def present_all(self, blocks: list[Block]) -> list[bool]:
        """`present` of many blocks in one thread hop: a share's look before it loads. A
        block 0 found gets its key's record back if it had lost it (PageStore.keep_record):
        a load counts it as cached, so reads must find it."""
        root, pages = self.cache_root, self._pages

        def look() -> list[bool]:
            found = []
            for block in blocks:
                there = os.path.exists(block_path(root, block.handle.id, block.key.name))
                if there and block.index == 0:
                    pages.keep_record(block.key)
                found.append(there)
            return found

        return await asyncio.to_thread(look)

    async def pin(self, block: Block) -> None:
        """Read a cached block once as pinned: the janitor pins it on its next use."""
        n = block.length
        await self._fills.read_hit(block.key, n, 0, n, pinned=True, preload=True)

    async def fetch(self, block: Block, pinned: bool, source: Node | None = None) -> BlockKey:
        """The block's bytes all in, fetched through the page store's single flight: block 0
        with the object's metadata (one store request, as a cold GET opens it), any other
        through `serve_block`; a replica's from its first owner `source`. The fill commits
        them a moment later (a cache-io thread's write, rename and key record): `committed`
        waits for that, with the fill's name returned here."""
        if source is not None and self._fleet is not None:
            await self._copy(self._fleet, source, block, pinned)
        elif block.index == 0:
            return await self._open(block, pinned)
        else:
            info, handle = block.info, block.handle
            body = await self._reader.serve_block(
                handle.id, info, handle.block_size, block.index, 0, block.length, pinned,
                preload=True,
            )  # fmt: skip
            await _drain(body)
        return block.key

    async def committed(self, key: BlockKey) -> None:
        """Wait until this process's fill of the block fetched (`fetch`'s answer) has ended,
        committed or not (`kept` tells which)."""
        await self._fills.fill_ended(key)

    async def kept(self, block: Block, patience: float = 2.0) -> bool:
        """Whether a block just filled was kept: at once when this process committed it. Its
        fill may have been another worker process's, which this one followed to the last
        byte: that one commits it a moment later, and until then its in-flight file is there."""
        if self._pages.verified(block.key):
            return True
        inflight = inflight_path(self.cache_root, block.key.name)
        waited = 0.0
        while not self.present(block):
            if waited >= patience or not os.path.exists(inflight):
                return self.present(block)
            await asyncio.sleep(0.01)
            waited += 0.01
        return True

    async def warm_at(self, node: Node, block: Block, pinned: bool) -> None:
        """The block in a peer's cache: read from it as a peer reads a block it does not own."""
        assert self._fleet is not None, "a node alone has no peer"
        params = _block_params(block, pinned)
        async with aclosing(self._fleet.read_block(node, params, 0, block.length)) as chunks:
            async for _ in chunks:
                pass

    async def _open(self, block: Block, pinned: bool) -> BlockKey:
        """Block 0 and the object's whole metadata (content type, user metadata...) in one
        store request, through the Reader's own opening (one request for concurrent openers;
        a version known already is simply filled): this node's reads then know the version
        without asking the store, and on a `metadata_ttl=-1` mount every node's do."""
        handle, listed = block.handle, block.info
        info, body = await self._reader.serve_open(
            handle.id, listed.key, handle.block_size, pinned, preload=True
        )
        await _drain(body)
        if not same(info.etag, listed.etag):
            raise VersionChanged(f"{listed.key} changed since it was listed")
        # Named by the store's ETag, which may be quoted where the listing's was not.
        return block_key(handle.id, info.key, info.etag, handle.block_size, 0)

    async def _copy(self, fleet: Fleet, node: Node, block: Block, pinned: bool) -> None:
        """A replica's copy of the block, read from its first owner `node` (which fetches it
        from the store once, for both), or from the store if that node fails."""
        handle, info, length = block.handle, block.info, block.length
        offset = block.index * handle.block_size
        params = _block_params(block, pinned)

        async def fetch(skip: int, stop: int | None = None) -> AsyncGenerator[bytes, None]:
            got = skip
            stop = length if stop is None else stop
            try:
                async with aclosing(fleet.read_block(node, params, skip, stop)) as chunks:
                    async for chunk in chunks:
                        got += len(chunk)
                        yield chunk
                return
            except PeerUnavailable:
                pass
            rest = StoreSource(handle, info).range(offset + got, offset + stop)
            async with aclosing(rest) as chunks:
                async for chunk in chunks:
                    yield chunk

        with store_errors(info.key):
            chunks = self._fills.read(
                block.key, length, 0, length, fetch, pinned=pinned, preload=True
            )
            async with aclosing(chunks):
                async for _ in chunks:
                    pass

    # -- the fill budget and the fills in flight -------------------------------------------

    async def budget(self, handle: MountHandle) -> FillBudget:
        """The job's room on this node (the janitor's figures read in a thread: a file)."""
        stats = await asyncio.to_thread(self._pages.janitor_stats)
        pinned = None if stats is None else stats.pinned_bytes
        return FillBudget(self._pages.capacity, handle.quota, pinned)

    @property
    def fills_in_flight(self) -> int:
        """Blocks on their way in from the stores in this process: clients' and the jobs'."""
        return self._fills.in_flight

    async def any_fill_ended(self) -> None:
        """Wait until a fill in flight in this process ends (at once if there is none)."""
        await self._fills.any_ended()

    # -- unpin -----------------------------------------------------------------------------

    async def unpin(
        self, handle: MountHandle, key: str, etag: str, count: int, whole_mount: bool
    ) -> Unpinned:
        """Take the pin off each of the `count` blocks of the key's version `etag` cached on
        this disk (and off every other block of the mount: `whole_mount`), written to the
        journal before this returns: a node killed after a job ended must not come back with
        them. A block may be named by the ETag as listed, quoted or bare: loads before ETags
        were compared by value named blocks by the listing's form (unquoted on some origins),
        reads by the store's."""
        forms = dict.fromkeys((etag, quoted(etag), bare(etag)))
        keys = [
            block_key(handle.id, key, e, handle.block_size, index)
            for index in range(count)
            for e in forms
        ]
        root = self.cache_root
        found = await asyncio.to_thread(
            lambda: [k for k in keys if os.path.exists(block_path(root, k.mount_id, k.name))]
        )
        unpinned = [k for k in found if self._pages.unpin(k)]
        trouble = None if len(unpinned) == len(found) else "this process has no journal (its disk)"
        if whole_mount and not self._pages.unpin_mount(handle.id):
            trouble = "this process has no journal (its disk)"
        try:
            await self._pages.flush_journal()
        except OSError as exc:
            return Unpinned([], f"the journal could not be written: {exc}")
        return Unpinned([k.index for k in unpinned], trouble)


def _block_params(block: Block, pinned: bool) -> dict[str, str | int]:
    """The peer block API's query for the block (j: a preload's read)."""
    info, handle = block.info, block.handle
    return {
        "m": handle.id, "k": info.key, "e": info.etag, "s": info.size,
        "b": handle.block_size, "i": block.index, "p": int(pinned), "j": 1,
    }  # fmt: skip


async def _drain(body: bytes | AsyncGenerator[bytes, None]) -> None:
    """Read a body to its end, the bytes dropped: they are in the cache."""
    if not isinstance(body, bytes):
        async with aclosing(body) as chunks:
            async for _ in chunks:
                pass
