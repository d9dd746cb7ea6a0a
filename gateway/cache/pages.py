"""The page store: objects cached as fixed-size blocks on local SSD, shared by the worker
processes of one node. Storage only: how blocks come in from the store (one fill per block on
the node, sub-blocks, read-ahead) is fills.py's, which calls the verbs here.

A block is named by (mount, key, version, block size, index), so a new version never meets an
old one's bytes. A block is in the memory tier (small ones) or in its file under blocks/, read
on a worker thread (one hop: open, pread, close) or, when all of it is in the page cache, on
the event loop; a claimed fill writes inflight/<name> and commits it into place.

Which blocks exist and how much room they take is the janitor's business (janitor.py): one
process of the node evicts, the others tell it what they filled and used through their
journals. A worker therefore keeps no index of its own: a block is present if its file opens.
What it keeps on disk besides the blocks is, per key, the name of the cached block 0
(keyrecords.py: a row of one SQLite file, written by the block's commit), so that a
restarted process knows what it holds without the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import os
import random
import sqlite3
import time
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gateway.bounded import Window
from gateway.cache import blockfile, checks, relayout, resident, verity
from gateway.cache.figures import PageStats
from gateway.cache.hotfiles import HOT_FILE_MIN, HotFiles, Kept
from gateway.cache.janitor import Janitor, JanitorStats, read_stats
from gateway.cache.journal import JournalWriter
from gateway.cache.keyrecords import KeyRecords
from gateway.cache.layout import (
    BLOCKS_DIR,
    FLAG_PINNED,
    INFLIGHT_DIR,
    JOURNAL_DIR,
    RETIRED_DIR,
    SPARE_DIR,
    Checksums,
    block_path,
    file_size,
    retired_path,
)
from gateway.cache.memory import MemoryTier
from gateway.cache.spare import Spares
from gateway.cache.subblocks import SubKey
from gateway.threadnames import name_this_thread

log = logging.getLogger(__name__)
T = TypeVar("T")

_NAME_DOMAIN = b"gateway.cache.block.v1\x00"
_KEY_DOMAIN = b"gateway.cache.key.v1\x00"
JOURNAL_FLUSH = 0.5
_VERIFIED_MAX = 1 << 20
# Seconds a block whose whole data the node checked may be sent from its file unread
# (zero-copy) before the next send checks it again (docs/cache.md, "Zero-copy sends").
ZERO_COPY_RECHECK = 60.0
# A block the memory tier takes is sent from its file at its first disk hit at the edge from
# this size on: below it the copy costs less than the calls of a send from a file
# (docs/performance.md, "Disk hits at the edge sent from their files").
SEND_FILE_MIN = 64 << 10
_WARN_EVERY = 60.0  # seconds between two warnings about the cache's disk


def _hashed(domain: bytes, parts: tuple[str, ...]) -> bytes:
    digest = hashlib.sha256(domain)
    for part in parts:
        # Length prefixes make the encoding unambiguous whatever bytes a key or ETag holds.
        raw = part.encode("utf-8", "surrogatepass")
        digest.update(len(raw).to_bytes(8, "big"))
        digest.update(raw)
    return digest.digest()


@functools.lru_cache(maxsize=4096)
def key_name(mount_id: int, key: str) -> str:
    """The name under which the cached version of a key is recorded (kept while it is hot: a
    miss asks it when it looks for the key's record, and again when it writes it)."""
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


class FileRegion:
    """Bytes of a block file to be sent as they are (sendfile), by whoever takes it: it owns
    the open descriptor, which `close()` closes (also when it is dropped unsent). `reading`:
    the file's read into the page cache (and its check) under way on a cache-io thread: its
    bytes may be sent once it is done, not before (a send would wait for the disk), and not
    at all if it failed; the descriptor is closed only once the read is done. `failed`: what
    its sender answers instead if the read fails, if its taker says (the edge: an error with
    the request's id), else None."""

    __slots__ = ("count", "failed", "fd", "offset", "reading")

    def __init__(
        self, fd: int, offset: int, count: int, reading: asyncio.Future[None] | None = None
    ) -> None:
        self.fd = fd
        self.offset = offset
        self.count = count
        self.reading = reading
        self.failed: Callable[[], bytes] | None = None

    def __len__(self) -> int:
        return self.count

    def read(self) -> bytes:
        """The bytes, read into memory (blocking: for a server that cannot send a file)."""
        return blockfile.pread_exact(self.fd, self.count, self.offset)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd < 0:
            return
        reading = self.reading
        if reading is not None and not reading.done():
            reading.add_done_callback(lambda _: os.close(fd))  # a thread reads it still
        else:
            os.close(fd)

    def __del__(self) -> None:
        self.close()


class FillFailed(Exception):
    """A block ended without all its bytes (the store failed, its filler died, a write was
    short)."""


Entry = BlockKey | SubKey  # what has a file of its own in blocks/: a block, or a sub-block
Filling = Callable[[str], bool]  # whether the entry of this name is being filled here now


def _nothing_filling(name: str) -> bool:
    return False  # a store no fills were set over (a writer's only, a test's)


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
        verify_sample: float = 1.0,
        zero_copy_recheck: float = ZERO_COPY_RECHECK,
        seal_blocks: bool = True,
        janitor: bool = True,
        janitor_interval: float = 0.5,
        sweep_interval: float = 60.0,
        drop_delay: float = 30.0,
        checked: checks.Checks | None = None,
    ) -> None:
        if min(capacity_bytes, min_free_bytes, memory_bytes) < 0:
            raise ValueError("cache sizes must not be negative")
        if not 0.0 <= verify_sample <= 1.0:
            raise ValueError("verify_sample is a share between 0 and 1")
        self.root = os.path.abspath(os.fspath(root))
        self.capacity = capacity_bytes
        self.min_free = min_free_bytes
        self._space = blockfile.FreeSpace(self.root)  # the commits' floor, asked now and then
        self._fsync = fsync
        self._io_threads = io_threads
        self._verify_sample = verify_sample
        self._recheck = zero_copy_recheck if resident.CACHESTAT else 0.0
        self._seal_blocks = seal_blocks
        self.seals = False  # whether blocks are sealed when committed (open() probes)
        self._drop_delay = drop_delay
        self.memory = MemoryTier(memory_bytes, memory_object_max)
        self.stats = PageStats()
        # Whether an entry is being written by a fill in this process (set_filling: the
        # fills over this store answer it): reads that must not wait, and zero-copy sends,
        # leave such an entry alone.
        self._is_filling: Filling = _nothing_filling
        self._verified: dict[str, None] = {}
        # When a block's whole data was last checked (or written) by a worker of this node:
        # zero-copy sends (checks.py).
        self._node_checked = checks.table() if checked is None else checked
        self._hot = HotFiles()  # hot blocks' files kept open (hot_region)
        # A block of the memory tier at least this large is sent from its file where it may be
        # (hot_region); smaller ones cost less copied than sent (hotfiles.py).
        self.hot_file_min = HOT_FILE_MIN
        # A block the memory tier takes, on disk, at least this large is sent from its file at
        # its first hit at the edge (peek_sendable), and read into the tier at its second
        # while still in `_seen` (the blocks so sent since, by their bytes, fit in the tier).
        self.send_file_min = SEND_FILE_MIN
        self._seen = Window(memory_bytes)
        self._held: dict[Version, int] = {}  # versions read now -> readers
        # Versions invalidated here, their blocks in retired/ -> (size, when they may go).
        self._retired: dict[Version, tuple[int, float]] = {}
        self._timers: dict[Version, asyncio.TimerHandle] = {}  # their drop_delay running
        self._io: ThreadPoolExecutor | None = None
        self._journal: JournalWriter | None = None
        self._keys: KeyRecords | None = None
        self.spares = Spares(self.root)  # empty files a fill takes (spare.py)
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
        self._tasks: set[asyncio.Task[Any]] = set()  # file work in flight (spawn)
        self._warned = 0.0

    # -- life cycle -----------------------------------------------------------------------------

    async def open(self) -> None:
        if self._io is not None:
            raise RuntimeError("page store is already open")
        for sub in (BLOCKS_DIR, INFLIGHT_DIR, JOURNAL_DIR, RETIRED_DIR, SPARE_DIR):
            os.makedirs(os.path.join(self.root, sub), exist_ok=True)
        await asyncio.to_thread(relayout.ensure, self.root)  # a folder an older version wrote
        self._io = ThreadPoolExecutor(
            self._io_threads, "cache-io", initializer=name_this_thread, initargs=("cache-io",)
        )
        await self._probe_seals()
        removed = await self.hop(blockfile.sweep_inflight, self.root)
        removed += await self.hop(blockfile.sweep_retired, self.root)
        if removed:
            log.info("cache: removed %d files of fills and writes a crash left behind", removed)
        await self._open_journal()
        await self._open_keys()
        if self._janitor is not None:
            self._janitor.start()
        self._flusher = asyncio.create_task(self._flush_journal())

    async def _probe_seals(self) -> None:
        """Whether this cache folder's file system seals block files (fs-verity): once per
        open, by sealing a probe file in inflight/ (docs/cache.md, "Sealed blocks")."""
        if not self._seal_blocks:
            return
        why = await self.hop(verity.probe, os.path.join(self.root, INFLIGHT_DIR))
        self.seals = not why
        if why:
            log.info("cache: sealed blocks off: %s", why)
        else:
            log.info("cache: sealed blocks on: block files are sealed (fs-verity) when committed")

    async def _open_journal(self) -> None:
        try:
            self._journal = await asyncio.to_thread(JournalWriter, self.root)
        except OSError as exc:
            # A full disk must not keep the node from serving: the janitor's rescan finds
            # what goes unjournaled; the journal is tried again at each flush.
            self.disk_trouble("could not open a journal", exc)

    async def close(self) -> None:
        """Close the store; the fills over it (fills.Fills.close) are closed first."""
        if self._io is None:
            return
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        for version in list(self._retired):
            self._remove_retired(version)  # no reader is left to wait for
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        journal, keys = self._journal, self._keys
        io, self._io = self._io, None  # no new step starts
        janitor = self._janitor
        self.memory.clear()
        self._hot.clear()

        def shut() -> None:
            # The steps under way end first: a commit still on a cache-io thread (a fill
            # that outlived Fills.close's wait) writes its key's record and journal entry
            # into what is flushed below, rather than finding them gone and losing them.
            io.shutdown(wait=True)
            if journal is not None:
                journal.close()
            if keys is not None:
                keys.close()
            if janitor is not None:
                janitor.stop()

        try:
            await asyncio.to_thread(shut)
        finally:
            self._journal = self._keys = None

    def set_filling(self, is_filling: Filling) -> None:
        """Who fills this store in this process (fills.Fills) answers, by an entry's name,
        whether it is writing that entry now: the one question the store asks of its fills.
        One filler per store."""
        if self._is_filling is not _nothing_filling:
            raise RuntimeError("the page store has its filler already")
        self._is_filling = is_filling

    async def settle(self) -> None:
        """Wait until no file task (a retirement, a removal) is in flight in this process;
        fills.Fills.settle() waits for the fills too."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))

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
            await self.hop(journal.flush)

    # -- reads ----------------------------------------------------------------------------------

    def peek(self, bkey: BlockKey, pinned: bool = False, preload: bool = False) -> bytes | None:
        """The block's bytes if they are in the memory tier: no I/O at all."""
        data = self.memory.get(bkey.name)
        if data is not None:
            self.stats.hit(bkey.mount_id, preload)
            self.stats.memory_hits += 1
            self.stats.hit_bytes += len(data)
            if self._journal is not None:
                # A block hot in memory must look hot to the janitor too.
                self._journal.access(bkey.digest, bkey.mount_id, pinned)
        return data

    def peek_disk(self, bkey: BlockKey, length: int, pinned: bool = False) -> memoryview | None:
        """The whole block from its file without waiting for the disk, so on the event loop:
        only if all of it is in memory now (read with RWF_NOWAIT), and checked as any read
        from disk is (a block this process has not read before always: one another worker
        filled or read, or one of before a restart). None for anything else (not there, being
        filled here, not all in the page cache): the full read path reads it on a thread."""
        name = bkey.name
        if self._is_filling(name) or self._io is None:
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
        tier, or (`disk`) on disk as far as this process can tell without I/O (not being
        filled here: whether its file is there and in the page cache, peek_disk finds out).
        Nothing is read or counted."""
        name = bkey.name
        if name in self.memory:
            return True
        return disk and not self._is_filling(name) and self._io is not None

    async def region(
        self, bkey: BlockKey, length: int, start: int, end: int, pinned: bool = False
    ) -> FileRegion | None:
        """Bytes [start, end) of the block as a region of its file, to be sent without being
        read into this process (zero-copy), or None: the block is in memory, being filled,
        gone, or not all in the page cache (a send must not wait for the disk on the event
        loop). A block whose whole data no worker of the node checked (or filled) within
        `zero_copy_recheck` seconds (checks.py; one kept from before a restart, too) is read
        and checked first, on a thread (docs/cache.md, "Zero-copy sends"); a damaged one is
        dropped, as a read drops it, and None tells the caller to read it the ordinary way
        (fetched again)."""
        name = bkey.name
        if (
            self._recheck <= 0
            or end <= start
            or self._is_filling(name)
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
            if self.seals and verity.is_sealed(fd):
                # The kernel checks each page it reads from the disk: what the page cache
                # holds of a sealed file was checked, and a damaged page is never in it.
                if not resident.sendable(fd, length, start, end - start):
                    os.close(fd)
                    return None
                self.stats.sealed += 1
            elif not self._checked_within(name, time.monotonic()):
                await self.hop(blockfile.check, fd, length)
                self._checked_now(name)
                self.stats.rechecks += 1
            elif not resident.sendable(fd, length, start, end - start):
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

    def peek_sendable(
        self, bkey: BlockKey, length: int, pinned: bool = False, read_in: bool = True
    ) -> FileRegion | memoryview | None:
        """peek_disk() for a server that sends files: the whole block as a region of its file,
        sent from the page cache under the zero-copy rules (region()'s: checked by the
        node within `zero_copy_recheck` seconds or sealed, else read and checked on the
        loop first, into a buffer dropped at once), so that no copy of it is made or kept
        while a client reads it. A block the memory tier takes comes as peek_disk() gives it
        (read, checked and put in the tier) when it is smaller than `send_file_min` or was
        found on disk here a little before (`_seen`: hot again, within the tier's size of
        other blocks so sent); the first disk hit of a larger one, and each of a pass over
        more bytes than the tier holds (an epoch, or a loop over a few large blocks), is
        sent from its file. A block not all in the page cache comes as a region of its file
        being read in on a cache-io thread (`reading`, _read_in()), whatever its size, or, not
        `read_in` (a small range of it is asked for: the full path reads only its pieces),
        None. Any block where zero-copy is off comes as peek_disk() gives it. None as
        peek_disk()."""
        name = bkey.name
        if self._recheck <= 0:
            return self.peek_disk(bkey, length, pinned)
        if self.memory.accepts(length):
            if length < self.send_file_min or name in self._seen:
                self._seen.pop(name)
                found = self.peek_disk(bkey, length, pinned)
                if found is not None or not read_in:
                    return found
                # Not all in the page cache (or gone, or damaged): from its file below, read
                # in first (a damaged one found by peek_disk is found there again).
            else:
                self._seen.put(name, length)
        if self._is_filling(name) or self._io is None:
            return None
        try:
            fd = os.open(block_path(self.root, bkey.mount_id, name), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            if (self.seals and verity.is_sealed(fd)) or self._checked_within(
                name, time.monotonic()
            ):
                verify = False
                whole = resident.sendable(fd, length, 0, length)
            else:
                verify = True
                whole = blockfile.read_resident_fd(fd, length, True) is not None
        except (blockfile.Corrupt, OSError):
            # As peek_disk(): the full path reads it again and drops it if it is damaged.
            os.close(fd)
            self._unverify(name)
            return None
        except BaseException:
            os.close(fd)
            raise
        reading = None
        if not whole:
            reading = self._read_in(bkey, fd, length) if read_in else None
            if reading is None:
                os.close(fd)
                return None
        elif verify:
            self._checked_now(name)
            self.stats.rechecks += 1
        self._disk_hit(bkey, pinned)
        self.stats.hit_bytes += length
        self.stats.zero_copy += 1
        return FileRegion(fd, 0, length, reading)

    def _read_in(self, bkey: BlockKey, fd: int, length: int) -> asyncio.Future[None] | None:
        """peek_sendable() of a block not all in the page cache: its whole file read (into
        the page cache) and checked on a cache-io thread, the send waiting for that, not the
        loop; the check counts as any (zero_copy_recheck). A damaged block is dropped as a
        read from disk drops it, and the send fails (its caller answers an error). None
        where no thread is to be had (the store closing)."""
        if self._io is None:
            return None
        try:
            reading = asyncio.get_running_loop().run_in_executor(
                self._io, blockfile.check, fd, length
            )
        except RuntimeError:  # the pool shut down
            return None
        name = bkey.name

        def done(reading: asyncio.Future[None]) -> None:
            exc = None if reading.cancelled() else reading.exception()
            if exc is None:
                self._checked_now(name)
                return
            self._unverify(name)
            if isinstance(exc, blockfile.Corrupt):
                path = block_path(self.root, bkey.mount_id, name)
                self.spawn(self._drop_damaged(bkey, path, exc))
            else:
                log.warning("cache: could not read block %s: %s", name, exc)

        reading.add_done_callback(done)
        self.stats.disk_sends += 1
        return reading

    def hot_region(self, bkey: BlockKey, length: int) -> FileRegion | None:
        """For a server that sends files: the whole block that peek() found in the memory tier
        (`length` bytes) as a region of its file, kept open (hotfiles.py), when it may go out
        from the page cache as zero-copy sends go (region()'s rules: checked by the node
        within `zero_copy_recheck` seconds or sealed, all in the page cache now); else None
        and the caller sends the memory tier's bytes. A check that falls due opens the file
        again by its name and reads it on the loop, only if all of it is in the page cache
        (~1 us per 10 KiB, once per block per interval); a damaged file is dropped as a read
        drops it, and the memory tier's bytes (checked when read in) are sent."""
        name = bkey.name
        if self._recheck <= 0 or self._is_filling(name):
            return None
        kept = self._hot.get(name)
        if kept is None or time.monotonic() > kept.until:
            kept = self._keep_hot(bkey, length)
            if kept is None:
                return None
        fd = kept.fd
        if not resident.in_page_cache(fd, 0, length):
            return None
        self.stats.zero_copy += 1
        if kept.sealed:
            self.stats.sealed += 1
        return FileRegion(os.dup(fd), 0, length)

    def _keep_hot(self, bkey: BlockKey, length: int) -> Kept | None:
        """hot_region(): the block's file opened by its name, checked unless it is sealed or
        was checked within the interval, and kept until the interval is up."""
        name = bkey.name
        self._hot.drop(name)
        path = block_path(self.root, bkey.mount_id, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            now = time.monotonic()
            checked = self._checked_at(name, now)
            sealed = self.seals and verity.is_sealed(fd)
            if sealed or (checked is not None and now - checked <= self._recheck):
                ok = resident.sendable(fd, length, 0, length)
                until = now if sealed or checked is None else checked
            else:
                ok = blockfile.read_resident_fd(fd, length, True) is not None
                if ok:
                    self._checked_now(name)
                    self.stats.rechecks += 1
                until = now
        except blockfile.Corrupt as exc:
            os.close(fd)
            self._unverify(name)
            self.spawn(self._drop_damaged(bkey, path, exc))  # as a read from disk drops it
            return None
        except OSError:
            os.close(fd)
            self._unverify(name)
            return None
        except BaseException:
            os.close(fd)
            raise
        if not ok:
            os.close(fd)
            return None
        return self._hot.keep(name, fd, sealed, until + self._recheck)

    def _checked_within(self, name: str, now: float) -> bool:
        """Whether a process of this node checked the block's whole data (or wrote it) within
        `zero_copy_recheck` seconds of `now`: a zero-copy send may then go unread."""
        checked = self._checked_at(name, now)
        return checked is not None and now - checked <= self._recheck

    def _checked_at(self, name: str, now: float) -> float | None:
        """When (at the latest) the block's whole data was last checked or written by any of
        the node's workers, this one included (the node's table, checks.py), or None."""
        age = self._node_checked.age(name)
        return None if age is None else now - age

    def _checked_now(self, name: str) -> None:
        self._node_checked.checked_now(name)

    def _unverify(self, name: str) -> None:
        self._verified.pop(name, None)
        self._hot.drop(name)
        self._node_checked.forget(name)

    def verified(self, entry: Entry) -> bool:
        """Whether this process committed the entry's file or read it from disk, and found
        nothing damaged since (it was there then; it may have been evicted since)."""
        return entry.name in self._verified

    def known(self, entry: Entry) -> bool:
        """In memory or read from disk by this process: a cheap guess that it is cached."""
        name = entry.name
        return name in self.memory or name in self._verified

    async def block_file(self, bkey: BlockKey) -> str | None:
        """The path of the block's committed file, if it is there now (it may go at any time:
        a descriptor opened on it stays readable)."""
        path = block_path(self.root, bkey.mount_id, bkey.name)
        return path if await self.hop(os.path.exists, path) else None

    async def cached_version(self, mount_id: int, key: str) -> bool:
        """Whether the page store recorded a cached version of the key whose block 0 is still
        there (which version, the store's metadata says): one row read and, if there is
        one, one stat of its block file.

        Made on the event loop, not a worker thread: a lookup that finds nothing (every cold
        miss asks) costs a few µs here, a thread hop ~80 µs of CPU. A record that names a
        block gone is forgotten."""
        keys = self._keys
        if keys is None:
            return False
        name = key_name(mount_id, key)
        block0 = keys.find(mount_id, name)
        if block0 is None:
            return False
        if os.path.exists(block_path(self.root, mount_id, block0)):
            return True
        keys.drop(mount_id, name, block0)
        return False

    def retired(self, version: Version) -> bool:
        """Whether the version was invalidated here and its blocks wait in retired/."""
        return bool(self._retired) and version in self._retired

    async def read_retired(
        self, bkey: BlockKey, length: int, start: int, end: int, preload: bool = False
    ) -> bytes | None:
        """Bytes [start, end) of a retired block (read_retired after retired()), or None."""
        path = retired_path(self.root, bkey.name)
        try:
            data = await self.hop(blockfile.read, path, length, start, end - start, True)
        except blockfile.Corrupt as exc:
            log.warning("cache: dropped damaged retired block %s: %s", bkey.name, exc)
            self.stats.corrupt += 1
            await self.hop(blockfile.remove, path)
            return None
        except OSError:
            return None
        self.stats.hit(bkey.mount_id, preload)
        self.stats.hit_bytes += len(data)
        return data

    async def read_disk(
        self, bkey: Entry, length: int, start: int, end: int, pinned: bool = False,
        preload: bool = False,
    ) -> bytes | None:  # fmt: skip
        """Bytes [start, end) of the entry's file (`length` bytes of data), checked as
        `verify_sample` says; None when it is not there, damaged (then dropped) or unreadable.
        A small block goes into the memory tier whole."""
        name = bkey.name
        small = isinstance(bkey, BlockKey) and self.memory.accepts(length)
        first, size = (0, length) if small else (start, end - start)
        path = block_path(self.root, bkey.mount_id, name)
        verify = self._verifies(name, small)
        try:
            data = await self.hop(blockfile.read, path, length, first, size, verify)
        except FileNotFoundError:
            return None
        except blockfile.Corrupt as exc:
            await self._drop_damaged(bkey, path, exc)
            return None
        except OSError as exc:
            # Unreadable now (EIO, out of descriptors): not served, fetched; kept for later.
            self.disk_trouble(f"could not read block {name}", exc)
            return None
        self._disk_hit(bkey, pinned, preload)
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
        await self.hop(blockfile.remove, path)
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

    def _disk_hit(self, bkey: Entry, pinned: bool, preload: bool = False) -> None:
        """A block served from its file: known as checked here, its use told to the janitor."""
        if len(self._verified) >= _VERIFIED_MAX:
            self._verified.clear()
        self._verified[bkey.name] = None
        if self._journal is not None:
            self._journal.access(bkey.digest, bkey.mount_id, pinned)
        self.stats.hit(bkey.mount_id, preload)

    async def read_entries(
        self, reads: list[tuple[Entry, int, int, int]], pinned: bool
    ) -> list[bytes | None]:
        """read_disk() of several entries in one thread hop, as (entry, data length, start,
        length): the bytes of each, or None. If the first is read, the others are not (the
        list has one item): a block's file answers for its sub-blocks."""
        paths = [
            (block_path(self.root, e.mount_id, e.name), n, a, k, self._verifies(e.name, False))
            for e, n, a, k in reads
        ]
        try:
            found = await self.hop(blockfile.read_each, paths, True)
        except OSError as exc:
            self.disk_trouble(f"could not read block {reads[0][0].name}", exc)
            found = [blockfile.MISSING] * len(reads)
        out: list[bytes | None] = []
        for (entry, _, _, _), got in zip(reads, found, strict=False):
            if isinstance(got, bytes):
                self._disk_hit(entry, pinned)
                self.stats.hit_bytes += len(got)
                out.append(got)
                continue
            if got == blockfile.CORRUPT:  # removed by read_each
                self.stats.corrupt += 1
                self._unverify(entry.name)
                if self._journal is not None:
                    self._journal.drop(entry.digest, entry.mount_id)
            out.append(None)
        return out

    async def commit(
        self, entry: Entry, fd: int, data: bytes, sums: Checksums, length: int, pinned: bool,
        record: str | None = None,
    ) -> bool:  # fmt: skip
        """Write the last bytes of a claimed fill (`fd`, closed whatever happens) and its
        trailer, and put the file into place; with `record` (a key's name), the entry is that
        key's cached block 0. Whether it was kept: not when the disk failed or its free
        space is below `min_free_bytes`."""
        tail = sums.tail(FLAG_PINNED if pinned else 0)
        try:
            kept = await self.hop(self._commit_file, fd, entry, data, tail, record)
        except OSError as exc:
            self.disk_trouble(f"could not commit block {entry.name}", exc)
            return False
        if not kept:
            log.warning("cache: block not kept: free disk space below the floor, or lost")
            return False
        self._entered(entry, length, pinned)
        return True

    def _commit_file(
        self, fd: int, entry: Entry, data: bytes, tail: bytes, record: str | None
    ) -> bool:
        """blockfile.commit, then the key's record written before the commit is said done
        (blocking: a cache-io thread's): a sibling worker asked for the key at once finds it,
        as it found the symlink each record was before. Commits of several threads at once
        write their records in one transaction (the flush takes all that are waiting)."""
        kept = blockfile.commit(
            fd, self.root, entry.mount_id, entry.name, data, tail, self._fsync, self.min_free,
            self.seals, self._space,
        )  # fmt: skip
        if kept and record is not None:
            self._record_now(entry.mount_id, record, entry.name)
        return kept

    def _record_now(self, mount_id: int, record: str, block0: str) -> None:
        keys = self._keys
        if keys is not None:
            keys.put(mount_id, record, block0)
            keys.flush()

    async def _open_keys(self) -> None:
        try:
            self._keys = await asyncio.to_thread(KeyRecords, self.root, self.capacity)
        except sqlite3.Error as exc:  # hints only: the node serves without them meanwhile
            self.disk_trouble("could not open the key records", OSError(str(exc)))

    async def record_key(self, mount_id: int, record: str, block0: str) -> None:
        """Record block0 as the cached version of the key named `record`, written now."""
        await self.hop(self._record_now, mount_id, record, block0)

    def keep_record(self, bkey: BlockKey) -> bool:
        """Block 0 of a version found on this disk by its name (a fill's claim, a preload's
        look): its key gets a record naming it if it has none, written by the next flush.
        A commit writes the record after the block's rename, so a process killed between the
        two (or a record refused at a stop) leaves a block no read finds: the next read of
        the key opens it from the store, and a load counted it as cached. A record naming
        another version is left as it is (the version authority decides which is current;
        a record only says that some block 0 of the key is here). Whether a record was put.
        Blocking only as `KeyRecords.find` is (a few µs; a row read at most)."""
        keys = self._keys
        if keys is None or bkey.index != 0:
            return False
        record = key_name(bkey.mount_id, bkey.key)
        if keys.find(bkey.mount_id, record) is not None:
            return False
        keys.put(bkey.mount_id, record, bkey.name)
        self.stats.records_kept += 1
        return True

    async def give_up(self, entry: Entry, fd: int) -> None:
        """Give up a claimed fill: its file removed, the claim released."""
        await asyncio.shield(self.hop(blockfile.discard, fd, self.root, entry.name))

    async def remove_entries(self, entries: list[Entry]) -> None:
        """Remove these entries' files now (a block's sub-blocks once the block is in)."""
        for entry in entries:
            self._unverify(entry.name)
        await self.hop(
            blockfile.remove_all, [block_path(self.root, e.mount_id, e.name) for e in entries]
        )
        if self._journal is not None:
            for entry in entries:
                self._journal.drop(entry.digest, entry.mount_id)

    def _entered(self, entry: Entry, length: int, pinned: bool) -> None:
        """An entry this process wrote is in place: known as checked, told to the janitor."""
        self._verified[entry.name] = None
        self._checked_now(entry.name)  # its bytes are the ones this process wrote
        if self._journal is not None:
            self._journal.fill(entry.digest, file_size(length), entry.mount_id, pinned)

    def disk_trouble(self, what: str, exc: OSError) -> None:
        """Warn of the disk's trouble, at most once a minute."""
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
        await self.hop(blockfile.retire_all, self.root, mount_id, names)
        if self._keys is not None:
            self._keys.drop(mount_id, key_name(mount_id, key), names[0])
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
        self.spawn(self.hop(blockfile.remove_all, paths))

    # -- internals ------------------------------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def hop(self, fn: Callable[..., T], *args: Any) -> T:
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
                await self.hop(journal.flush)
            except OSError as exc:
                self.disk_trouble("could not write the journal", exc)
            if self._keys is None:
                await self._open_keys()  # it could not be opened before: tried again
            else:
                try:
                    await self.hop(self._keys.flush)
                except Exception:  # never the end of this loop: the journal is flushed here too
                    log.exception("cache: could not write the key records")


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
            self._lock = await pages.hop(blockfile.spool_lock, pages.root, pages.spares)
        index = len(self._spooled)
        flags = FLAG_PINNED if self._pinned else 0
        path = await pages.hop(
            blockfile.spool, self._lock[1], index, block, flags, pages.seals, pages.spares
        )
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
        await pages.hop(blockfile.install_all, [(p, d) for p, d, _, _ in named])
        self._spooled = []
        await self._unlock()
        await pages.record_key(self._mount_id, key_name(self._mount_id, key), named[0][2].name)
        for _, _, bkey, length in named:
            pages.stats.written += 1
            pages._entered(bkey, length, self._pinned)
        if len(named) == 1 and self._blocks:
            pages.memory.put(named[0][2].name, self._blocks[0])

    async def abort(self) -> None:
        spooled, self._spooled = self._spooled, []
        self._buf = bytearray()
        if spooled:
            await self._pages.hop(blockfile.remove_all, [p for p, _, _ in spooled])
        await self._unlock()

    async def _unlock(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            await self._pages.hop(blockfile.unlock_spool, *lock)
