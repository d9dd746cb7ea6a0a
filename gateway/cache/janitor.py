"""The one process per node that evicts: it follows every worker's journal into its eviction
policy (policy.py, built here by name in one place: _new_policy), keeps
the cache within its capacity and the disk above its free-space floor, and publishes its
figures in stats.json. It also sweeps what dead processes left in inflight/ and retired/ (every
minute) and the key records (keyrecords.py) whose block is gone (with its hourly rescan).
Every worker process runs a Janitor; the one holding janitor.lock acts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from gateway.cache import relayout, spare
from gateway.cache.blockfile import sweep_inflight, sweep_retired
from gateway.cache.freespace import free_bytes
from gateway.cache.journal import (
    ACCESS,
    DROP,
    FILL,
    UNPIN,
    UNPIN_MOUNT,
    JournalReader,
    JournalWriter,
    load_snapshot,
    records,
    write_snapshot,
)
from gateway.cache.keyrecords import KeyRecords
from gateway.cache.layout import (
    BLOCKS_DIR,
    FLAG_PINNED,
    JANITOR_LOCK,
    NAME,
    SPARE_DIR,
    STATS,
    TRAILER_SIZE,
    block_path,
    fan_dirs,
    is_mount_folder,
)
from gateway.cache.policy import Policy, create
from gateway.threadnames import name_this_thread

log = logging.getLogger(__name__)

_LOG_INTERVAL = 60.0  # seconds between two log lines about evictions (or failed passes)
_NOTHING: dict[bytes, int] = {}
_SPARES_MIN = 128  # spare block files kept however few fills take them

Found = tuple[float, int, bytes, int]  # mtime, mount, name, size of one block file


@dataclass(frozen=True)
class JanitorStats:
    """What the node's janitor last published."""

    bytes_used: int
    entries: int
    evictions: int  # blocks evicted, over every janitor this cache directory had
    evicted_bytes: int
    mounts: dict[int, int]  # bytes per mount id
    capacity: int
    min_free: int
    free_bytes: int  # of the cache's file system, as the last pass saw it
    updated: float  # time.time() of the last pass
    pid: int
    pinned_bytes: int = 0  # of pinned blocks (a file published before it: none counted)
    protected_bytes: int = 0  # of blocks used twice or more (the segment a sweep cannot take)
    unpinned_blocks: int = 0  # pins an operator took off, over every janitor of the directory
    unpinned_bytes: int = 0
    mount_pinned: dict[int, int] = dataclasses.field(default_factory=dict)  # pinned per mount
    quotas: dict[int, int] = dataclasses.field(default_factory=dict)  # mounts' own budgets


def read_stats(root: str) -> JanitorStats | None:
    """The janitor's last figures, or None before it published any. Blocks (one small read)."""
    try:
        with open(os.path.join(root, STATS), "rb") as f:
            raw = json.load(f)
        for name in ("mounts", "mount_pinned", "quotas"):
            if name in raw:  # JSON's keys are strings; a file of an older janitor has fewer
                raw[name] = {int(k): v for k, v in raw[name].items()}
        return JanitorStats(**raw)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def scan_blocks(root: str, stop: threading.Event | None = None) -> Iterator[Found]:
    """Every committed block file under <root>/blocks: (mtime, mount, name, size). Anything
    not in the layout is left alone; ends early (raising _Stopped) once `stop` is set."""
    with contextlib.suppress(FileNotFoundError), os.scandir(f"{root}/{BLOCKS_DIR}") as mounts:
        for m in mounts:
            if not is_mount_folder(m.name):
                continue
            if not m.is_dir(follow_symlinks=False):
                continue
            for d1 in fan_dirs(m.path):
                if stop is not None and stop.is_set():
                    raise _Stopped
                yield from _scan_leaf(d1.path, d1.name, int(m.name))


class _Stopped(Exception):
    pass


def _scan_leaf(path: str, prefix: str, mount: int) -> Iterator[Found]:
    # One stat per file is the floor: sizes are not in directory entries.
    with os.scandir(path) as files:
        for entry in files:
            name = entry.name
            if not (name.startswith(prefix) and NAME.fullmatch(name)):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_size >= TRAILER_SIZE:
                yield st.st_mtime, mount, bytes.fromhex(name), st.st_size


