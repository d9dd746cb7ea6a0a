"""The page store: objects cached as fixed-size blocks on local SSD, shared by the worker
processes of one node.

A block is named by (mount, key, version, block size, index), so a new version never meets an
old one's bytes. Reads look in the memory tier, then join a fill in flight in this process,
then read the block file (one worker-thread hop: open, pread, close). A miss starts one fill
per block on the node: the filler claims inflight/<name> (blockfile.claim), streams the bytes
from the store to every reader as they arrive while writing them, and renames the finished
file into place. A reader in another process follows the in-flight file as it grows.

Which blocks exist and how much room they take is the janitor's business (janitor.py): one
process of the node evicts, the others tell it what they filled and used through their
journals. A worker therefore keeps no index of its own: a block is present if its file opens.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import random
from collections.abc import AsyncGenerator, Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from awscrt.checksums import crc32c

from gateway.cache import blockfile
from gateway.cache.janitor import Janitor, JanitorStats, read_stats
from gateway.cache.journal import JournalWriter
from gateway.cache.layout import (
    BLOCKS_DIR,
    FLAG_PINNED,
    INFLIGHT_DIR,
    JOURNAL_DIR,
    block_path,
    file_size,
    trailer,
)
from gateway.cache.memory import MemoryTier

log = logging.getLogger("gateway.cache")
T = TypeVar("T")

_NAME_DOMAIN = b"gateway.cache.block.v1\x00"
WRITE_BATCH = 1 << 20  # a fill writes to its file in batches of this size
FOLLOW_POLL = 0.005  # seconds between looks at another process's fill that has no new bytes
FOLLOW_STALL = 120.0  # a fill that shows no progress this long is given up on
JOURNAL_FLUSH = 0.5
_VERIFIED_MAX = 1 << 20


@dataclass(frozen=True, slots=True)
class BlockKey:
    """One block of one object version."""

    mount_id: int
    key: str
    etag: str
    block_size: int
    index: int
    digest: bytes = field(init=False, repr=False, compare=False)  # sha256: the journal's name
    name: str = field(init=False, repr=False, compare=False)  # its hex: the file's name

    def __post_init__(self) -> None:
        digest = hashlib.sha256(_NAME_DOMAIN)
        parts = (str(self.mount_id), self.key, self.etag, str(self.block_size), str(self.index))
        for part in parts:
            # Length prefixes make the encoding unambiguous whatever bytes a key or ETag holds.
            raw = part.encode("utf-8", "surrogatepass")
            digest.update(len(raw).to_bytes(8, "big"))
            digest.update(raw)
        raw = digest.digest()
        object.__setattr__(self, "digest", raw)
        object.__setattr__(self, "name", raw.hex())


@dataclass(slots=True)
class PageStats:
    hits: int = 0  # block reads answered from memory or disk
    memory_hits: int = 0
    misses: int = 0  # block reads that had to fetch, or wait for a fetch
    joins: int = 0  # misses that joined a fill in flight instead of fetching again
    hit_bytes: int = 0
    fills: int = 0  # fills this process led to the end and kept
    fill_failures: int = 0
    prefetches: int = 0
    corrupt: int = 0  # damaged block files found and dropped
    written: int = 0  # blocks entered by write-through


class FillFailed(Exception):
    """The fill of a block ended without all its bytes (the store failed, or its filler died)."""


Fetch = Callable[[], AsyncGenerator[bytes, None]]


class _Fill:
    """A block on its way in: its bytes so far, shared with every reader in this process."""

    __slots__ = ("_event", "chunks", "done", "error", "length", "name", "received", "task")

    def __init__(self, name: str, length: int) -> None:
        self.name = name
        self.length = length
        self.chunks: list[bytes] = []
        self.received = 0
        self.done = False
        self.error: BaseException | None = None
        self._event = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def append(self, data: bytes) -> None:
        if data:
            self.chunks.append(data)
            self.received += len(data)
            self._wake()

    def finish(self, error: BaseException | None = None) -> None:
        if not self.done:
            if error is None and self.received != self.length:
                error = FillFailed(f"block fill got {self.received} of {self.length} bytes")
            self.done, self.error = True, error
            self._wake()

    def _wake(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def read(self, start: int, end: int) -> AsyncGenerator[bytes, None]:
        """Bytes [start, end) of the block as they arrive."""
        index = pos = 0
        while pos < end:
            chunks = self.chunks
            while index < len(chunks) and pos < end:
                chunk = chunks[index]
                index += 1
                lo, hi = pos, pos + len(chunk)
                pos = hi
                if hi <= start:
                    continue
                if lo >= start and hi <= end:
                    yield chunk
                else:
                    yield chunk[max(start, lo) - lo : min(end, hi) - lo]
            if pos >= end:
                return
            if self.done:
                if self.error is not None:
                    raise self.error
                return
            await self._event.wait()


class PageStore:
    """Blocks of objects under `root`, within `capacity_bytes` (enforced by the janitor)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        capacity_bytes: int,
        min_free_bytes: int = 0,
        memory_bytes: int = 64 << 20,
        memory_object_max: int = 256 << 10,
        fsync: bool = False,
        io_threads: int = 8,
        fill_concurrency: int = 16,
        verify_sample: float = 0.01,
        janitor: bool = True,
        janitor_interval: float = 0.5,
    ) -> None:
        if min(capacity_bytes, min_free_bytes, memory_bytes) < 0:
            raise ValueError("cache sizes must not be negative")
        if not 0.0 <= verify_sample <= 1.0:
            raise ValueError("verify_sample is a share between 0 and 1")
        self.root = os.path.abspath(os.fspath(root))
        self.capacity = capacity_bytes
        self.min_free = min_free_bytes
        self._fsync = fsync
        self._io_threads = io_threads
        self._verify_sample = verify_sample
        self.memory = MemoryTier(memory_bytes, memory_object_max)
        self.stats = PageStats()
        self._fills: dict[str, _Fill] = {}
        self._verified: dict[str, None] = {}
        self._prefetch_slots = max(1, fill_concurrency)
        self._prefetching = 0
        self._io: ThreadPoolExecutor | None = None
        self._journal: JournalWriter | None = None
        self._janitor = (
            Janitor(self.root, capacity_bytes, min_free_bytes, interval=janitor_interval)
            if janitor
            else None
        )
        self._flusher: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- life cycle -----------------------------------------------------------------------------

    async def open(self) -> None:
        if self._io is not None:
            raise RuntimeError("page store is already open")
        for sub in (BLOCKS_DIR, INFLIGHT_DIR, JOURNAL_DIR):
            os.makedirs(os.path.join(self.root, sub), exist_ok=True)
        self._io = ThreadPoolExecutor(self._io_threads, thread_name_prefix="cache-io")
        removed = await self._hop(blockfile.clean_inflight, self.root)
        if removed:
            log.info("cache: removed %d fills a crash left behind", removed)
        self._journal = await asyncio.to_thread(JournalWriter, self.root)
        if self._janitor is not None:
            self._janitor.start()
        self._flusher = asyncio.create_task(self._flush_journal())

    async def close(self) -> None:
        if self._io is None:
            return
        for fill in list(self._fills.values()):
            if fill.task is not None:
                fill.task.cancel()
        pending = [f.task for f in self._fills.values() if f.task is not None]
        pending += list(self._tasks)
        if pending:
            await asyncio.wait(pending, timeout=5)
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        journal, self._journal = self._journal, None
        io, self._io = self._io, None
        janitor = self._janitor
        self.memory.clear()

        def shut() -> None:
            if journal is not None:
                journal.close()
            if janitor is not None:
                janitor.stop()
            io.shutdown(wait=True)

        await asyncio.to_thread(shut)

    @property
    def fills_in_flight(self) -> int:
        return len(self._fills)

    async def settle(self) -> None:
        """Wait until no fill is in flight in this process (the blocks read are on disk)."""
        while self._fills:
            tasks = [f.task for f in self._fills.values() if f.task is not None]
            await asyncio.wait(tasks)

    def set_quotas(self, quotas: Mapping[int, int]) -> None:
        if self._janitor is not None:
            self._janitor.set_quotas(quotas)

    def janitor_stats(self) -> JanitorStats | None:
        """What the node's janitor last published (bytes per mount, evictions...); blocking,
        but only reads one small file: call it at scrape time, not on a request path."""
        return read_stats(self.root)

    # -- reads ----------------------------------------------------------------------------------

    def peek(self, bkey: BlockKey, pinned: bool = False) -> bytes | None:
        """The block's bytes if they are in the memory tier: no I/O at all."""
        data = self.memory.get(bkey.name)
        if data is not None:
            self.stats.hits += 1
            self.stats.memory_hits += 1
            self.stats.hit_bytes += len(data)
            if self._journal is not None:
                # A block hot in memory must look hot to the janitor too.
                self._journal.access(bkey.digest, bkey.mount_id, pinned)
        return data

    def known(self, bkey: BlockKey) -> bool:
        """In memory or verified on disk by this process: a cheap guess that it is cached."""
        name = bkey.name
        return name in self.memory or name in self._verified

    async def read(
        self,
        bkey: BlockKey,
        length: int,
        start: int,
        end: int,
        fetch: Fetch,
        *,
        pinned: bool = False,
    ) -> AsyncGenerator[bytes, None]:
        """Bytes [start, end) of the block (`length` bytes in all), from the cache or, on a
        miss, from `fetch()` (the whole block from the store), caching it on the way."""
        data = self.peek(bkey, pinned)
        if data is not None:
            yield data if (start, end) == (0, length) else data[start:end]
            return
        fill = self._fills.get(bkey.name)
        if fill is None:
            data = await self._read_disk(bkey, length, start, end, pinned)
            if data is not None:
                yield data
                return
            fill = self._fills.get(bkey.name)
            if fill is None:
                fill = self._start_fill(bkey, length, fetch, pinned)
            else:
                self.stats.joins += 1
        else:
            self.stats.joins += 1
        self.stats.misses += 1
        async for chunk in fill.read(start, end):
            yield chunk

    async def read_hit(
        self, bkey: BlockKey, length: int, start: int, end: int, *, pinned: bool = False
    ) -> bytes | None:
        """Bytes [start, end) if the block is cached (memory or disk), else None: no fetch."""
        data = self.peek(bkey, pinned)
        if data is not None:
            return data if (start, end) == (0, length) else data[start:end]
        if bkey.name in self._fills:
            return None
        return await self._read_disk(bkey, length, start, end, pinned)

    def prefetch(self, bkey: BlockKey, length: int, fetch: Fetch, *, pinned: bool = False) -> bool:
        """Start filling a block a reader will want soon, if a prefetch slot is free and it is
        neither in memory nor in flight. Returns whether a fill was started."""
        name = bkey.name
        if name in self._fills or name in self.memory or self._prefetching >= self._prefetch_slots:
            return False
        self._prefetching += 1
        self.stats.prefetches += 1
        fill = self._start_fill(bkey, length, fetch, pinned, prefetch=True)
        assert fill.task is not None
        fill.task.add_done_callback(self._prefetch_done)
        return True

    def _prefetch_done(self, _: asyncio.Task[None]) -> None:
        self._prefetching -= 1

    async def _read_disk(
        self, bkey: BlockKey, length: int, start: int, end: int, pinned: bool = False
    ) -> bytes | None:
        name = bkey.name
        small = self.memory.accepts(length)
        verify = small or name not in self._verified or random.random() < self._verify_sample
        first, size = (0, length) if small else (start, end - start)
        path = block_path(self.root, bkey.mount_id, name)
        try:
            data = await self._hop(blockfile.read, path, length, first, size, verify)
        except FileNotFoundError:
            return None
        except blockfile.Corrupt as exc:
            log.warning("cache: dropped damaged block %s: %s", name, exc)
            self.stats.corrupt += 1
            self._verified.pop(name, None)
            await self._hop(blockfile.remove, path)
            if self._journal is not None:
                self._journal.drop(bkey.digest, bkey.mount_id)
            return None
        if verify:
            if len(self._verified) >= _VERIFIED_MAX:
                self._verified.clear()
            self._verified[name] = None
        if self._journal is not None:
            self._journal.access(bkey.digest, bkey.mount_id, pinned)
        self.stats.hits += 1
        if small:
            self.memory.put(name, data)
            data = data if (start, end) == (0, length) else data[start:end]
        self.stats.hit_bytes += len(data)
        return data

    # -- fills ----------------------------------------------------------------------------------

    def _start_fill(
        self, bkey: BlockKey, length: int, fetch: Fetch, pinned: bool, prefetch: bool = False
    ) -> _Fill:
        fill = _Fill(bkey.name, length)
        self._fills[bkey.name] = fill
        fill.task = asyncio.create_task(self._fill(fill, bkey, fetch, pinned, prefetch))
        return fill

    async def _fill(
        self, fill: _Fill, bkey: BlockKey, fetch: Fetch, pinned: bool, prefetch: bool
    ) -> None:
        try:
            how, fd = await self._hop(blockfile.claim, self.root, bkey.mount_id, bkey.name)
            if how == blockfile.PRESENT:
                # Another process committed it: read it for whoever joined this fill (a
                # prefetch too: a reader may have joined it, and the read verifies the block).
                data = await self._read_disk(bkey, fill.length, 0, fill.length, pinned)
                if data is None:
                    raise FillFailed(f"block {bkey.name} vanished as it was committed")
                fill.append(data)
                fill.finish()
            elif how == blockfile.FOLLOW:
                assert fd is not None
                await self._follow(fill, fd)
            else:
                assert fd is not None
                await self._lead(fill, bkey, fd, fetch, pinned)
        except BaseException as exc:
            self.stats.fill_failures += 1
            fill.finish(exc)
            if not isinstance(exc, Exception):
                raise
            if prefetch:
                log.info("cache: prefetch of block %s failed: %s", bkey.name, exc)
        finally:
            if self._fills.get(bkey.name) is fill:
                del self._fills[bkey.name]

    async def _lead(self, fill: _Fill, bkey: BlockKey, fd: int, fetch: Fetch, pinned: bool) -> None:
        owned: int | None = fd
        try:
            crc = 0
            batch: list[bytes] = []
            batched = 0
            async with aclosing(fetch()) as source:
                async for chunk in source:
                    if fill.received + len(chunk) > fill.length:
                        raise FillFailed(f"the store sent more than {fill.length} bytes")
                    fill.append(chunk)
                    crc = crc32c(chunk, crc)
                    batch.append(chunk)
                    batched += len(chunk)
                    if batched >= WRITE_BATCH:
                        data, batch, batched = b"".join(batch), [], 0
                        await self._hop(blockfile.write_all, fd, data)
            if fill.received != fill.length:
                raise FillFailed(f"the store sent {fill.received} of {fill.length} bytes")
            flags = FLAG_PINNED if pinned else 0
            owned = None  # commit closes it whatever happens
            kept = await self._hop(
                blockfile.commit,
                fd,
                self.root,
                bkey.mount_id,
                bkey.name,
                b"".join(batch),
                trailer(fill.length, crc, flags),
                self._fsync,
                self.min_free,
            )
        finally:
            if owned is not None:
                await asyncio.shield(self._hop(blockfile.discard, owned, self.root, bkey.name))
        fill.finish()
        if not kept:
            log.warning("cache: block not kept, free disk space is below the floor")
            return
        self.stats.fills += 1
        self._verified[bkey.name] = None
        if self.memory.accepts(fill.length):
            self.memory.put(bkey.name, b"".join(fill.chunks))
        if self._journal is not None:
            self._journal.fill(bkey.digest, file_size(fill.length), bkey.mount_id, pinned)

    async def _follow(self, fill: _Fill, fd: int) -> None:
        """Tail another process's fill of this block until it has all the bytes."""
        loop = asyncio.get_running_loop()
        try:
            idle_since = loop.time()
            while fill.received < fill.length:
                want = min(fill.length - fill.received, WRITE_BATCH)
                data, alive = await self._hop(blockfile.follow, fd, fill.received, want)
                if data:
                    fill.append(data)
                    idle_since = loop.time()
                    continue
                if not alive:
                    # Its filler died or gave up: one last look, the lock goes after the write.
                    data, _ = await self._hop(blockfile.follow, fd, fill.received, want)
                    if not data:
                        raise FillFailed("the process filling this block gave up on it")
                    fill.append(data)
                    continue
                if loop.time() - idle_since > FOLLOW_STALL:
                    raise FillFailed("the fill of this block stalled")
                await asyncio.sleep(FOLLOW_POLL)
            fill.finish()
        finally:
            await asyncio.shield(self._hop(blockfile.close, fd))

    # -- writes and invalidation ----------------------------------------------------------------

    def begin_write(self, mount_id: int, block_size: int, size: int, pinned: bool) -> BlockWriter:
        """Blocks of a body on its way to the store; commit() names them once the store has
        answered with the version."""
        return BlockWriter(self, mount_id, block_size, size, pinned)

    def invalidate(self, mount_id: int, key: str, etag: str, size: int, block_size: int) -> None:
        """Forget every block of this version now (memory at once, files in the background)."""
        names = [
            BlockKey(mount_id, key, etag, block_size, i).name
            for i in range(max(1, -(-size // block_size)))
        ]
        for name in names:
            self.memory.discard(name)
            self._verified.pop(name, None)
        self.spawn(self._drop_files(mount_id, names))

    async def _drop_files(self, mount_id: int, names: list[str]) -> None:
        paths = [block_path(self.root, mount_id, name) for name in names]
        await self._hop(blockfile.remove_all, paths)
        # After the unlink: the janitor forgets a dropped block only once its file is gone.
        if self._journal is not None:
            for name in names:
                self._journal.drop(bytes.fromhex(name), mount_id)

    # -- internals ------------------------------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _hop(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking file step on a worker thread. A cancelled caller still waits for the
        step to end, so no file call ever outlives the code that owns its descriptor."""
        if self._io is None:
            raise RuntimeError("page store is not open")
        future = asyncio.get_running_loop().run_in_executor(self._io, fn, *args)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            with contextlib.suppress(BaseException):
                await future
            raise

    async def _flush_journal(self) -> None:
        while True:
            await asyncio.sleep(JOURNAL_FLUSH)
            journal = self._journal
            if journal is not None:
                try:
                    await self._hop(journal.flush)
                except OSError:
                    log.warning("cache: could not write the journal", exc_info=True)


class BlockWriter:
    """A PUT's bytes cut into blocks as they pass; each whole block is written under a private
    name, and commit() renames them all once the version is known. Never fails the PUT: the
    caller logs and drops on error."""

    def __init__(
        self, pages: PageStore, mount_id: int, block_size: int, size: int, pinned: bool
    ) -> None:
        self._pages = pages
        self._mount_id = mount_id
        self._block_size = block_size
        self._size = size
        self._pinned = pinned
        self._buf = bytearray()
        self._blocks: list[bytes] = []  # whole blocks waiting for their name
        self._received = 0
        self._spooled: list[tuple[str, int, int]] = []  # (private path, index, length)

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        self._received += len(data)
        if self._received > self._size:
            raise FillFailed(f"write of {self._size} bytes received {self._received}")
        self._buf += data
        while len(self._buf) >= self._block_size:
            block = bytes(self._buf[: self._block_size])
            del self._buf[: self._block_size]
            await self._spool(block)

    async def _spool(self, block: bytes) -> None:
        index = len(self._spooled)
        flags = FLAG_PINNED if self._pinned else 0
        path = await self._pages._hop(blockfile.spool, self._pages.root, block, flags)
        self._spooled.append((path, index, len(block)))
        if len(block) <= self._pages.memory.object_max:
            self._blocks.append(block)

    async def commit(self, key: str, etag: str) -> None:
        if self._received != self._size:
            raise FillFailed(f"write of {self._size} bytes received {self._received}")
        if self._buf or self._size == 0:
            block, self._buf = bytes(self._buf), bytearray()
            await self._spool(block)
        pages = self._pages
        named = []
        for path, index, length in self._spooled:
            bkey = BlockKey(self._mount_id, key, etag, self._block_size, index)
            named.append((path, block_path(pages.root, self._mount_id, bkey.name), bkey, length))
        self._spooled = []
        await pages._hop(blockfile.install_all, [(p, d) for p, d, _, _ in named])
        journal = pages._journal
        for _, _, bkey, length in named:
            pages.stats.written += 1
            pages._verified[bkey.name] = None
            if journal is not None:
                journal.fill(bkey.digest, file_size(length), self._mount_id, self._pinned)
        if len(named) == 1 and self._blocks:
            pages.memory.put(named[0][2].name, self._blocks[0])

    async def abort(self) -> None:
        spooled, self._spooled = self._spooled, []
        self._buf = bytearray()
        if spooled:
            await self._pages._hop(blockfile.remove_all, [p for p, _, _ in spooled])
