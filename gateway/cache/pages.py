"""The page store: objects cached as fixed-size blocks on local SSD, shared by the worker
processes of one node.

A block is named by (mount, key, version, block size, index), so a new version never meets an
old one's bytes. Reads look in the memory tier, then join a fill in flight in this process,
then read the block file (one worker-thread hop: open, pread, close). A miss starts one fill
per block on the node: the filler claims inflight/<name> (blockfile.claim), streams the bytes
from the store to every reader as they arrive while writing them, and renames the finished
file into place. A reader in another process follows the in-flight file as it grows.

A fill never fails its readers for the cache's sake: when the disk cannot take the block (full,
failing), or another process's fill of it ends without it, the bytes come from the store and
the block is not kept. Only the store's own failures reach a reader.

Which blocks exist and how much room they take is the janitor's business (janitor.py): one
process of the node evicts, the others tell it what they filled and used through their
journals. A worker therefore keeps no index of its own: a block is present if its file opens.
What it keeps on disk besides the blocks is, per key, the name of the cached block 0
(blockfile.set_key), so that a restarted process knows what it holds without the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import os
import random
import time
from collections.abc import AsyncGenerator, Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from gateway.cache import blockfile, subblocks
from gateway.cache.janitor import Janitor, JanitorStats, read_stats
from gateway.cache.journal import JournalWriter
from gateway.cache.layout import (
    BLOCKS_DIR,
    FLAG_PINNED,
    INFLIGHT_DIR,
    JOURNAL_DIR,
    PIECE,
    RETIRED_DIR,
    Checksums,
    block_path,
    file_size,
    retired_path,
)
from gateway.cache.memory import MemoryTier
from gateway.cache.subblocks import SubKey

log = logging.getLogger("gateway.cache")
T = TypeVar("T")

_NAME_DOMAIN = b"gateway.cache.block.v1\x00"
_KEY_DOMAIN = b"gateway.cache.key.v1\x00"
_FROM_BLOCK = "from block"  # a sub-block claim given up: its bytes come from the block
WRITE_BATCH = 1 << 20  # a fill writes to its file in batches of this size
FOLLOW_POLL = 0.005  # seconds between looks at another process's fill that has no new bytes
FOLLOW_STALL = 120.0  # a fill that shows no progress this long is given up on
JOURNAL_FLUSH = 0.5
_VERIFIED_MAX = 1 << 20
# Seconds a block whose whole data this process checked may be sent from its file unread
# (zero-copy) before the next send checks it again (docs/cache.md, "Zero-copy sends").
ZERO_COPY_RECHECK = 60.0
_SETTLE_TRIES = 3  # a block found committed, then gone, is claimed this often before streaming
_WARN_EVERY = 60.0  # seconds between two warnings about the cache's disk


def _hashed(domain: bytes, parts: tuple[str, ...]) -> bytes:
    digest = hashlib.sha256(domain)
    for part in parts:
        # Length prefixes make the encoding unambiguous whatever bytes a key or ETag holds.
        raw = part.encode("utf-8", "surrogatepass")
        digest.update(len(raw).to_bytes(8, "big"))
        digest.update(raw)
    return digest.digest()


def key_name(mount_id: int, key: str) -> str:
    """The name under which the cached version of a key is recorded."""
    return _hashed(_KEY_DOMAIN, (str(mount_id), key)).hex()


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
        parts = (str(self.mount_id), self.key, self.etag, str(self.block_size), str(self.index))
        raw = _hashed(_NAME_DOMAIN, parts)
        object.__setattr__(self, "digest", raw)
        object.__setattr__(self, "name", raw.hex())

    @property
    def version(self) -> Version:
        return (self.mount_id, self.key, self.etag, self.block_size)


Version = tuple[int, str, str, int]  # mount id, key, ETag, block size: one object version


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
    unkept: int = 0  # blocks served from the store but not kept: the disk failed (full...)
    zero_copy: int = 0  # block reads handed over as file regions, to be sent unread
    rechecks: int = 0  # of those, the ones whose block was read and checked first


class FileRegion:
    """Bytes of a block file to be sent as they are (sendfile), by whoever takes it: it owns
    the open descriptor, which `close()` closes (also when it is dropped unsent)."""

    __slots__ = ("count", "fd", "offset")

    def __init__(self, fd: int, offset: int, count: int) -> None:
        self.fd = fd
        self.offset = offset
        self.count = count

    def __len__(self) -> int:
        return self.count

    def read(self) -> bytes:
        """The bytes, read into memory (blocking: for a server that cannot send a file)."""
        return blockfile.pread_exact(self.fd, self.count, self.offset)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        self.close()


class FillFailed(Exception):
    """The fill of a block ended without all its bytes (the store failed, or its filler died)."""


class Fetch(Protocol):
    """The block's bytes [skip, stop) from the store (`stop` None: to the block's end)."""

    def __call__(self, skip: int, stop: int | None = None, /) -> AsyncGenerator[bytes, None]: ...


Entry = BlockKey | SubKey  # what has a file of its own in blocks/: a block, or a sub-block


class _Fill:
    """A block on its way in: its bytes so far, shared with every reader in this process."""

    __slots__ = (
        "_event", "chunks", "deciding", "done", "error", "length", "name", "received", "subs",
        "task",
    )  # fmt: skip

    def __init__(self, name: str, length: int) -> None:
        self.name = name
        self.length = length
        # A block's fill: whether it may still take sub-blocks being filled in this process
        # (it has not looked yet), and which it takes (their fills it then waits for).
        self.deciding = True
        self.subs: list[bool] | None = None
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

    async def started(self) -> BaseException | None:
        """Wait for the first bytes or the end; the error of a fill that ended without any."""
        while not self.received and not self.done:
            await self._event.wait()
        return self.error if not self.received else None

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
        verify_sample: float = 1.0,
        zero_copy_recheck: float = ZERO_COPY_RECHECK,
        janitor: bool = True,
        janitor_interval: float = 0.5,
        sweep_interval: float = 60.0,
        drop_delay: float = 30.0,
        sub_block_size: int = 0,
    ) -> None:
        if min(capacity_bytes, min_free_bytes, memory_bytes) < 0:
            raise ValueError("cache sizes must not be negative")
        if sub_block_size and sub_block_size < PIECE:
            raise ValueError(f"a sub-block is at least {PIECE} bytes (0: none)")
        if not 0.0 <= verify_sample <= 1.0:
            raise ValueError("verify_sample is a share between 0 and 1")
        self.root = os.path.abspath(os.fspath(root))
        self.capacity = capacity_bytes
        self.min_free = min_free_bytes
        self._fsync = fsync
        self._io_threads = io_threads
        self._verify_sample = verify_sample
        self._recheck = zero_copy_recheck if blockfile.CACHESTAT else 0.0
        self._drop_delay = drop_delay
        self.sub_size = sub_block_size  # 0: reads of a few random bytes fill whole blocks
        self.memory = MemoryTier(memory_bytes, memory_object_max)
        self.stats = PageStats()
        self._fills: dict[str, _Fill] = {}
        self._fill_ended: asyncio.Future[None] | None = None  # for waiters on any fill's end
        self._verified: dict[str, None] = {}
        # Blocks whose whole data this process checked (or wrote), and when: zero-copy sends.
        self._checked: dict[str, float] = {}
        self._held: dict[Version, int] = {}  # versions read now -> readers
        # Versions invalidated here, their blocks in retired/ -> (size, when they may go).
        self._retired: dict[Version, tuple[int, float]] = {}
        self._timers: dict[Version, asyncio.TimerHandle] = {}  # their drop_delay running
        self._prefetch_slots = max(1, fill_concurrency)
        self._prefetching = 0
        self._io: ThreadPoolExecutor | None = None
        self._journal: JournalWriter | None = None
        self._janitor = (
            Janitor(
                self.root,
                capacity_bytes,
                min_free_bytes,
                interval=janitor_interval,
                sweep_interval=sweep_interval,
            )
            if janitor
            else None
        )
        self._flusher: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._warned = 0.0

    # -- life cycle -----------------------------------------------------------------------------

    async def open(self) -> None:
        if self._io is not None:
            raise RuntimeError("page store is already open")
        for sub in (BLOCKS_DIR, INFLIGHT_DIR, JOURNAL_DIR, RETIRED_DIR):
            os.makedirs(os.path.join(self.root, sub), exist_ok=True)
        self._io = ThreadPoolExecutor(self._io_threads, thread_name_prefix="cache-io")
        removed = await self._hop(blockfile.sweep_inflight, self.root)
        removed += await self._hop(blockfile.sweep_retired, self.root)
        if removed:
            log.info("cache: removed %d files of fills and writes a crash left behind", removed)
        await self._open_journal()
        if self._janitor is not None:
            self._janitor.start()
        self._flusher = asyncio.create_task(self._flush_journal())

    async def _open_journal(self) -> None:
        try:
            self._journal = await asyncio.to_thread(JournalWriter, self.root)
        except OSError as exc:
            # A full disk must not keep the node from serving: the janitor's rescan finds
            # what goes unjournaled; the journal is tried again at each flush.
            self._disk_trouble("could not open a journal", exc)

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
        for version in list(self._retired):
            self._remove_retired(version)  # no reader is left to wait for
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
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

    async def any_fill_ended(self) -> None:
        """Wait until a fill in flight in this process ends (at once if there is none)."""
        if not self._fills:
            return
        if self._fill_ended is None:
            self._fill_ended = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._fill_ended)

    async def settle(self) -> None:
        """Wait until no fill and no file task (a retirement, a removal) is in flight in this
        process: the blocks read are on disk, the invalidated ones moved."""
        while self._fills or self._tasks:
            tasks = [f.task for f in self._fills.values() if f.task is not None]
            await asyncio.wait([*tasks, *self._tasks])

    def set_quotas(self, quotas: Mapping[int, int]) -> None:
        if self._janitor is not None:
            self._janitor.set_quotas(quotas)

    def janitor_stats(self) -> JanitorStats | None:
        """What the node's janitor last published (bytes per mount, evictions...); blocking,
        but only reads one small file: call it at scrape time, not on a request path."""
        return read_stats(self.root)

    def unpin(self, bkey: BlockKey) -> bool:
        """Take the block's pin off (an operator's `gateway load --unpin`): the janitor may
        evict it from its next pass on. Only a journal record, written with the next flush
        (or flush_journal()); False when this process has no journal to write it in (its
        disk failing)."""
        if self._journal is None:
            return False
        self._journal.unpin(bkey.digest, bkey.mount_id)
        return True

    def unpin_mount(self, mount_id: int) -> bool:
        """unpin() of every pinned block of the mount, whichever version it is of."""
        if self._journal is None:
            return False
        self._journal.unpin_mount(mount_id)
        return True

    async def flush_journal(self) -> None:
        """Write the journal's records now, not within the next half second: an unpin is
        reported done only once a restart would find it (the janitor replays the journals).
        Raises OSError when they could not be written (they are lost)."""
        journal = self._journal
        if journal is not None:
            await self._hop(journal.flush)

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

    def peek_disk(self, bkey: BlockKey, length: int, pinned: bool = False) -> memoryview | None:
        """The whole block from its file without waiting for the disk, so on the event loop:
        only a block this process has read from disk before (its file was there and is most
        likely in the page cache still), and only if all of it is in memory now. None for
        anything else: the full read path reads it on a thread."""
        name = bkey.name
        if name not in self._verified or name in self._fills or self._io is None:
            return None
        small = self.memory.accepts(length)
        path = block_path(self.root, bkey.mount_id, name)
        try:
            data = blockfile.read_resident(path, length, self._verifies(name, small))
        except (blockfile.Corrupt, OSError):
            # The full path reads it again, checks it (no longer counted as verified) and
            # drops it, or says what the disk's trouble is.
            self._unverify(name)
            return None
        if data is None:
            return None
        self._disk_hit(bkey, pinned)
        self.stats.hit_bytes += length
        if small:
            self.memory.put(name, bytes(data))
        return data

    def may_answer(self, bkey: BlockKey, disk: bool) -> bool:
        """Whether peek() (or, with `disk`, peek_disk()) may find the block: in the memory
        tier, or read and verified from disk by this process and not being filled. Nothing is
        read or counted."""
        name = bkey.name
        if name in self.memory:
            return True
        return disk and name in self._verified and name not in self._fills and self._io is not None

    async def region(
        self, bkey: BlockKey, length: int, start: int, end: int, pinned: bool = False
    ) -> FileRegion | None:
        """Bytes [start, end) of the block as a region of its file, to be sent without being
        read into this process (zero-copy), or None: the block is in memory, not read or
        filled by this process before, being filled, gone, or not all in the page cache (a
        send must not wait for the disk on the event loop). A block whose whole data this
        process has not checked within `zero_copy_recheck` seconds is read and checked first,
        on a thread (docs/cache.md, "Zero-copy sends"); a damaged one is dropped, as a read
        drops it, and None tells the caller to read it the ordinary way (fetched again)."""
        name = bkey.name
        if (
            self._recheck <= 0
            or end <= start
            or name not in self._verified
            or name in self._fills
            or name in self.memory
            or self._io is None
        ):
            return None
        path = block_path(self.root, bkey.mount_id, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            checked = self._checked.get(name)
            if checked is None or time.monotonic() - checked > self._recheck:
                await self._hop(blockfile.check, fd, length)
                self._checked_now(name)
                self.stats.rechecks += 1
            elif not blockfile.sendable(fd, length, start, end - start):
                os.close(fd)
                return None
        except blockfile.Corrupt as exc:
            os.close(fd)
            await self._drop_damaged(bkey, path, exc)
            return None
        except OSError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        self._disk_hit(bkey, pinned)
        self.stats.hit_bytes += end - start
        self.stats.zero_copy += 1
        return FileRegion(fd, start, end - start)

    def _checked_now(self, name: str) -> None:
        if len(self._checked) >= _VERIFIED_MAX:
            self._checked.clear()
        self._checked[name] = time.monotonic()

    def _unverify(self, name: str) -> None:
        self._verified.pop(name, None)
        self._checked.pop(name, None)

    def known(self, bkey: BlockKey) -> bool:
        """In memory or read from disk by this process: a cheap guess that it is cached."""
        name = bkey.name
        return name in self.memory or name in self._verified

    def known_range(self, bkey: BlockKey, length: int, start: int, end: int) -> bool:
        """known() of the block, or of every sub-block holding bytes [start, end) of it (read
        or filled by this process, and no longer filling)."""
        if self.known(bkey):
            return True
        if not self.sparse(length, start, end):
            return False
        for index in subblocks.covering(start, end, self.sub_size):
            name = _sub_key(bkey.mount_id, bkey.digest, index).name
            if name not in self._verified or name in self._fills:
                return False
        return True

    def sparse(self, length: int, start: int, end: int) -> bool:
        """Whether a sparse read of bytes [start, end) of a block of `length` bytes that misses
        fills sub-blocks rather than the block (subblocks.applies)."""
        return subblocks.applies(length, start, end, self.sub_size)

    def filling(self, bkey: BlockKey) -> bool:
        """Whether the block is being fetched (or followed) in this process."""
        return bkey.name in self._fills

    async def fill_ended(self, bkey: BlockKey) -> None:
        """Wait until this process's fill of the block, if one is in flight, has ended (kept
        or not): its readers may have all its bytes before it is committed."""
        fill = self._fills.get(bkey.name)
        if fill is not None and fill.task is not None:
            await asyncio.wait([fill.task])

    async def block_file(self, bkey: BlockKey) -> str | None:
        """The path of the block's committed file, if it is there now (it may go at any time:
        a descriptor opened on it stays readable); a fill of it in flight is waited for."""
        await self.fill_ended(bkey)
        path = block_path(self.root, bkey.mount_id, bkey.name)
        return path if await self._hop(blockfile.exists, path) else None

    async def cached_version(self, mount_id: int, key: str) -> bool:
        """Whether the page store recorded a cached version of the key whose block 0 is still
        there (which version, the store's metadata says): one small file-system look.

        Made on the event loop, not a worker thread: a readlink that finds nothing (every cold
        miss asks) costs ~3-5 µs here, a thread hop ~80 µs of CPU. A record that names a
        block gone is removed on a thread."""
        name = key_name(mount_id, key)
        found = blockfile.find_key(self.root, mount_id, name, remove_stale=False)
        if found is blockfile.STALE:
            await self._hop(blockfile.find_key, self.root, mount_id, name)
            return False
        return found is not None

    async def read(
        self,
        bkey: BlockKey,
        length: int,
        start: int,
        end: int,
        fetch: Fetch,
        *,
        pinned: bool = False,
        retired_ok: bool = False,
        cold: bool = False,
        sparse: bool = False,
    ) -> AsyncGenerator[bytes, None]:
        """Bytes [start, end) of the block (`length` bytes in all), from the cache or, on a
        miss, from `fetch` (the block from the store), caching it on the way.

        `sparse`: the reader is not sequential, so a miss of a range covering at most half the
        block fills only the sub-blocks that hold it (subblocks.applies), unless the block is
        being filled already, here or in another process.

        `retired_ok`: the caller has begun sending this version, so a retired block of it (the
        version was invalidated since) is good, and better than the store's new version.
        `cold`: the block is very likely not on disk (its version was just learnt from the
        store): no read of the disk first; the fill's claim finds a block that is there, and
        reads it (one thread hop a miss fewer)."""
        data = self.peek(bkey, pinned)
        if data is not None:
            yield data if (start, end) == (0, length) else data[start:end]
            return
        if retired_ok and bkey.version in self._retired:
            data = await self._read_retired(bkey, length, start, end)
            if data is not None:
                yield data
                return
        fill = self._fills.get(bkey.name)
        if fill is None:
            if sparse and not cold and self.sparse(length, start, end):
                # The block's file and the sub-blocks' files looked for in one hop.
                async with aclosing(
                    self._read_subs(bkey, length, start, end, fetch, pinned)
                ) as subs:
                    async for chunk in subs:
                        yield chunk
                return
            if not cold:
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
        sent = False
        try:
            async for chunk in fill.read(start, end):
                sent = True
                yield chunk
        except Exception:
            # The store no longer has the version (another process invalidated it): its
            # retired block, if still there.
            if sent or not retired_ok:
                raise
            data = await self._read_retired(bkey, length, start, end)
            if data is None:
                raise
            yield data

    async def _read_retired(
        self, bkey: BlockKey, length: int, start: int, end: int
    ) -> bytes | None:
        path = retired_path(self.root, bkey.name)
        try:
            data = await self._hop(blockfile.read, path, length, start, end - start, True)
        except blockfile.Corrupt as exc:
            log.warning("cache: dropped damaged retired block %s: %s", bkey.name, exc)
            self.stats.corrupt += 1
            await self._hop(blockfile.remove, path)
            return None
        except OSError:
            return None
        self.stats.hits += 1
        self.stats.hit_bytes += len(data)
        return data

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
        if self._retired and bkey.version in self._retired:
            return False  # gone from the store: its readers take it from retired/
        self._prefetching += 1
        self.stats.prefetches += 1
        fill = self._start_fill(bkey, length, fetch, pinned, prefetch=True)
        assert fill.task is not None
        fill.task.add_done_callback(self._prefetch_done)
        return True

    def _prefetch_done(self, _: asyncio.Task[None]) -> None:
        self._prefetching -= 1

    async def started(self, bkey: BlockKey) -> BaseException | None:
        """If the block is being filled in this process: wait for its first bytes, and return
        the error of a fill that ended without any (the store's answer: gone, changed...)."""
        fill = self._fills.get(bkey.name)
        return None if fill is None else await fill.started()

    async def _read_disk(
        self, bkey: Entry, length: int, start: int, end: int, pinned: bool = False
    ) -> bytes | None:
        name = bkey.name
        small = isinstance(bkey, BlockKey) and self.memory.accepts(length)
        first, size = (0, length) if small else (start, end - start)
        path = block_path(self.root, bkey.mount_id, name)
        verify = self._verifies(name, small)
        try:
            data = await self._hop(blockfile.read, path, length, first, size, verify)
        except FileNotFoundError:
            return None
        except blockfile.Corrupt as exc:
            await self._drop_damaged(bkey, path, exc)
            return None
        except OSError as exc:
            # Unreadable now (EIO, out of descriptors): not served, fetched; kept for later.
            self._disk_trouble(f"could not read block {name}", exc)
            return None
        self._disk_hit(bkey, pinned)
        if verify and size == length:
            self._checked_now(name)
        if small:
            self.memory.put(name, data)
            data = data if (start, end) == (0, length) else data[start:end]
        self.stats.hit_bytes += len(data)
        return data

    async def _drop_damaged(self, bkey: Entry, path: str, exc: Exception) -> None:
        """A block file failed its checksums: no longer counted as checked, removed, and the
        janitor told; the caller fetches it again."""
        log.warning("cache: dropped damaged block %s: %s", bkey.name, exc)
        self.stats.corrupt += 1
        self._unverify(bkey.name)
        await self._hop(blockfile.remove, path)
        if self._journal is not None:
            self._journal.drop(bkey.digest, bkey.mount_id)

    def _verifies(self, name: str, small: bool) -> bool:
        """Whether a read of a block from disk checks its checksum: always for a block going
        into the memory tier or not read by this process before, else per verify_sample."""
        return (
            small
            or self._verify_sample >= 1.0
            or name not in self._verified
            or random.random() < self._verify_sample
        )

    def _disk_hit(self, bkey: Entry, pinned: bool) -> None:
        """A block served from its file: known as checked here, its use told to the janitor."""
        if len(self._verified) >= _VERIFIED_MAX:
            self._verified.clear()
            self._checked.clear()
        self._verified[bkey.name] = None
        if self._journal is not None:
            self._journal.access(bkey.digest, bkey.mount_id, pinned)
        self.stats.hits += 1

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
            try:
                await self._bring(fill, bkey, fetch, pinned)
            except Exception:
                # The store failed before the first byte: if the block was committed meanwhile
                # (a write-through, another process), it is as good.
                if fill.received or not await self._from_disk(fill, bkey, pinned):
                    raise
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
            ended, self._fill_ended = self._fill_ended, None
            if ended is not None and not ended.done():
                ended.set_result(None)

    async def _bring(self, fill: _Fill, bkey: BlockKey, fetch: Fetch, pinned: bool) -> None:
        """The block's bytes into `fill`: from its file if it is committed, following another
        process's fill, or fetched and kept; fetched and not kept when the disk fails."""
        for _ in range(_SETTLE_TRIES):
            try:
                how, fd = await self._hop(blockfile.claim, self.root, bkey.mount_id, bkey.name)
            except OSError as exc:
                self._disk_trouble(f"could not claim block {bkey.name}", exc)
                break
            if how == blockfile.PRESENT:
                # Committed by another process: read for whoever joined this fill (a prefetch
                # too: a reader may have joined it). Gone again (dropped as damaged, evicted,
                # invalidated): claim it anew.
                if await self._from_disk(fill, bkey, pinned):
                    return
                continue
            assert fd is not None
            if how == blockfile.FOLLOW:
                fill.deciding = False
                await self._follow(fill, fd, fetch)
                return
            present = await self._subs_present(bkey, fill.length, fd)
            fill.subs, fill.deciding = present, False
            if present is None:
                await self._lead(fill, bkey, fd, fetch, pinned)
                return
            assembled = self._assembled(bkey, fill.length, fetch, present, pinned)
            if await self._lead(fill, bkey, fd, assembled, pinned):
                self.spawn(self._drop_subs(bkey, fill.length, present))
            return
        fill.deciding = False
        self.stats.unkept += 1
        await self._stream(fill, fetch)

    async def _from_disk(self, fill: _Fill, bkey: Entry, pinned: bool) -> bool:
        fill.deciding = False
        data = await self._read_disk(bkey, fill.length, 0, fill.length, pinned)
        if data is None:
            return False
        fill.append(data)
        fill.finish()
        return True

    async def _lead(self, fill: _Fill, bkey: Entry, fd: int, fetch: Fetch, pinned: bool) -> bool:
        """Fetch the entry from `fetch(0)` into `fill` and its claimed file `fd`, and commit it;
        whether it was kept."""
        block = isinstance(bkey, BlockKey)
        owned: int | None = fd  # ours to write, until committed or given up
        kept = False
        try:
            sums = Checksums()
            batch: list[bytes] = []
            batched = 0
            async with aclosing(fetch(0)) as source:
                async for chunk in source:
                    if fill.received + len(chunk) > fill.length:
                        raise FillFailed(f"the store sent more than {fill.length} bytes")
                    fill.append(chunk)
                    if owned is None:
                        continue
                    sums.update(chunk)
                    batch.append(chunk)
                    batched += len(chunk)
                    if batched >= WRITE_BATCH:
                        data, batch, batched = b"".join(batch), [], 0
                        try:
                            await self._hop(blockfile.write_all, owned, data)
                        except OSError as exc:
                            # The readers go on from the store; the block is not kept.
                            self._disk_trouble(f"could not write block {bkey.name}", exc)
                            await self._give_up(bkey, owned)
                            owned = None
            if fill.received != fill.length:
                raise FillFailed(f"the store sent {fill.received} of {fill.length} bytes")
            if block and self.memory.accepts(fill.length):
                # At once: the next read of a small block is a hit, not a join of this fill
                # while its file is written.
                self.memory.put(bkey.name, b"".join(fill.chunks))
            if owned is not None:
                committing, owned = owned, None  # commit closes it whatever happens
                record = (
                    key_name(bkey.mount_id, bkey.key)
                    if isinstance(bkey, BlockKey) and bkey.index == 0
                    else None
                )
                try:
                    kept = await self._hop(
                        blockfile.commit,
                        committing,
                        self.root,
                        bkey.mount_id,
                        bkey.name,
                        b"".join(batch),
                        sums.tail(FLAG_PINNED if pinned else 0),
                        self._fsync,
                        self.min_free,
                        record,
                    )
                except OSError as exc:
                    self._disk_trouble(f"could not commit block {bkey.name}", exc)
                else:
                    if not kept:
                        log.warning("cache: block not kept, free disk space is below the floor")
        finally:
            if owned is not None:
                await self._give_up(bkey, owned)
        fill.finish()
        if not kept:
            self.stats.unkept += 1
            return False
        self.stats.fills += 1
        self._verified[bkey.name] = None
        self._checked_now(bkey.name)  # its bytes are the ones this process wrote
        if self._journal is not None:
            self._journal.fill(bkey.digest, file_size(fill.length), bkey.mount_id, pinned)
        return True

    async def _give_up(self, bkey: Entry, fd: int) -> None:
        await asyncio.shield(self._hop(blockfile.discard, fd, self.root, bkey.name))

    async def _stream(self, fill: _Fill, fetch: Fetch) -> None:
        """The rest of the block from the store, into `fill` only: nothing is kept."""
        async with aclosing(fetch(fill.received)) as source:
            async for chunk in source:
                if fill.received + len(chunk) > fill.length:
                    raise FillFailed(f"the store sent more than {fill.length} bytes")
                fill.append(chunk)
        if fill.received != fill.length:
            raise FillFailed(f"the store sent {fill.received} of {fill.length} bytes")
        fill.finish()

    async def _follow(self, fill: _Fill, fd: int, fetch: Fetch) -> None:
        """Tail another process's fill of this block until it has all the bytes; if that fill
        ends without them (its filler died, its disk failed), fetch the rest itself."""
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
                        break
                    fill.append(data)
                    continue
                if loop.time() - idle_since > FOLLOW_STALL:
                    break
                await asyncio.sleep(FOLLOW_POLL)
        finally:
            await asyncio.shield(self._hop(blockfile.close, fd))
        if fill.received < fill.length:
            log.info("cache: the fill of block %s in another process ended short", fill.name)
            await self._stream(fill, fetch)
        else:
            fill.finish()

    # -- sub-blocks -----------------------------------------------------------------------------

    def _subs(self, bkey: BlockKey, indices: range | list[int]) -> list[SubKey]:
        return [_sub_key(bkey.mount_id, bkey.digest, i) for i in indices]

    async def _read_subs(
        self, bkey: BlockKey, length: int, start: int, end: int, fetch: Fetch, pinned: bool
    ) -> AsyncGenerator[bytes, None]:
        """Bytes [start, end) of the block: from its file if it is there, else from the
        sub-blocks that hold them (both looked for in one hop): those on disk read, those in
        flight here joined, the others filled (one store request per run of them, one fill for
        concurrent readers)."""
        size = self.sub_size
        subs = self._subs(bkey, subblocks.covering(start, end, size))
        cut = []  # (sub-block, [a, b) of it that the range wants)
        for sub in subs:
            lo, hi = subblocks.bounds(length, size, sub.index)
            cut.append((sub, hi - lo, max(start, lo) - lo, min(end, hi) - lo))
        todo = [c for c in cut if c[0].name not in self._fills]
        whole = block_path(self.root, bkey.mount_id, bkey.name)
        reads = [(whole, length, start, end - start, self._verifies(bkey.name, False))]
        reads += [
            (block_path(self.root, s.mount_id, s.name), n, a, b - a, self._verifies(s.name, False))
            for s, n, a, b in todo
        ]
        try:
            found = await self._hop(blockfile.read_each, reads, True)
        except OSError as exc:
            self._disk_trouble(f"could not read block {bkey.name}", exc)
            found = [blockfile.MISSING] * len(reads)
        got_block = found.pop(0)
        if isinstance(got_block, bytes):
            self._disk_hit(bkey, pinned)
            self.stats.hit_bytes += len(got_block)
            yield got_block
            return
        if got_block == blockfile.CORRUPT:
            self.stats.corrupt += 1
            self._verified.pop(bkey.name, None)
            if self._journal is not None:
                self._journal.drop(bkey.digest, bkey.mount_id)
        data: dict[int, bytes] = {}
        for (sub, _, _, _), got in zip(todo, found, strict=True):
            if isinstance(got, bytes):
                data[sub.index] = got
                self._disk_hit(sub, pinned)
                self.stats.hit_bytes += len(got)
            elif got == blockfile.CORRUPT:
                self.stats.corrupt += 1
                self._verified.pop(sub.name, None)
                if self._journal is not None:
                    self._journal.drop(sub.digest, sub.mount_id)
        fills: dict[int, _Fill] = {}
        new = []
        for sub in subs:
            if sub.index in data:
                continue
            fill = self._fills.get(sub.name)
            if fill is None:
                new.append(sub)
            else:
                fills[sub.index] = fill
                self.stats.joins += 1
        if new:
            fills.update(self._start_subs(bkey, length, new, fetch, pinned))
        if fills:
            self.stats.misses += 1
        for sub, _, a, b in cut:
            held = data.get(sub.index)
            if held is not None:
                yield held
                continue
            async for chunk in fills[sub.index].read(a, b):
                yield chunk

    def _start_subs(
        self,
        bkey: BlockKey,
        length: int,
        subs: list[SubKey],
        fetch: Fetch,
        pinned: bool,
        in_block: bool = False,
    ) -> dict[int, _Fill]:
        """One task filling these sub-blocks (in order); `in_block`: for the block's own fill,
        which must not wait for itself."""
        fills = {}
        for sub in subs:
            lo, hi = subblocks.bounds(length, self.sub_size, sub.index)
            fill = fills[sub.index] = self._fills[sub.name] = _Fill(sub.name, hi - lo)
        task = asyncio.create_task(
            self._fill_subs(bkey, length, subs, fills, fetch, pinned, in_block)
        )
        for fill in fills.values():
            fill.task = task
        return fills

    async def _fill_subs(
        self,
        bkey: BlockKey,
        length: int,
        subs: list[SubKey],
        fills: dict[int, _Fill],
        fetch: Fetch,
        pinned: bool,
        in_block: bool,
    ) -> None:
        """Claim the sub-blocks on the node; follow those another process fills, read those
        committed meanwhile, fetch the rest with one store request per run and commit each. If
        the block itself is being filled (or is there), give the claims up and read it."""
        names = [sub.name for sub in subs]
        claims: list[tuple[str, int | None]] = []
        size = self.sub_size
        from_block: asyncio.Task[None] | None = None

        def part(index: int) -> Fetch:
            lo, hi = subblocks.bounds(length, size, index)

            def rest(skip: int, stop: int | None = None) -> AsyncGenerator[bytes, None]:
                return fetch(lo + skip, hi if stop is None else lo + stop)

            return rest

        try:
            try:
                claims, busy = await self._hop(
                    blockfile.claim_all, self.root, bkey.mount_id, names,
                    None if in_block else bkey.name,
                )  # fmt: skip
            except OSError as exc:
                self._disk_trouble(f"could not claim sub-blocks of {bkey.name}", exc)
                for sub in subs:
                    self.stats.unkept += 1
                    await self._stream(fills[sub.index], part(sub.index))
                return
            if busy:
                # The block is being filled (or is there). A fill of it in this process that
                # takes (or may still take) one of these sub-blocks waits for its fill here:
                # those are led here as claimed. The others are given up and read from the
                # block, their fills out of reach of a block fill that starts later (which
                # would wait for them while they wait for it).
                block = self._fills.get(bkey.name)
                off = []
                for i, sub in enumerate(subs):
                    if block is None or not (
                        block.deciding or (block.subs is not None and block.subs[sub.index])
                    ):
                        off.append(i)
                if off:
                    await self._hop(
                        blockfile.release_all, self.root, [names[i] for i in off],
                        [claims[i] for i in off],
                    )  # fmt: skip
                    for i in off:
                        claims[i] = (_FROM_BLOCK, None)
                        if self._fills.get(names[i]) is fills[subs[i].index]:
                            del self._fills[names[i]]
                    # Apart from the claimed ones' fills, which a block fill may wait for.
                    from_block = asyncio.create_task(
                        self._from_block(bkey, length, [subs[i] for i in off], fills, fetch, pinned)
                    )
            i = 0
            while i < len(subs):
                sub, (how, fd) = subs[i], claims[i]
                fill = fills[sub.index]
                if how == blockfile.CLAIMED:
                    j = i + 1
                    while (
                        j < len(subs)
                        and claims[j][0] == blockfile.CLAIMED
                        and subs[j].index == subs[j - 1].index + 1
                    ):
                        j += 1
                    await self._lead_run(subs[i:j], claims, i, fills, fetch, length, pinned)
                    i = j
                    continue
                claims[i] = (how, None)  # handed on
                if how == _FROM_BLOCK:
                    pass  # by the task reading the block
                elif how == blockfile.FOLLOW:
                    assert fd is not None
                    await self._follow(fill, fd, part(sub.index))
                elif not await self._from_disk(fill, sub, pinned):
                    self.stats.unkept += 1  # committed, then gone at once: from the store
                    await self._stream(fill, part(sub.index))
                i += 1
            if from_block is not None:
                await from_block
        except BaseException as exc:
            if from_block is not None and not from_block.done():
                from_block.cancel()
            for fill in fills.values():
                if not fill.done:
                    self.stats.fill_failures += 1
                    fill.finish(exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            if any(fd is not None for _, fd in claims):
                await asyncio.shield(self._hop(blockfile.release_all, self.root, names, claims))
            for sub in subs:
                if self._fills.get(sub.name) is fills[sub.index]:
                    del self._fills[sub.name]
            ended, self._fill_ended = self._fill_ended, None
            if ended is not None and not ended.done():
                ended.set_result(None)

    async def _from_block(
        self,
        bkey: BlockKey,
        length: int,
        subs: list[SubKey],
        fills: dict[int, _Fill],
        fetch: Fetch,
        pinned: bool,
    ) -> None:
        """Sub-blocks whose claims were given up for the block being filled: their bytes from
        it (joined, followed or read)."""
        try:
            for sub in subs:
                lo, hi = subblocks.bounds(length, self.sub_size, sub.index)
                fill = fills[sub.index]
                got = self.read(bkey, length, lo, hi, fetch, pinned=pinned)
                async with aclosing(got):
                    async for chunk in got:
                        fill.append(chunk)
                fill.finish()
        except BaseException as exc:
            for sub in subs:
                if not fills[sub.index].done:
                    fills[sub.index].finish(exc)
            raise

    async def _lead_run(
        self,
        run: list[SubKey],
        claims: list[tuple[str, int | None]],
        at: int,
        fills: dict[int, _Fill],
        fetch: Fetch,
        length: int,
        pinned: bool,
    ) -> None:
        """Consecutive sub-blocks claimed by this process (claims[at:at + len(run)]): one store
        request for all of them, cut at their bounds, each committed as its bytes end while
        the next one's arrive."""
        lo = subblocks.bounds(length, self.sub_size, run[0].index)[0]
        hi = subblocks.bounds(length, self.sub_size, run[-1].index)[1]
        source = fetch(lo, hi)
        split = _Split(source)

        async def lead(sub: SubKey, fd: int, part: Fetch) -> None:
            try:
                await self._lead(fills[sub.index], sub, fd, part, pinned)
            except BaseException:
                split.break_()
                raise

        leads = []
        for k, sub in enumerate(run):
            fd = claims[at + k][1]
            claims[at + k] = (blockfile.CLAIMED, None)  # the lead owns it now
            assert fd is not None
            leads.append(lead(sub, fd, split.fetch(fills[sub.index].length)))
        try:
            done = await asyncio.gather(*leads, return_exceptions=True)
        finally:
            await source.aclose()
        for result in done:
            if isinstance(result, BaseException):
                raise result

    async def _subs_present(self, bkey: BlockKey, length: int, fd: int) -> list[bool] | None:
        """Which sub-blocks of the block (claimed by this process: `fd`) are committed or being
        filled, here or in another process; None when none is (the common case)."""
        if not subblocks.applies(length, 0, 1, self.sub_size):
            return None
        subs = self._subs(bkey, range(subblocks.count(length, self.sub_size)))
        try:
            present = await self._hop(
                blockfile.present_all, self.root, bkey.mount_id, [s.name for s in subs]
            )
        except OSError:
            return None  # the disk's trouble shows at the block's own write
        except BaseException:
            await self._give_up(bkey, fd)
            raise
        present = [p or s.name in self._fills for p, s in zip(present, subs, strict=True)]
        return present if any(present) else None

    def _assembled(
        self, bkey: BlockKey, length: int, fetch: Fetch, present: list[bool], pinned: bool
    ) -> Fetch:
        """The block's bytes from its sub-blocks where they are (on disk, or joined, or followed
        while they are filled) and from the store for the runs between them."""
        size = self.sub_size

        async def whole() -> AsyncGenerator[bytes, None]:
            i, n = 0, len(present)
            while i < n:
                lo, hi = subblocks.bounds(length, size, i)
                if present[i]:
                    sub = _sub_key(bkey.mount_id, bkey.digest, i)
                    async with aclosing(
                        self._sub_bytes(bkey, length, sub, hi - lo, fetch, pinned)
                    ) as got:
                        async for chunk in got:
                            yield chunk
                    i += 1
                    continue
                j = i
                while j < n and not present[j]:
                    j += 1
                stop = subblocks.bounds(length, size, j - 1)[1]
                async with aclosing(fetch(lo, stop)) as got:
                    async for chunk in got:
                        yield chunk
                i = j

        def assembled(skip: int, stop: int | None = None) -> AsyncGenerator[bytes, None]:
            if skip == 0 and stop in (None, length):
                return whole()
            return fetch(skip, stop)

        return assembled

    async def _sub_bytes(
        self, bkey: BlockKey, length: int, sub: SubKey, n: int, fetch: Fetch, pinned: bool
    ) -> AsyncGenerator[bytes, None]:
        """All of a sub-block, for its block's fill: joined, read, or claimed and filled."""
        fill = self._fills.get(sub.name)
        if fill is None:
            data = await self._read_disk(sub, n, 0, n, pinned)
            if data is not None:
                yield data
                return
            fill = self._fills.get(sub.name)
            if fill is None:
                fill = self._start_subs(bkey, length, [sub], fetch, pinned, in_block=True)[
                    sub.index
                ]
        async for chunk in fill.read(0, n):
            yield chunk

    async def _drop_subs(self, bkey: BlockKey, length: int, present: list[bool]) -> None:
        """The block is committed: its sub-blocks hold nothing it does not, so they go now
        rather than take room until the janitor evicts them."""
        subs = [s for s in self._subs(bkey, range(len(present))) if present[s.index]]
        for sub in subs:
            self._verified.pop(sub.name, None)
        await self._hop(
            blockfile.remove_all, [block_path(self.root, s.mount_id, s.name) for s in subs]
        )
        if self._journal is not None:
            for sub in subs:
                self._journal.drop(sub.digest, sub.mount_id)

    def _disk_trouble(self, what: str, exc: OSError) -> None:
        now = time.monotonic()
        if now - self._warned >= _WARN_EVERY:
            self._warned = now
            log.warning("cache: %s: %s (reads go on from the store)", what, exc)

    # -- versions being read ----------------------------------------------------------------------

    def hold(self, version: Version) -> None:
        """A reader has begun on this version: if the version is invalidated meanwhile (in
        this process), its retired blocks stay until the reader is done."""
        self._held[version] = self._held.get(version, 0) + 1

    def release(self, version: Version) -> None:
        left = self._held[version] - 1
        if left:
            self._held[version] = left
            return
        del self._held[version]
        retired = self._retired.get(version)
        if retired is not None and retired[1] <= asyncio.get_running_loop().time():
            self._remove_retired(version)

    # -- writes and invalidation ----------------------------------------------------------------

    def begin_write(self, mount_id: int, block_size: int, size: int, pinned: bool) -> BlockWriter:
        """Blocks of a body on its way to the store; commit() names them once the store has
        answered with the version."""
        return BlockWriter(self, mount_id, block_size, size, pinned)

    def invalidate(self, mount_id: int, key: str, etag: str, size: int, block_size: int) -> None:
        """Forget every block of this version: from memory at once; its files are moved to
        retired/ (no new read of any process finds them), where the reads of it under way in
        this node still do for `drop_delay` seconds, and as long as one in this process goes
        on; then they are removed."""
        version = (mount_id, key, etag, block_size)
        names = _names(version, size)
        for name in names:
            self.memory.discard(name)
            self._unverify(name)
        self.spawn(self._retire(version, size, names))

    async def _retire(self, version: Version, size: int, names: list[str]) -> None:
        mount_id, key = version[0], version[1]
        await self._hop(blockfile.retire_all, self.root, mount_id, names, key_name(mount_id, key))
        # After the move: the janitor forgets a block only once it is gone from blocks/.
        if self._journal is not None:
            for name in names:
                self._journal.drop(bytes.fromhex(name), mount_id)
        loop = asyncio.get_running_loop()
        timer = self._timers.pop(version, None)
        if timer is not None:
            timer.cancel()  # retired before, and written anew since (the same bytes again)
        self._retired[version] = (size, loop.time() + self._drop_delay)
        self._timers[version] = loop.call_later(self._drop_delay, self._due, version)

    def _due(self, version: Version) -> None:
        del self._timers[version]
        if version not in self._held:  # else its last reader removes it
            self._remove_retired(version)

    def _remove_retired(self, version: Version) -> None:
        size, _ = self._retired.pop(version)
        timer = self._timers.pop(version, None)
        if timer is not None:
            timer.cancel()
        paths = [retired_path(self.root, name) for name in _names(version, size)]
        self.spawn(self._hop(blockfile.remove_all, paths))

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
            if journal is None:
                await self._open_journal()
                continue
            try:
                await self._hop(journal.flush)
            except OSError as exc:
                self._disk_trouble("could not write the journal", exc)


@functools.lru_cache(maxsize=1 << 16)
def _sub_key(mount_id: int, block: bytes, index: int) -> SubKey:
    """A sub-block's key, hashed once while it is hot (as reads.block_key does for blocks)."""
    return SubKey(mount_id, block, index)


class _Split:
    """One stream of bytes handed out in consecutive parts of given lengths, each part read by
    its own consumer when the one before it has had its bytes (so that one part is committed
    while the next one arrives). A part left unread, or read short, breaks the split: the
    parts after it end at once, short (their fills fail), never misaligned."""

    __slots__ = ("_broken", "_moved", "_parts", "_rest", "_source", "_turn")

    def __init__(self, source: AsyncGenerator[bytes, None]) -> None:
        self._source = source
        self._rest = b""
        self._parts = 0
        self._turn = 0
        self._broken = False
        self._moved = asyncio.Event()

    def fetch(self, n: int) -> Fetch:
        """The next part, of `n` bytes."""
        k = self._parts
        self._parts += 1

        def take(skip: int, stop: int | None = None) -> AsyncGenerator[bytes, None]:
            return self._take(k, n)

        return take

    def break_(self) -> None:
        self._broken = True
        self._wake()

    def _wake(self) -> None:
        moved, self._moved = self._moved, asyncio.Event()
        moved.set()

    async def _take(self, k: int, n: int) -> AsyncGenerator[bytes, None]:
        while self._turn != k and not self._broken:
            await self._moved.wait()
        try:
            while n > 0 and not self._broken:
                if not self._rest:
                    try:
                        self._rest = await self._source.__anext__()
                    except StopAsyncIteration:
                        break  # short: the fill says so
                    continue
                chunk, self._rest = self._rest[:n], self._rest[n:]
                n -= len(chunk)
                yield chunk
        finally:
            if n > 0:
                self._broken = True
            self._turn = k + 1
            self._wake()


def _names(version: Version, size: int) -> list[str]:
    mount_id, key, etag, block_size = version
    count = max(1, -(-size // block_size))
    return [BlockKey(mount_id, key, etag, block_size, i).name for i in range(count)]


class BlockWriter:
    """A PUT's bytes cut into blocks as they pass; each whole block is written under a private
    name (held by this writer's lock, so a sweep never takes it for a dead writer's), and
    commit() renames them all once the version is known. Never fails the PUT: the caller logs
    and drops on error."""

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
        self._lock: tuple[int, str] | None = None  # (fd, path) of .w.<token>, once spooling
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
        pages = self._pages
        if self._lock is None:
            self._lock = await pages._hop(blockfile.spool_lock, pages.root)
        index = len(self._spooled)
        flags = FLAG_PINNED if self._pinned else 0
        path = await pages._hop(blockfile.spool, self._lock[1], index, block, flags)
        self._spooled.append((path, index, len(block)))
        if len(block) <= pages.memory.object_max:
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
        await pages._hop(blockfile.install_all, [(p, d) for p, d, _, _ in named])
        self._spooled = []
        await self._unlock()
        record = key_name(self._mount_id, key)
        await pages._hop(blockfile.set_key, pages.root, self._mount_id, record, named[0][2].name)
        journal = pages._journal
        for _, _, bkey, length in named:
            pages.stats.written += 1
            pages._verified[bkey.name] = None
            pages._checked_now(bkey.name)
            if journal is not None:
                journal.fill(bkey.digest, file_size(length), self._mount_id, self._pinned)
        if len(named) == 1 and self._blocks:
            pages.memory.put(named[0][2].name, self._blocks[0])

    async def abort(self) -> None:
        spooled, self._spooled = self._spooled, []
        self._buf = bytearray()
        if spooled:
            await self._pages._hop(blockfile.remove_all, [p for p, _, _ in spooled])
        await self._unlock()

    async def _unlock(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            await self._pages._hop(blockfile.unlock_spool, *lock)