class _Rescan:
    """A full scan on a thread of its own, so that eviction goes on meanwhile. `touched` holds
    the blocks the journals or evictions changed since it began: for those the scan is older
    news than the index."""

    def __init__(self, root: str, stop: threading.Event, capacity: int) -> None:
        self.found: dict[int, dict[bytes, int]] | None = None
        self.touched: set[tuple[int, bytes]] = set()
        self._root, self._stop = root, stop
        self._capacity = capacity  # sizes the key filter, as the page store's does
        self._thread = threading.Thread(target=self._run, name="cache-rescan", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        name_this_thread("cache-rescan")
        found: dict[int, dict[bytes, int]] = {}
        try:
            for _, mount, name, size in scan_blocks(self._root, self._stop):
                found.setdefault(mount, {})[name] = size
        except _Stopped:
            return
        except OSError:
            log.warning("cache: rescan of the blocks failed", exc_info=True)
            return
        self.found = found
        try:
            records = KeyRecords(self._root, self._capacity)
        except sqlite3.Error as exc:
            log.warning("cache: could not open the key records to sweep them: %s", exc)
            return
        try:
            adopted = records.adopt(self._root, self._stop)
            if adopted:
                log.info("cache: took %d key records of an older cache into keys.db", adopted)
            removed = records.sweep(
                lambda mount, name: bytes.fromhex(name) in found.get(mount, _NOTHING)
                or os.path.exists(block_path(self._root, mount, name)),
                self._stop,
            )
        except (OSError, sqlite3.Error):
            log.warning("cache: sweep of the key records failed", exc_info=True)
            return
        finally:
            records.close()
        if removed:
            log.info("cache: removed %d records of keys whose blocks are gone", removed)

    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self) -> None:
        self._thread.join()


