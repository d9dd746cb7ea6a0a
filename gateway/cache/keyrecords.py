"""Which version of a key the node's cache holds: key name -> the name of its block 0, per
mount, kept across restarts so that a restarted node asks the store for a key's metadata (or
lists its prefix) instead of fetching its first block again. A record is a hint: the block it
names may have been evicted since, and is then forgotten when met.

One SQLite file in the cache folder, `keys.db` (the standard library's sqlite3, WAL: readers
never wait for a writer), shared by the node's workers. A fill's commit records its key
(`put`) and writes what waits (`flush`: the records of commits on other threads at that
moment go in the same transaction) on its cache-io thread before the commit is done, so a
sibling asked for the key at once finds it, and a miss makes no file: before, each record
was a symlink of its own under keys/<mount>/<ab>/<cd>/, a new inode (and often two new
directories) a miss. Drops, and records a busy file refused, are written by the page store's
flush every JOURNAL_FLUSH, and at close (waiting for the siblings' flushes as long as a stop
may); what is not written when a process dies is lost, as a hint may be.

Every cold miss asks whether its key is recorded (`find`, on the event loop): ~7 us, 20-30 us
once a sibling's flush has changed the file (SQLite reads its pages again). Answering from the
keys recorded when the process started (a sorted array, one bisect) was tried and dropped:
a sibling's record made while the node runs then reaches a worker only through the node's
record of learnt versions (service/learnt.py), which drops a write when busy, so a worker's
first read of an object its sibling had just cached became a second fetch of it (CI).

The janitor's rescan removes records whose block 0 is gone (`sweep`) and takes in the
symlinks of a cache written before this file existed (`adopt`).
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator

from gateway.cache.keyfilter import KeyFilter
from gateway.cache.layout import KEYS_DIR, NAME

log = logging.getLogger(__name__)

FILE = "keys.db"
_BUSY_MS = 50  # a flush waits this long for a sibling's, then keeps its records for the next
# The last flush, at close, has no next: it waits this long for the siblings' (a node's workers
# stop together and each flushes then; a stop on a busy machine saw the 50 ms pass and the
# records of its last commits lost, so the restarted node fetched those keys again).
_CLOSE_BUSY_MS = 10_000
_OPEN_TRIES = 60  # opening the file while a sibling makes it (~3 s in all)
_OPEN_PAUSE = 0.05
_PENDING_MAX = 100_000  # records kept for a flush that keeps failing, past which they go
_SWEEP_BATCH = 2_000  # rows read, checked and their dead ones deleted per transaction
_DROP = ""  # a pending drop (its block 0 name follows in _pending's value)

_PUT = "INSERT OR REPLACE INTO held VALUES (?, ?, ?)"
_DROP_ROW = "DELETE FROM held WHERE mount = ? AND key = ? AND block0 = ?"
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS held ("
    " mount INTEGER NOT NULL, key BLOB NOT NULL, block0 BLOB NOT NULL,"
    " PRIMARY KEY (mount, key)) WITHOUT ROWID"
)


def _connect(path: str, *, threads: bool) -> sqlite3.Connection:
    """A connection to the file, made with it if it is new. The node's workers open it at the
    same moment when the node starts, and the first switch of a new file to WAL takes it whole
    without asking SQLite's busy handler: "locked" then is tried again, for up to ~3 s."""
    for attempt in range(_OPEN_TRIES):
        db = sqlite3.connect(
            path, timeout=_BUSY_MS / 1000, isolation_level=None, check_same_thread=not threads
        )
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=OFF")  # a hint: a power cut may lose the last ones
            db.execute(_SCHEMA)
        except sqlite3.OperationalError as exc:
            db.close()
            busy = "locked" in str(exc) or "busy" in str(exc)
            if not busy or attempt == _OPEN_TRIES - 1:
                raise
            time.sleep(_OPEN_PAUSE)
            continue
        return db
    raise AssertionError("unreachable")


