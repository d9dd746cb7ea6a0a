"""Where the bytes of a read come from, behind one small protocol (`BlockSource`): this node's
pages (`PageSource`, filled from the store on a miss), the peers that own a block
(`PeerSource`), and the store itself (`StoreSource`, the only way bytes come from a store on
the read path: where its errors become S3's and its bytes are counted). And the streams a read
begins before its first byte goes out (`Begun`, `Fetched`, `primed`), so that what a source
says first (gone, changed, unavailable) is known before any header is sent."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import replace
from typing import Any, Generic, Protocol, TypeVar

from gateway import counters, timing
from gateway.cache import Arrival, Fetch, FileRegion, Fills
from gateway.cluster.peers import Fleet, PeerUnavailable
from gateway.service.namespace import MountHandle
from gateway.service.plan import Span
from gateway.service.store_errors import store_errors
from gateway.stores import ObjectInfo

log = logging.getLogger(__name__)

# A piece of a body: bytes, or a region of a block file that the HTTP server sends itself.
Chunk = bytes | FileRegion
C = TypeVar("C", bytes, Chunk)


class BlockSource(Protocol):
    """Where the bytes of a span come from."""

    def read(self, span: Span, sent: bool = False) -> AsyncGenerator[bytes, None]:
        """The span's bytes; `sent`: bytes of this version have gone to the client already."""
        ...


class StoreSource:
    """A version's bytes from its mount's store: the only way bytes come from a store on the
    read path, where the store's errors become S3's and its bytes are counted."""

    __slots__ = ("handle", "info")

    def __init__(self, handle: MountHandle, info: ObjectInfo) -> None:
        self.handle = handle
        self.info = info

    def read(self, span: Span, sent: bool = False) -> AsyncGenerator[bytes, None]:
        return self.range(span.offset + span.start, span.offset + span.end)

    def fetch(self, span: Span) -> Fetch:
        """Bytes [skip, stop) of the span's block (to its end by default): what the page store
        fills it (or its sub-blocks) with."""

        def rest(skip: int, stop: int | None = None) -> AsyncGenerator[bytes, None]:
            return self.range(
                span.offset + skip, span.offset + (span.length if stop is None else stop)
            )

        return rest

    async def range(self, start: int, end: int) -> AsyncGenerator[bytes, None]:
        if start >= end:
            return
        info, store = self.info, self.handle.store
        if info.version_id is None:
            stream = store.read(info.key, start, end, info.etag)
        else:  # a version named by its id: that version, whatever the key's current one is
            stream = store.read_version(info.key, info.version_id, start, end, info.etag)
        counted = _counted(self.handle, info.key, stream, time.perf_counter())
        async with aclosing(counted) as chunks:
            async for chunk in chunks:
                yield chunk

    @staticmethod
    async def open(handle: MountHandle, key: str) -> tuple[ObjectInfo, AsyncGenerator[bytes, None]]:
        """The key's current version and its first block's bytes (all of it when the mount
        does not cache), from one store request where the store can."""
        started = time.perf_counter()
        with store_errors(key):
            info, stream = await handle.store.open(
                key, handle.block_size if handle.cache_enabled else None
            )
        counters.store_waited(handle.kind, timing.store_answered(started))
        return info, _counted(handle, key, stream)


async def _counted(
    handle: MountHandle, key: str, stream: AsyncGenerator[bytes, None], asked: float = 0.0
) -> AsyncGenerator[bytes, None]:
    """The store's bytes, counted; `asked`: when the read was begun (its request goes out at
    the first chunk asked for), for the time to its first byte."""
    async with aclosing(stream) as chunks:
        with store_errors(key):
            async for chunk in chunks:
                if asked:
                    counters.store_waited(handle.kind, timing.store_answered(asked))
                    asked = 0.0
                counters.store_bytes(handle.kind, len(chunk))
                yield chunk


class PageSource:
    """Blocks from this node's page store: one read on a hit; on a miss fetched from the store
    while they are kept, one fetch for all the readers of a block. `sparse`: the reader is not
    sequential, so a miss of less than half a block fills only the sub-blocks that hold it.
    `preload`: a preload job's reads, counted apart from the clients' (Fills.read)."""

    __slots__ = ("fills", "pinned", "preload", "sparse", "store")

    def __init__(
        self, fills: Fills, store: StoreSource, pinned: bool, sparse: bool = False,
        preload: bool = False,
    ) -> None:  # fmt: skip
        self.fills = fills
        self.store = store
        self.pinned = pinned
        self.sparse = sparse
        self.preload = preload

    def read(
        self, span: Span, sent: bool = False, fetch: Fetch | None = None
    ) -> AsyncGenerator[bytes, None]:
        # Once bytes of this version are out, a block of it invalidated since is better than
        # a cut response.
        return self.fills.read(
            span.key, span.length, span.start, span.end, fetch or self.store.fetch(span),
            pinned=self.pinned, retired_ok=sent, sparse=self.sparse, preload=self.preload,
        )  # fmt: skip

    async def region(self, span: Span) -> FileRegion | None:
        """The span as a region of its block's file, when the page store can give one."""
        return await self.fills.pages.region(
            span.key, span.length, span.start, span.end, self.pinned
        )  # fmt: skip

    def holds(self, span: Span) -> bool:
        """Whether the span's bytes are all in this node's cache now (the block, or the
        sub-blocks that hold them), none of them still filling."""
        return self.fills.known_range(span.key, span.length, span.start, span.end)

    def ahead(self, span: Span) -> Arrival | None:
        """Start fetching a block a reader will want soon; its fill in flight here, if any
        (Fills.ahead). Not the next span of a sparse read (a range across a block boundary)
        that fills sub-blocks: those are filled when it is read."""
        if self.fills.pages.known(span.key):
            return None
        if self.sparse and span.wanted and self.fills.sparse(span.length, span.start, span.end):
            return None
        return self.fills.ahead(
            span.key, span.length, self.store.fetch(span), pinned=self.pinned
        )  # fmt: skip


