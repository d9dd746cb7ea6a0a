"""The object cache: whole objects on local disk under a byte budget with LRU eviction, a memory
tier for small hot objects, single-flight fills, and an index rebuilt from the files on open."""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from gateway.cache import _files
from gateway.cache.fill import Fill, FillContext
from gateway.cache.keys import CacheEntry, CacheKey, CacheMiss, CacheStats, FillAborted
from gateway.cache.memory import MemoryTier

T = TypeVar("T")


class _Slot:
    """One committed object in the index. Its CacheEntry is made on the first hit and kept:
    building a Path costs microseconds, and only the hot set needs one."""

    __slots__ = ("entry", "size", "touched")

    def __init__(self, size: int, touched: float) -> None:
        self.size = size
        self.touched = touched  # wall-clock time the file's mtime was last set to
        self.entry: CacheEntry | None = None


_Index = OrderedDict[str, _Slot]  # oldest first


class ObjectCache:
    """Whole objects up to `max_object_bytes`, kept under `root` within `capacity_bytes`.

    Lookups are in-memory; every disk touch runs on a worker thread. Renames and removals run
    on one janitor thread in the order they were asked, so an eviction's removal can never
    remove the file of a later fill of the same name.
    """

    def __init__(
        self,
        root: Path,
        *,
        capacity_bytes: int,
        max_object_bytes: int,
        min_free_bytes: int = 0,
        memory_bytes: int = 64 << 20,
        memory_object_max: int = 256 << 10,
        fsync: bool = True,
        io_threads: int = 8,
        touch_interval: float = 60.0,
    ) -> None:
        if min(capacity_bytes, max_object_bytes, min_free_bytes, memory_bytes) < 0:
            raise ValueError("cache sizes must not be negative")
        if io_threads < 1:
            raise ValueError("io_threads must be at least 1")
        self._root = os.path.abspath(os.fspath(root))
        self._capacity = capacity_bytes
        self._max_object = min(max_object_bytes, capacity_bytes)
        self._min_free = min_free_bytes
        self._fsync = fsync
        self._io_threads = io_threads
        self._touch_interval = touch_interval
        self._memory = MemoryTier(memory_bytes, memory_object_max)
        self._index: _Index = OrderedDict()
        self._bytes_used = 0
        self._fills: dict[str, Fill] = {}
        self._touches: list[str] = []
        self._hits = self._misses = self._evictions = self._memory_hits = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._io: ThreadPoolExecutor | None = None
        self._janitor: ThreadPoolExecutor | None = None
        self._ctx: FillContext | None = None

    # -- life cycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        """Rebuild the index from disk (on a thread) and drop leftover temporary files."""
        if self._loop is not None:
            raise RuntimeError("cache is already open")
        loop = asyncio.get_running_loop()
        io = ThreadPoolExecutor(self._io_threads, thread_name_prefix="cache-io")
        janitor = ThreadPoolExecutor(1, thread_name_prefix="cache-janitor")
        try:
            index, used, free = await loop.run_in_executor(
                janitor, _load_index, self._root, self._min_free > 0
            )
        except BaseException:
            io.shutdown(wait=False)
            janitor.shutdown(wait=False)
            raise
        self._loop, self._io, self._janitor = loop, io, janitor
        self._index, self._bytes_used = index, used
        self._ctx = FillContext(
            loop=loop,
            io=io,
            janitor=janitor,
            fsync=self._fsync,
            free_of=self._root if self._min_free > 0 else None,
            keep_max=self._memory.object_max,
            committed=self._committed,
            ended=self._ended,
        )
        self._evict(None, self._deficit(free))

    async def close(self) -> None:
        """Abort fills in flight (their waiters get None), finish pending file work, let go."""
        if self._loop is None:
            return
        fills = list(self._fills.values())
        for fill in fills:
            await fill.abort(FillAborted("cache closed"))
        # Fills already committing finish first: they need the threads shut down below.
        await asyncio.gather(*(fill.done for fill in fills))
        self._flush_touches()
        io, janitor = self._io, self._janitor
        self._loop = self._io = self._janitor = self._ctx = None
        self._index = OrderedDict()
        self._bytes_used = 0
        self._memory.clear()
        await asyncio.to_thread(_shutdown, io, janitor)

    # -- lookups and reads --------------------------------------------------------------------

    def admits(self, size: int) -> bool:
        """Would an object of this size be cached?"""
        return 0 <= size <= self._max_object

    def lookup(self, key: CacheKey) -> CacheEntry | None:
        """The committed entry of this object version, or None; a hit counts as a use."""
        entry = self._use(key.name)
        if entry is None:
            self._misses += 1
        else:
            self._hits += 1
        return entry

    async def read(self, entry: CacheEntry, start: int, end: int) -> bytes:
        """Bytes [start, end): from the memory tier, else one pread on a worker thread."""
        _check_range(entry, start, end)
        name = entry.key_name
        data = self._memory.get(name)
        if data is not None:
            self._memory_hits += 1
            return data if start == 0 and end == len(data) else data[start:end]
        slot = self._index.get(name)
        # A small object is read whole (one pread costs about the same) to enter the memory tier.
        whole = slot is not None and self._memory.accepts(entry.size)
        first, length = (0, entry.size) if whole else (start, end - start)
        try:
            data = await self._in_thread(_files.read_range, str(entry.path), first, length)
        except (FileNotFoundError, _files.Truncated) as exc:
            self._forget(name, slot)
            raise CacheMiss(f"cached file of {name} is gone or short") from exc
        if not whole:
            return data
        if self._index.get(name) is slot:
            self._memory.put(name, data)
        return data if start == 0 and end == len(data) else data[start:end]

    def stream(
        self, entry: CacheEntry, start: int, end: int, chunk_size: int = 1 << 20
    ) -> AsyncGenerator[bytes, None]:
        """Bytes [start, end) in chunks of `chunk_size`, one pread each, one fd for them all.
        Close the iterator (contextlib.aclosing) when stopping early."""
        _check_range(entry, start, end)
        if chunk_size <= 0:
            raise ValueError("chunk_size must be positive")
        return self._stream(entry, start, end, chunk_size)

    async def _stream(
        self, entry: CacheEntry, start: int, end: int, chunk_size: int
    ) -> AsyncGenerator[bytes, None]:
        name = entry.key_name
        data = self._memory.get(name)
        if data is not None:
            self._memory_hits += 1
            for pos in range(start, end, chunk_size):
                yield data[pos : min(end, pos + chunk_size)]
            return
        io, path, slot = self._pool(), str(entry.path), self._index.get(name)
        fd: int | None = None
        pending: Future[Any] | None = None  # the call in flight, if a cancellation cut it off
        opens = False
        pos = start
        try:
            while pos < end:
                n = min(chunk_size, end - pos)
                last = pos + n >= end
                if fd is None and last:
                    pending, opens = io.submit(_files.read_range, path, pos, n), False
                    chunk = await asyncio.wrap_future(pending)
                elif fd is None:
                    pending, opens = io.submit(_files.open_range, path, pos, n), True
                    fd, chunk = await asyncio.wrap_future(pending)
                else:
                    # With `last`, read_at closes the fd itself, so it is no longer ours.
                    owned, fd = fd, (None if last else fd)
                    pending, opens = io.submit(_files.read_at, owned, pos, n, last), False
                    chunk = await asyncio.wrap_future(pending)
                pending = None
                pos += n
                yield chunk
        except (FileNotFoundError, _files.Truncated) as exc:
            self._forget(name, slot)
            raise CacheMiss(f"cached file of {name} is gone or short") from exc
        finally:
            if fd is not None or pending is not None:
                io.submit(_files.close_after, fd, pending, opens)

    # -- fills --------------------------------------------------------------------------------

    def begin_fill(self, key: CacheKey, size: int) -> Fill | None:
        """The leader's Fill, or None when this version is cached or being filled: then wait().

        Raises ValueError for a size that admits() refuses.
        """
        if self._ctx is None:
            raise RuntimeError("cache is not open")
        if not self.admits(size):
            raise ValueError(f"an object of {size} bytes is not admitted")
        name = key.name
        if name in self._fills or name in self._index:
            return None
        tmp = f"{self._root}/{_files.TMP_DIR}/{secrets.token_hex(16)}"
        fill = Fill(key, size, tmp, _files.object_path(self._root, name), self._ctx)
        self._fills[name] = fill
        return fill

    def begin_write(self, size: int) -> Fill:
        """A fill for bytes whose version is not known yet (a PUT on its way to the store);
        `commit_write` names it once the store has answered with the ETag."""
        if self._ctx is None:
            raise RuntimeError("cache is not open")
        if not self.admits(size):
            raise ValueError(f"an object of {size} bytes is not admitted")
        tmp = f"{self._root}/{_files.TMP_DIR}/{secrets.token_hex(16)}"
        # Not registered as in flight: nobody can wait for a version that has no name yet.
        return Fill(_UNNAMED, size, tmp, tmp, self._ctx)

    async def commit_write(self, fill: Fill, key: CacheKey) -> CacheEntry:
        fill.name_as(key, _files.object_path(self._root, key.name))
        return await fill.commit()

    async def wait(self, key: CacheKey) -> CacheEntry | None:
        """The entry of the fill in flight once it ends, None if it failed; with no fill in
        flight, the cached entry if there is one."""
        fill = self._fills.get(key.name)
        if fill is None:
            return self._use(key.name)
        # Shielded: one waiter's cancellation must not cancel the result the others wait for.
        return await asyncio.shield(fill.done)

    def invalidate(self, key: CacheKey) -> None:
        """Forget this version now; its file is removed in the background."""
        if key.name in self._index:
            self._drop(key.name)

    @property
    def stats(self) -> CacheStats:
        return CacheStats(
            entries=len(self._index),
            bytes_used=self._bytes_used,
            hits=self._hits,
            misses=self._misses,
            evictions=self._evictions,
            memory_bytes_used=self._memory.bytes_used,
            memory_entries=len(self._memory),
            memory_hits=self._memory_hits,
        )

    # -- internals ----------------------------------------------------------------------------

    def _use(self, name: str) -> CacheEntry | None:
        slot = self._index.get(name)
        if slot is None:
            return None
        self._index.move_to_end(name)
        now = time.time()
        if now - slot.touched >= self._touch_interval:
            # The mtime carries the LRU order across a restart; bumping it at most once per
            # interval keeps hits free of file-system calls.
            slot.touched = now
            self._queue_touch(name)
        entry = slot.entry
        if entry is None:
            entry = slot.entry = CacheEntry(
                name, slot.size, Path(_files.object_path(self._root, name))
            )
        return entry

    def _committed(self, fill: Fill, data: bytes | None, free: int | None) -> CacheEntry:
        name = fill.key.name
        self._ended(fill)
        old = self._index.pop(name, None)
        if old is not None:
            self._bytes_used -= old.size
        slot = _Slot(fill.size, time.time())
        self._index[name] = slot
        self._bytes_used += fill.size
        if data is not None:
            self._memory.put(name, data)
        self._evict(name, self._deficit(free))
        entry = slot.entry = CacheEntry(name, fill.size, Path(_files.object_path(self._root, name)))
        return entry

    def _ended(self, fill: Fill) -> None:
        if self._fills.get(fill.key.name) is fill:
            del self._fills[fill.key.name]

    def _deficit(self, free: int | None) -> int:
        return 0 if free is None else max(0, self._min_free - free)

    def _evict(self, keep: str | None, deficit: int) -> None:
        """Drop the least recently used until within budget and `deficit` bytes are freed; never
        `keep`, the entry just committed, so that its waiters can read it."""
        while self._index and (self._bytes_used > self._capacity or deficit > 0):
            name = next(iter(self._index))
            if name == keep:
                break
            deficit -= self._drop(name)
            self._evictions += 1

    def _drop(self, name: str) -> int:
        slot = self._index.pop(name)
        self._bytes_used -= slot.size
        self._memory.discard(name)
        if self._janitor is not None:
            self._janitor.submit(_files.remove, _files.object_path(self._root, name))
        return slot.size

    def _forget(self, name: str, slot: _Slot | None) -> None:
        # Only the slot the failed read started from: a fill may have committed a new file of
        # the same name meanwhile, and that one is fine.
        if slot is not None and self._index.get(name) is slot:
            self._drop(name)

    def _queue_touch(self, name: str) -> None:
        self._touches.append(_files.object_path(self._root, name))
        if len(self._touches) == 1 and self._loop is not None:
            self._loop.call_soon(self._flush_touches)  # one thread hop for a burst of hits

    def _flush_touches(self) -> None:
        paths, self._touches = self._touches, []
        if paths and self._janitor is not None:
            self._janitor.submit(_files.touch, paths)

    def _pool(self) -> ThreadPoolExecutor:
        if self._io is None:
            raise RuntimeError("cache is not open")
        return self._io

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        # A dedicated pool, not asyncio.to_thread: the same cost per hop, but cache reads do not
        # queue behind (or starve) whatever else uses the loop's default executor.
        result: T = await asyncio.wrap_future(self._pool().submit(fn, *args))
        return result


_UNNAMED = CacheKey(0, "", "")


def _check_range(entry: CacheEntry, start: int, end: int) -> None:
    if not 0 <= start <= end <= entry.size:
        raise ValueError(f"range [{start}, {end}) is outside an object of {entry.size} bytes")


def _load_index(root: str, want_free: bool) -> tuple[_Index, int, int | None]:
    """Build the index on a worker thread; 100k files is too long a stall for the loop."""
    found, free = _files.open_root(root, want_free)
    index: _Index = OrderedDict()
    used = 0
    for mtime, name, size in found:
        index[name] = _Slot(size, mtime)
        used += size
    return index, used, free


def _shutdown(*pools: ThreadPoolExecutor | None) -> None:
    for pool in pools:
        if pool is not None:
            pool.shutdown(wait=True)