class KeyRecords:
    """The node's records of cached keys (one object per process). `find` on any thread (a
    connection of its own each); `flush`, `adopt` and `sweep` serialized by a lock.
    `capacity`: the cache's bytes, which size the filter a first opener makes (None: its file
    system's size alone)."""

    def __init__(self, root: str, capacity: int | None = None) -> None:
        self.path = os.path.join(root, FILE)
        self._writer = _connect(self.path, threads=True)
        self._readers = threading.local()  # a connection per thread that reads
        self._opened: list[sqlite3.Connection] = []
        # (mount, key name) -> block 0 name (a put), or (_DROP, its name) (a drop if the
        # record names that block), in the order given: the last word on each key.
        self._pending: dict[tuple[int, str], str | tuple[str, str]] = {}
        self._flushing: dict[tuple[int, str], str | tuple[str, str]] = {}  # being written
        # Guards the two tables above, held for a step of a few bytecodes only (the event
        # loop puts while a flush swaps the table on a thread: a put between reading the
        # table and storing into it would be lost, or change a table being read).
        self._mem = threading.Lock()
        self._lock = threading.Lock()
        self.asked = 0  # finds that read keys.db (figures, tests)
        # The filter of recorded key names (keyfilter.py): a miss whose key it rules out reads
        # no SQLite page. Without one (it could not be made), every find reads keys.db.
        self._filter: KeyFilter | None = None
        self._stop = threading.Event()
        self._covering: threading.Thread | None = None
        with contextlib.suppress(OSError):
            self._filter = KeyFilter(root, capacity)
            self._covering = threading.Thread(target=self._cover, name="cache-keys", daemon=True)
            self._covering.start()

    @property
    def filtered(self) -> bool:
        """Whether finds of keys the filter rules out skip keys.db now (keyfilter.py)."""
        return self._filter is not None and self._filter.covered

    def put(self, mount_id: int, key: str, block0: str) -> None:
        """Record block0 as the cached version of the key (its name, pages.key_name)."""
        with self._mem:
            self._pending[(mount_id, key)] = block0

    def drop(self, mount_id: int, key: str, block0: str) -> None:
        """Forget the key's record if it names block0 (a version retired)."""
        with self._mem:
            self._pending[(mount_id, key)] = (_DROP, block0)

    def find(self, mount_id: int, key: str) -> str | None:
        """The block 0 recorded for the key, or None (not checked against the disk)."""
        with self._mem:
            said = self._pending.get((mount_id, key)) or self._flushing.get((mount_id, key))
        if said is not None:
            return said if isinstance(said, str) else None
        digest = bytes.fromhex(key)
        if self._filter is not None and not self._filter.may_hold(digest):
            return None
        self.asked += 1
        try:
            row = (
                self._read()
                .execute("SELECT block0 FROM held WHERE mount = ? AND key = ?", (mount_id, digest))
                .fetchone()
            )
        except sqlite3.Error as exc:
            log.info("cache: could not read the key records: %s", exc)
            return None
        return None if row is None else bytes(row[0]).hex()

    def _read(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._readers, "db", None)
        if db is None:
            db = self._readers.db = _connect(self.path, threads=True)
            with self._lock:
                self._opened.append(db)
        return db

    def flush(self) -> None:
        """Write what was recorded since the last flush, in one transaction. Blocking."""
        with self._lock:
            with self._mem:
                if not self._pending:
                    return
                pending, self._pending = self._pending, {}
                self._flushing = pending
            puts = [(m, bytes.fromhex(k), bytes.fromhex(v)) for (m, k), v in pending.items()
                    if isinstance(v, str)]  # fmt: skip
            drops = [(m, bytes.fromhex(k), bytes.fromhex(v[1])) for (m, k), v in pending.items()
                     if not isinstance(v, str)]  # fmt: skip
            try:
                if self._filter is not None and puts:  # before the rows: a sibling sees them
                    try:
                        self._filter.add([key for _, key, _ in puts])
                    except OSError as exc:  # a sibling misses these: it fetches them again
                        log.info("cache: could not set the filter's bits: %s", exc)
                if len(puts) == 1 and not drops:
                    # A commit's own record, the usual flush: one statement, its own
                    # transaction (BEGIN and COMMIT are two more calls that let the GIL go).
                    self._writer.execute(_PUT, puts[0])
                else:
                    with _transaction(self._writer) as db:
                        db.executemany(_PUT, puts)
                        db.executemany(_DROP_ROW, drops)
            except sqlite3.Error as exc:
                # Kept for the next flush (newer words on a key win), unless there are too many.
                with self._mem:
                    if len(pending) + len(self._pending) <= _PENDING_MAX:
                        pending.update(self._pending)
                        self._pending = pending
                log.info("cache: could not write the key records (kept for later): %s", exc)
            finally:
                with self._mem:
                    self._flushing = {}

    def sweep(self, alive: Callable[[int, str], bool], stop: threading.Event | None = None) -> int:
        """Remove the records whose block 0 `alive(mount, name)` says is gone; how many went.
        A batch at a time, so that workers' flushes go on between them. Blocking."""
        removed = 0
        for rows in self._batches(stop or threading.Event()):
            dead = [(m, k, b) for m, k, b in rows if not alive(m, bytes(b).hex())]
            if dead:
                with self._lock, _transaction(self._writer) as db:
                    db.executemany(_DROP_ROW, dead)
                removed += len(dead)
        return removed

    def _batches(self, stop: threading.Event) -> Iterator[list[tuple[int, bytes, bytes]]]:
        """The rows of keys.db in (mount, key) order, a batch at a time (the lock held for
        each read only), until `stop` is set."""
        after: tuple[int, bytes] = (-1, b"")
        while not stop.is_set():
            with self._lock:
                rows = self._writer.execute(
                    "SELECT mount, key, block0 FROM held WHERE (mount, key) > (?, ?)"
                    " ORDER BY mount, key LIMIT ?",
                    (*after, _SWEEP_BATCH),
                ).fetchall()
            if not rows:
                return
            after = (rows[-1][0], rows[-1][1])
            yield rows

    def adopt(self, root: str, stop: threading.Event | None = None) -> int:
        """Take in the symlink records of keys/<mount>/<ab>/<cd>/<name> that a cache written
        before keys.db left, and remove them (and keys/ once empty). How many were taken."""
        top = os.path.join(root, KEYS_DIR)
        if not os.path.isdir(top):
            return 0
        taken = 0
        for dirpath, _, files in os.walk(top, topdown=False):
            if stop is not None and stop.is_set():
                return taken
            mount = _mount_of(top, dirpath)
            for name in files:
                path = os.path.join(dirpath, name)
                with contextlib.suppress(OSError):
                    block0 = _name_of(os.readlink(path)) if NAME.fullmatch(name) else None
                    if mount is not None and block0 is not None:
                        self.put(mount, name, block0)
                        taken += 1
                    os.unlink(path)
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)
            if len(self._pending) >= _SWEEP_BATCH:
                self.flush()
        self.flush()
        return taken

    def _cover(self) -> None:
        """Add every key keys.db holds to the filter, then trust it (keyfilter.py): records
        written from its start on add their own. On the writer's connection (a connection
        more would be one more opener of a new file)."""
        assert self._filter is not None
        try:
            for rows in self._batches(self._stop):
                self._filter.add([bytes(key) for _, key, _ in rows])
            if not self._stop.is_set():
                self._filter.covered = True
        except (sqlite3.Error, OSError, ValueError) as exc:  # finds read keys.db, as before
            log.info("cache: the filter of key records is off: %s", exc)

    def close(self) -> None:
        self._stop.set()
        if self._covering is not None:
            self._covering.join()  # it stops between two batches
        with contextlib.suppress(sqlite3.Error):
            self._writer.execute(f"PRAGMA busy_timeout = {_CLOSE_BUSY_MS}")
        with contextlib.suppress(sqlite3.Error):
            self.flush()
        if self._pending:  # the file refused them even so: lost, as at a crash
            log.warning("cache: %d key records could not be written at close", len(self._pending))
        if self._filter is not None:
            self._filter.close()
        with self._lock:
            self._writer.close()
            for db in self._opened:
                db.close()
            self._opened = []


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection):  # type: ignore[no-untyped-def]
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _mount_of(top: str, dirpath: str) -> int | None:
    first = os.path.relpath(dirpath, top).split(os.sep)[0]
    return int(first) if first.isdigit() else None


def _name_of(target: str) -> str | None:
    """A symlink record's target: its block 0's name in unpadded URL-safe base64."""
    try:
        raw = base64.urlsafe_b64decode(target + "=")
    except ValueError:
        return None
    return raw.hex() if len(raw) == 32 else None
