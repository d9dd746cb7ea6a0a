"""How a key whose version a node does not know is opened: one request that tells the version
with the bytes of block 0, made by this node's store (block 0 filled into its pages as it
arrives) or by the peer that owns block 0. What is learnt, and who may open a key when, is the
version authority's (versions.Versions.open); this module only moves the bytes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass

from gateway.cache import Fills
from gateway.cluster.peers import Fleet, PeerUnavailable
from gateway.cluster.placement import Node
from gateway.generations import OpenClaims
from gateway.service.namespace import MountHandle
from gateway.service.plan import Span, block_key
from gateway.service.sources import StoreSource, primed
from gateway.stores import ObjectInfo

log = logging.getLogger(__name__)

OPEN_POLL = 0.001  # first look again at a sibling worker's open of a key (doubling to 20 ms)
OPEN_WAIT = 60.0  # a sibling's open taking longer than this: open the key here as well


@dataclass(frozen=True, slots=True)
class Opened:
    """A key opened: its version, block 0's bytes (all of the object when the mount does not
    cache; primed: the store's first word is in), and how ("miss", "forward", "bypass")."""

    info: ObjectInfo
    head: AsyncGenerator[bytes, None]
    how: str


def openers(fleet: Fleet | None, handle: MountHandle, key: str) -> tuple[Node, ...]:
    """The peers to ask to open the key, best first: the owners of its block 0 before this
    node; none when this node owns it (block 0 is placed by the key alone)."""
    if fleet is None or fleet.alone:
        return ()
    owners = fleet.owners(handle.id, key, "", 0, handle.replicas)
    for i, node in enumerate(owners):
        if node.id == fleet.me.id:
            return owners[:i]
    return owners


async def from_store(
    fills: Fills, handle: MountHandle, key: str, pinned: bool | None, preload: bool = False
) -> tuple[ObjectInfo, AsyncGenerator[bytes, None]]:
    """The key opened with one store request; block 0 filled into this node's pages from it,
    its fill claimed and its first bytes in when this returns (primed)."""
    info, stream = await StoreSource.open(handle, key)
    if not handle.cache_enabled or info.size == 0:
        return info, await primed(stream)
    length = min(handle.block_size, info.size)
    bkey = block_key(handle.id, key, info.etag, handle.block_size, 0)
    span = Span(0, bkey, 0, length, 0, length)
    if pinned is None:
        pinned = handle.pinned(info.key)
    return info, await primed(_filled(fills, handle, info, span, stream, pinned, preload))


async def _filled(
    fills: Fills, handle: MountHandle, info: ObjectInfo, span: Span,
    opened: AsyncGenerator[bytes, None], pinned: bool, preload: bool = False,
) -> AsyncGenerator[bytes, None]:  # fmt: skip
    """Block 0 through this node's pages, filled from the stream the store opened with."""
    store = StoreSource(handle, info)
    used = False

    def fetch(skip: int, stop: int | None = None) -> AsyncGenerator[bytes, None]:
        nonlocal used
        if skip == 0 and stop in (None, span.length) and not used:
            used = True
            return opened
        return store.fetch(span)(skip, stop)

    try:
        # The version was opened just now: its block 0 is not on disk but for a race, which
        # the fill's claim finds (it reads the block then), so no look at the disk first.
        chunks = fills.read(
            span.key, span.length, span.start, span.end, fetch, pinned=pinned, cold=True,
            preload=preload,
        )  # fmt: skip
        async with aclosing(chunks):
            async for chunk in chunks:
                yield chunk
    finally:
        if not used:
            await opened.aclose()


async def from_peer(
    fleet: Fleet, node: Node, handle: MountHandle, key: str
) -> tuple[ObjectInfo, AsyncGenerator[bytes, None]]:
    """The key opened by the peer that owns its block 0: the version, and the block's bytes,
    the rest of them from the store if the peer fails midway. PeerUnavailable before that."""
    params: dict[str, str | int] = {
        "m": handle.id, "k": key, "b": handle.block_size, "p": int(handle.pinned(key))
    }  # fmt: skip
    info, stream = await fleet.open_object(node, params)
    return info, await primed(_resumed(handle, info, stream))


async def _resumed(
    handle: MountHandle, info: ObjectInfo, stream: AsyncGenerator[bytes, None]
) -> AsyncGenerator[bytes, None]:
    pos = 0
    try:
        async with aclosing(stream) as chunks:
            async for chunk in chunks:
                pos += len(chunk)
                yield chunk
        return
    except PeerUnavailable as exc:
        log.warning("peer cut block 0 of %s, reading on from the store: %s", info.key, exc)
    rest = StoreSource(handle, info).range(pos, min(handle.block_size, info.size))
    async with aclosing(rest) as chunks:
        async for chunk in chunks:
            yield chunk


async def sibling_opened(claims: OpenClaims, byte: int) -> bool:
    """Wait while another worker of the node opens a key: True once it has (its version is
    known then), False if it has not within OPEN_WAIT (this worker opens it then)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + OPEN_WAIT
    pause = OPEN_POLL
    while not claims.free(byte):
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(pause)  # a lock held for the store's first byte, no event to await
        pause = min(pause * 2, 0.02)
    return True