class PeerSource:
    """Blocks from the peers that own them, each owner asked from the byte the one before it
    reached; this node's pages when its turn comes among the owners (a replica); the store
    itself when none of them answers."""

    __slots__ = ("fleet", "pages", "params", "store")

    def __init__(self, fleet: Fleet, pages: PageSource, store: StoreSource) -> None:
        self.fleet = fleet
        self.pages = pages
        self.store = store
        info, handle = store.info, store.handle
        self.params: dict[str, str | int] = {
            "m": handle.id, "k": info.key, "e": info.etag, "s": info.size,
            "b": handle.block_size, "p": int(pages.pinned),
        }  # fmt: skip
        if info.version_id is not None:
            self.params["v"] = info.version_id
        if pages.sparse:
            self.params["r"] = 1  # the owner fills sub-blocks for a small range, as we would

    async def read(self, span: Span, sent: bool = False) -> AsyncGenerator[bytes, None]:
        pos = span.start
        params = {**self.params, "i": span.index}
        for node in span.owners:
            if node.id == self.fleet.me.id:
                async with aclosing(self.pages.read(replace(span, start=pos), sent)) as chunks:
                    async for chunk in chunks:
                        yield chunk
                return
            try:
                async with aclosing(self.fleet.read_block(node, params, pos, span.end)) as chunks:
                    async for chunk in chunks:
                        pos += len(chunk)
                        yield chunk
                return
            except PeerUnavailable as exc:
                log.warning("peer failed, trying the next: %s", exc)
        async with aclosing(self.store.read(replace(span, start=pos))) as rest:
            async for chunk in rest:
                yield chunk


class Begun:
    """A span of this node's read begun before the response's first byte: its first bytes
    (or the error its source answered first) awaited in a task of their own, as an Arrival;
    then read on in turn, holding no more than its source's stream."""

    __slots__ = ("_chunks", "_first")

    def __init__(self, chunks: AsyncGenerator[bytes, None]) -> None:
        self._chunks = chunks
        self._first: asyncio.Task[bytes | None] = asyncio.create_task(_next_chunk(chunks))

    async def started(self) -> BaseException | None:
        await asyncio.wait([self._first])
        return None if self._first.cancelled() else self._first.exception()

    async def read(self) -> AsyncGenerator[bytes, None]:
        first = await self._first
        if first is not None:
            yield first
        async with aclosing(self._chunks) as chunks:
            async for chunk in chunks:
                yield chunk

    async def aclose(self) -> None:
        self._first.cancel()
        await asyncio.wait([self._first])
        if not self._first.cancelled():
            self._first.exception()  # retrieved: the read ended before its turn
        await self._chunks.aclose()


async def _next_chunk(chunks: AsyncGenerator[bytes, None]) -> bytes | None:
    try:
        return await anext(chunks)
    except StopAsyncIteration:
        return None


class Fetched:
    """A block a peer serves, fetched ahead whole in a task of its own; as an Arrival, its
    first bytes or the error it ended with (a peer's error comes before its first byte: the
    owner primes what it serves)."""

    __slots__ = ("_first", "task")

    def __init__(self, body: AsyncGenerator[bytes, None]) -> None:
        self._first: asyncio.Future[BaseException | None] = (
            asyncio.get_running_loop().create_future()
        )
        self.task = asyncio.create_task(self._collect(body))
        self.task.add_done_callback(self._ended)

    async def _collect(self, body: AsyncGenerator[bytes, None]) -> bytes:
        parts = []
        async with aclosing(body) as chunks:
            async for chunk in chunks:
                if not self._first.done():
                    self._first.set_result(None)
                parts.append(chunk)
        return b"".join(parts)

    def _ended(self, task: asyncio.Task[bytes]) -> None:
        # Cancelled (the read ended first), or failed before a byte: retrieved here, as the
        # read that started it may never await it.
        error = None if task.cancelled() else task.exception()
        if not self._first.done():
            self._first.set_result(error)

    async def started(self) -> BaseException | None:
        return await asyncio.shield(self._first)


async def once(data: bytes) -> AsyncGenerator[bytes, None]:
    yield data


async def primed(gen: AsyncGenerator[C, None]) -> AsyncGenerator[C, None]:
    """`gen` with its first chunk in hand: what a source says first (gone, changed,
    unavailable) is known before any header is sent. Closing it closes `gen`, read or not."""
    try:
        first = await gen.__anext__()
    except StopAsyncIteration:
        return once(b"")
    except BaseException:
        await gen.aclose()
        raise
    return _Primed(first, gen)


class _Primed(AsyncGenerator[C, None], Generic[C]):
    __slots__ = ("_first", "_rest")

    def __init__(self, first: C, rest: AsyncGenerator[C, None]) -> None:
        self._first: C | None = first
        self._rest: AsyncGenerator[C, None] = rest

    async def asend(self, value: None) -> C:
        first = self._first
        if first is not None:
            self._first = None
            return first
        return await self._rest.asend(value)

    async def athrow(self, *args: Any) -> C:
        return await self._rest.athrow(*args)

    async def aclose(self) -> None:
        self._first = None
        await self._rest.aclose()