class Janitor:
    """Evicts for every process using `root`, if it is the one holding <root>/janitor.lock.

    start() runs passes on a daemon thread every `interval` seconds, taking the lock over when
    its holder dies; run_once() is one pass, for tests that do not start() it. `capacity` and
    `min_free` may be changed at any time and count from the next pass. Becoming the
    janitor loads the index from the snapshot and the journals after it, or else by a full
    scan of blocks/; a periodic rescan in the background repairs what journals missed.
    """

    def __init__(
        self,
        root: str,
        capacity: int,
        min_free: int,
        *,
        interval: float = 0.5,
        snapshot_interval: float = 60.0,
        rescan_interval: float = 3600.0,
        sweep_interval: float = 60.0,
        policy: str = "slru",
    ) -> None:
        self.root = os.path.abspath(root)
        self.capacity = capacity
        self.min_free = min_free
        self.is_janitor = False
        self._interval = interval
        self._snapshot_interval = snapshot_interval
        self._rescan_interval = rescan_interval
        self._sweep_interval = sweep_interval
        self._settings = threading.Lock()
        self._quotas: dict[int, int] = {}
        self._new_quotas: dict[int, int] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock_fd: int | None = None
        self._policy_name = policy
        self._policy = self._new_policy()  # an unknown name fails here, not as the janitor
        self._reader: JournalReader | None = None
        self._journal: JournalWriter | None = None  # our evictions, for whoever comes next
        self._rescan: _Rescan | None = None
        self._next_rescan = self._next_snapshot = self._next_sweep = 0.0
        # Journals whose writer died without sealing them, which no finished rescan has
        # followed yet (found since the running one began; found before it): kept on disk
        # until one has, so that a janitor that takes over meanwhile rescans too.
        self._unscanned: set[str] = set()
        self._scanning: set[str] = set()
        self._dirty = False  # changed since the last snapshot
        self._covered: dict[str, int] = {}  # journal offsets of the last snapshot
        self._evictions = self._evicted_bytes = 0
        self._unpinned = [0, 0]  # blocks, bytes: pins taken off by `gateway load --unpin`
        self._unlogged = [0, 0, time.monotonic()]  # evictions, bytes, since
        self._failed_passes = 0
        self._failure_logged = 0.0
        self._spares = 0  # spares left after the last pass
        self._filled = 0  # fill records read since the last pass
        self.recycled = 0  # evicted files made spares

    def set_quotas(self, quotas: Mapping[int, int]) -> None:
        """Bytes per mount id, from the next pass on. Thread-safe."""
        with self._settings:
            self._new_quotas = dict(quotas)

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("janitor already started")
        spare.quiet_lease_breaks()  # evicted files become spares only then
        self._thread = threading.Thread(target=self._loop, name="cache-janitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """As janitor: a last snapshot, then the lock goes to whoever is waiting for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        else:
            self._retire()

    def _loop(self) -> None:
        name_this_thread("cache-janitor")
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:
                self._pass_failed()
            self._stop.wait(self._interval)
        try:
            self._retire()
        except Exception:
            log.exception("cache: janitor could not write its last snapshot")

    def run_once(self) -> None:
        """One pass: journals in, evictions out, figures published, snapshot when due."""
        if not self.is_janitor and not self._become():
            return
        with self._settings:
            quotas, self._new_quotas = self._new_quotas, None
        if quotas is not None:
            self._quotas = quotas
            self._policy.set_quotas(quotas)
        self._policy.set_capacity(self.capacity)  # as it may have changed; else no work
        unpinned = self._read_journals()
        now = time.monotonic()
        self._after_unsealed(now)
        if unpinned:
            # Until a snapshot covers them, a restart replays the unpins together with the
            # pins before them (every journal from the last snapshot on, one after another).
            # Applied last, they win that replay too; the snapshot now keeps the window for
            # a later pin in it, which the replay would wrongly lose, one pass wide.
            self._next_snapshot = now
        self._check_rescan(now)
        spares = spare.count(self.root)
        # The fills since the last pass set how many to keep (a node that misses little keeps
        # few; one that misses fast, up to spare.TARGET): the journals' fill records, or the
        # spares taken where more. The spares taken alone saw no more than the pool held, so
        # a burst of misses outran it for passes, each miss past it making a file on a thread.
        taken, self._filled = max(self._spares - spares, self._filled), 0
        wanted = min(spare.TARGET, max(_SPARES_MIN, 4 * taken))
        free, spares = self._evict(spares)
        if spares < wanted:
            spares += spare.make(self.root, min(spare.MAKE_MAX, wanted - spares))
        self._spares = spares
        self._publish(free)
        if now >= self._next_sweep:
            self._next_sweep = now + self._sweep_interval
            removed = sweep_inflight(self.root) + sweep_retired(self.root) + spare.sweep(self.root)
            if removed:
                log.info("cache: removed %d files of fills and writes dead processes left", removed)
        if now >= self._next_snapshot:
            self._next_snapshot = now + self._snapshot_interval  # failed or not: not at once
            self._snapshot()

    def _pass_failed(self) -> None:
        """Log a failing pass (a full disk fails every one), but not twice a second."""
        self._failed_passes += 1
        now = time.monotonic()
        if now - self._failure_logged >= _LOG_INTERVAL:
            self._failure_logged = now
            count, self._failed_passes = self._failed_passes, 0
            log.exception("cache: janitor pass failed (%d since the last such line)", count)

    # -- becoming and ceasing to be the janitor -------------------------------------------------

    def _become(self) -> bool:
        if self._lock_fd is None:
            os.makedirs(os.path.join(self.root, SPARE_DIR), exist_ok=True)
            relayout.ensure(self.root)  # a folder an older version wrote
            path = os.path.join(self.root, JANITOR_LOCK)
            self._lock_fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        try:
            self._load()
        except BaseException:
            # Interrupted while loading (a signal, a failed scan): no journal left open.
            if self._journal is not None:
                self._journal.close()
            if self._reader is not None:
                self._reader.close()
            self._journal = self._reader = None
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            raise
        self.is_janitor = True
        return True

    def _load(self) -> None:
        started = time.monotonic()
        stats = read_stats(self.root)
        if stats is not None:
            self._evictions, self._evicted_bytes = stats.evictions, stats.evicted_bytes
            self._unpinned = [stats.unpinned_blocks, stats.unpinned_bytes]
        loaded = self._from_snapshot()
        how = "snapshot" if loaded is not None else "scan"
        self._policy, self._reader = loaded or self._from_scan()
        self._dirty = loaded is None  # a scan is worth a snapshot at once
        self._journal = JournalWriter(self.root)
        now = time.monotonic()
        self._next_rescan = now + self._rescan_interval
        self._next_snapshot = now + (self._snapshot_interval if loaded is not None else 0.0)
        held = self._policy.figures()
        log.info(
            "cache: janitor of %s (pid %d): %d blocks, %d bytes, from the %s in %.2f s",
            self.root,
            os.getpid(),
            held.entries,
            held.bytes_used,
            how,
            now - started,
        )

    def _new_policy(self) -> Policy:
        """An empty policy of this janitor's kind, capacity and quotas: the one place the
        janitor builds its policy (at start, and from a snapshot or a scan when it takes
        over)."""
        return create(self.capacity, self._quotas, name=self._policy_name)

    def _from_snapshot(self) -> tuple[Policy, JournalReader] | None:
        snapshot = load_snapshot(self.root)
        if snapshot is None:
            return None
        policy = self._new_policy()
        try:
            policy.restore(snapshot.entries)
        except ValueError as exc:
            log.warning("cache: index snapshot ignored: %s", exc)
            return None
        self._covered = snapshot.journal_offsets
        return policy, JournalReader(self.root, snapshot.journal_offsets)

    def _from_scan(self) -> tuple[Policy, JournalReader]:
        policy = self._new_policy()
        reader = JournalReader(self.root)
        try:
            reader.skip_to_end()  # what the journals said so far, the scan sees on disk
            for _, mount, name, size in sorted(scan_blocks(self.root)):
                policy.add(mount, name, size)  # oldest first: mtime is the order a scan knows
        except BaseException:
            reader.close()
            raise
        return policy, reader

    def _retire(self) -> None:
        try:
            if self.is_janitor:
                if self._rescan is not None:
                    self._rescan.join()  # it saw _stop and ends within one directory
                self._log_evictions(force=True)
                assert self._journal is not None
                self._journal.close()
                # Read to the end, our own journal too, so the snapshot covers all of it.
                self._read_journals()
                self._snapshot()
        finally:
            if self._reader is not None:
                self._reader.close()
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # releases the lock
            self._lock_fd, self._reader, self.is_janitor = None, None, False

    # -- one pass -------------------------------------------------------------------------------

    def _read_journals(self) -> int:
        """Apply every new journal record; returns how many pins unpins took off.

        Whether a filled or dropped block is there is asked of the disk, not of the order of
        the records: journals are read one after the other, so a drop can come before the fill
        it follows (an eviction by the janitor before this one, a block dropped in one process
        and filled again in another). So can a use: a
        block filled by one worker and read next through another is known here by the second
        worker's record first when its journal is read first, or flushed sooner; the block is
        then taken as filled (it is on disk) and the use counts, so that the later record of
        its fill finds it known and the block keeps the protection two uses earn.

        For the same reason unpins are applied last, after every other record of the pass: a
        pin and an unpin that both reach this pass are an unpin following the pin (a load
        with --pin, then `gateway load --unpin`); the opposite order is too close to tell."""
        assert self._reader is not None
        policy = self._policy
        touched = self._rescan.touched if self._rescan is not None else None
        unpins: list[tuple[int, bytes | None]] = []  # None: every pin of the mount
        for _, data in self._reader.read():
            for op, flags, mount, size, name in records(data):
                if op in (UNPIN, UNPIN_MOUNT):
                    unpins.append((mount, name if op == UNPIN else None))
                    continue
                if op == ACCESS:
                    if (mount, name) not in policy:
                        self._add_from_disk(mount, name)
                    policy.access(mount, name, True if flags & FLAG_PINNED else None)
                elif op in (FILL, DROP):
                    if not os.path.exists(block_path(self.root, mount, name.hex())):
                        policy.remove(mount, name)
                    elif op == FILL:
                        policy.add(mount, name, size, bool(flags & FLAG_PINNED))
                        self._filled += 1
                else:
                    continue  # a journal's head or seal: nothing a snapshot must keep
                self._dirty = True
                if touched is not None:
                    touched.add((mount, name))
        unpinned = 0
        for mount, one in unpins:
            if one is None:
                sizes = policy.unpin_mount(mount)
            else:
                freed = policy.unpin(mount, one)
                sizes = [] if freed is None else [freed]
            unpinned += len(sizes)
            self._unpinned[0] += len(sizes)
            self._unpinned[1] += sum(sizes)
        if unpinned:
            self._dirty = True
            log.info("cache: %d blocks unpinned", unpinned)
        return unpinned

    def _add_from_disk(self, mount: int, name: bytes) -> None:
        """A block used before its fill was read: known from its file, if there is one."""
        try:
            st = os.stat(block_path(self.root, mount, name.hex()))
        except OSError:
            return  # gone (evicted or dropped since): the use is of nothing kept
        if stat.S_ISREG(st.st_mode) and st.st_size >= TRAILER_SIZE:
            self._policy.add(mount, name, st.st_size)

    def _after_unsealed(self, now: float) -> None:
        """A journal whose writer died without sealing it (kill -9, a crash) lost the records
        of its last flush window: blocks committed then are on disk and in no journal, counted
        against no capacity until a rescan finds them. Rescan now rather than within the hour
        (after the one running, which may have passed their folders already)."""
        assert self._reader is not None
        unsealed = self._reader.take_unsealed()
        if not unsealed:
            return
        log.warning(
            "cache: %d journals of processes that died without closing them (%s): "
            "a rescan finds the blocks their last records would have told of",
            len(unsealed),
            ", ".join(unsealed[:3]) + (", ..." if len(unsealed) > 3 else ""),
        )
        self._unscanned.update(unsealed)
        if self._rescan is None:
            self._next_rescan = now

    def _check_rescan(self, now: float) -> None:
        rescan = self._rescan
        if rescan is None:
            if now >= self._next_rescan:
                self._rescan = _Rescan(self.root, self._stop, self.capacity)
                self._scanning, self._unscanned = self._unscanned, set()
            return
        if not rescan.done():
            return
        self._rescan = None
        scanned, self._scanning = self._scanning, set()
        if rescan.found is None:  # failed: the next one is owed what this one was
            self._unscanned |= scanned
            self._next_rescan = now + self._rescan_interval
            return
        self._next_rescan = now if self._unscanned else now + self._rescan_interval
        self._reconcile(rescan.found, rescan.touched)

    def _reconcile(
        self, found: dict[int, dict[bytes, int]], touched: set[tuple[int, bytes]]
    ) -> None:
        policy = self._policy
        gone = [
            (mount, name)
            for mount, name, _, _, _ in policy.entries()
            if name not in found.get(mount, _NOTHING) and (mount, name) not in touched
        ]
        for mount, name in gone:
            policy.remove(mount, name)
        added = 0
        for mount, names in found.items():
            for name, size in names.items():
                if (mount, name) not in policy and (mount, name) not in touched:
                    policy.add(mount, name, size)
                    added += 1
        if gone or added:
            self._dirty = True
            log.info(
                "cache: rescan found %d blocks no journal told of and %d that had vanished",
                added,
                len(gone),
            )

    def _evict(self, spares: int) -> tuple[int, int]:
        """Evict what the policy says, an evicted file made a spare (spare.py) while there are
        fewer than spare.TARGET (`spares` now); returns the free bytes of the file system and
        the spares then."""
        assert self._journal is not None
        free = free_bytes(self.root)
        victims = self._policy.victims(max(0, self.min_free - free))
        if not victims:
            self._log_evictions()
            return free, spares
        failed: list[OSError] = []
        touched = self._rescan.touched if self._rescan is not None else None
        for mount, name, _ in victims:
            path = block_path(self.root, mount, name.hex())
            try:
                if spares < spare.TARGET:
                    if spare.recycle(self.root, path):
                        spares += 1
                        self.recycled += 1
                else:
                    os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                failed.append(exc)  # the file stays: the next rescan takes it back in
            self._journal.drop(name, mount)
            if touched is not None:
                touched.add((mount, name))
        if failed:
            log.warning("cache: could not evict %d blocks, the first: %s", len(failed), failed[0])
        freed = sum(v.size for v in victims)
        self._evictions += len(victims)
        self._evicted_bytes += freed
        self._unlogged[0] += len(victims)
        self._unlogged[1] += freed
        self._dirty = True
        try:
            self._journal.flush()
        except OSError:  # only a later janitor reads them; a rescan makes up for their loss
            log.warning("cache: could not write the janitor's journal", exc_info=True)
        self._log_evictions()
        return free_bytes(self.root), spares

    def _log_evictions(self, force: bool = False) -> None:
        count, freed, since = self._unlogged
        now = time.monotonic()
        if count and (force or now - since >= _LOG_INTERVAL):
            held = self._policy.figures()
            log.info(
                "cache: evicted %d blocks (%d bytes) in %.0f s; %d blocks, %d bytes kept",
                count,
                freed,
                now - since,
                held.entries,
                held.bytes_used,
            )
            self._unlogged = [0, 0, now]
        elif not count:
            self._unlogged[2] = now

    def _publish(self, free: int) -> None:
        held = self._policy.figures()
        stats = JanitorStats(
            bytes_used=held.bytes_used,
            entries=held.entries,
            evictions=self._evictions,
            evicted_bytes=self._evicted_bytes,
            mounts=held.mounts,
            capacity=self.capacity,
            min_free=self.min_free,
            free_bytes=free,
            updated=time.time(),
            pid=os.getpid(),
            pinned_bytes=held.pinned_bytes,
            protected_bytes=held.protected_bytes,
            unpinned_blocks=self._unpinned[0],
            unpinned_bytes=self._unpinned[1],
            mount_pinned=held.mount_pinned,
            quotas=dict(self._quotas),
        )
        tmp = f"{self.root}/.{STATS}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(dataclasses.asdict(stats), f)
        os.replace(tmp, os.path.join(self.root, STATS))

    def _snapshot(self) -> None:
        """Write the index if it changed, then delete the journals the snapshot made useless."""
        assert self._reader is not None
        if self._dirty:
            offsets = self._reader.offsets
            write_snapshot(self.root, self._policy.entries(), offsets)
            self._covered, self._dirty = offsets, False
        self._reader.prune(self._covered, keep=self._unscanned | self._scanning)
