"""Filling one block: on this node through the Reader's `serve_block` (the page store's single
flight: a client reading the block joins the fill, and the fill joins a client's), or on a
peer through the fleet's block API; and whether a block is on this node's disk."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator
from contextlib import aclosing
from datetime import UTC, datetime

from gateway.cache import BlockKey, PageStore
from gateway.cache.layout import block_path, inflight_path
from gateway.cluster import placement
from gateway.cluster.peers import Fleet, PeerUnavailable
from gateway.cluster.placement import Node, Placement
from gateway.service.namespace import MountHandle
from gateway.service.plan import block_key
from gateway.service.reads import Reader
from gateway.service.sources import StoreSource
from gateway.service.store_errors import store_errors
from gateway.stores import ObjectInfo, VersionChanged
from gateway.stores.etags import same

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def listed_info(key: str, size: int, etag: str) -> ObjectInfo:
    """The version a listing named: enough to read its blocks (under If-Match on the ETag)."""
    return ObjectInfo(key=key, size=size, etag=etag, last_modified=_EPOCH)


def owners(
    where: Placement, mount_id: int, info: ObjectInfo, index: int, replicas: int
) -> tuple[Node, ...]:
    """As Fleet.owners, under any placement (the fleet's, or one with a departed node)."""
    placed = placement.owner_key(mount_id, info.key, info.etag, index)
    return where.owners(placed, min(replicas, where.max_replicas))


def present(pages: PageStore, bkey: BlockKey) -> bool:
    """Whether the block's file is committed on this node's disk: one stat, made on the event
    loop as the page store's look for a key's record is (PageStore.cached_version: a few µs
    there, where a thread hop costs ~50 µs of CPU; a preload asks it of every block)."""
    return os.path.exists(block_path(pages.root, bkey.mount_id, bkey.name))


async def kept(pages: PageStore, bkey: BlockKey, patience: float = 2.0) -> bool:
    """Whether a block just filled was kept: at once when this process committed it. Its
    fill may have been another worker process's, which this one followed to the last byte:
    that one commits it a moment later, and until then its in-flight file is there."""
    if pages.verified(bkey):
        return True
    inflight = inflight_path(pages.root, bkey.name)
    waited = 0.0
    while not present(pages, bkey):
        if waited >= patience or not os.path.exists(inflight):
            return present(pages, bkey)
        await asyncio.sleep(0.01)
        waited += 0.01
    return True


async def fill_here(
    reader: Reader, mount_id: int, info: ObjectInfo, block_size: int, index: int, pinned: bool
) -> None:
    """The block in this node's cache: read through serve_block, the bytes dropped."""
    length = min(block_size, info.size - index * block_size)
    body = await reader.serve_block(
        mount_id, info, block_size, index, 0, length, pinned, preload=True
    )
    if not isinstance(body, bytes):
        async with aclosing(body) as chunks:
            async for _ in chunks:
                pass
    # The bytes are all in before the block is committed: wait for that, to tell if it was.
    await reader.fills.fill_ended(block_key(mount_id, info.key, info.etag, block_size, index))


async def fill_first(reader: Reader, handle: MountHandle, listed: ObjectInfo, pinned: bool) -> None:
    """Block 0 of an object and its whole metadata (content type, user metadata...) in one
    store request, as a cold GET gets them, through the Reader's own opening (`serve_open`:
    one store request for concurrent openers; a version known already is simply filled):
    this node's reads then know the version without asking the store, and on a
    `metadata_ttl=-1` mount every node's do (the database keeps it)."""
    info, body = await reader.serve_open(
        handle.id, listed.key, handle.block_size, pinned, preload=True
    )
    if not isinstance(body, bytes):
        async with aclosing(body) as chunks:
            async for _ in chunks:
                pass
    if not same(info.etag, listed.etag):
        raise VersionChanged(f"{listed.key} changed since it was listed")
    await reader.fills.fill_ended(block_key(handle.id, info.key, info.etag, handle.block_size, 0))


async def fill_from(
    reader: Reader, fleet: Fleet, node: Node, handle: MountHandle, info: ObjectInfo, index: int,
    pinned: bool,
) -> None:  # fmt: skip
    """A replica's copy of the block in this node's cache, read from its first owner `node`
    (which fetches it from the store once, for both), or from the store if that node fails."""
    size = handle.block_size
    offset = index * size
    length = min(size, info.size - offset)
    bkey = block_key(handle.id, info.key, info.etag, size, index)
    params: dict[str, str | int] = {
        "m": handle.id, "k": info.key, "e": info.etag, "s": info.size,
        "b": size, "i": index, "p": int(pinned), "j": 1,
    }  # fmt: skip

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
        chunks = reader.fills.read(bkey, length, 0, length, fetch, pinned=pinned, preload=True)
        async with aclosing(chunks):
            async for _ in chunks:
                pass
    await reader.fills.fill_ended(bkey)


async def fill_at(
    fleet: Fleet, node: Node, mount_id: int, info: ObjectInfo, block_size: int, index: int,
    pinned: bool,
) -> None:  # fmt: skip
    """The block in a peer's cache: read from it as a peer reads a block it does not own."""
    length = min(block_size, info.size - index * block_size)
    params: dict[str, str | int] = {
        "m": mount_id, "k": info.key, "e": info.etag, "s": info.size,
        "b": block_size, "i": index, "p": int(pinned), "j": 1,  # j: a preload's read
    }  # fmt: skip
    async with aclosing(fleet.read_block(node, params, 0, length)) as chunks:
        async for _ in chunks:
            pass
