"""Spare block files: empty files made ahead of need, and evicted block files emptied for
reuse, so that a miss makes no inode (each new one costs ~80 us of CPU on this VM's ext4,
half of a fill's file work: docs/performance.md, "No inode on the miss path").

    <root>/spare/<name>        an empty file, unlocked, owned by no one

The janitor keeps TARGET of them: an evicted block's file is moved here and emptied instead of
being removed (`recycle`), but only when no process has it open (a write lease, F_SETLEASE,
is granted only then: a reader, a zero-copy send or a short-circuit client holding the old
bytes keeps its file, which is removed as before), and new ones are made when evictions do
not keep up (`make`). A fill takes one (`Spares.take`: opened, locked, checked to be still
here and empty) where it made a private file before; blockfile.claim then links it to its
public name in inflight/ and removes its name here, as it did the private one. A file taken
and given back (its claim lost to another filler) is still empty and stays. A write-through
takes them too: its lock and each block it spools (blockfile.spool_lock, spool) are spares
renamed into inflight/.

A file being moved here is emptied under a name of its own (.r.<name>) first, so no taker
ever sees it with bytes. Blocking calls: a thread's.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import random
import secrets
import signal
import threading
import time
from collections.abc import Callable

from gateway.cache.layout import SPARE_DIR

log = logging.getLogger(__name__)

TARGET = 1024  # spares the janitor keeps
RELIST_AFTER = 1.0  # seconds: an unchanged folder is listed again after this at most
MAKE_MAX = 1024  # new ones it makes in one pass at most
_RDWR = os.O_RDWR | os.O_CLOEXEC
_RECYCLING = ".r."
_STAGING = ".new"  # where new spares are made, under spare/ (a dot: no taker lists it)


class Spares:
    """The spares this process may take: names read from spare/ now and then, tried in a
    random order (the node's other workers take from the same folder)."""

    def __init__(self, root: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.folder = f"{root}/{SPARE_DIR}"
        self._names: list[str] = []
        self._lock = threading.Lock()
        self._clock = clock
        # The folder as the last listing saw it: (its mtime, when listed). A pool run dry is
        # listed again only once the folder changed (a spare made or taken) or RELIST_AFTER
        # passed (a change within the file system's clock tick), so a node whose janitor is
        # not keeping up pays a stat a miss, not a listing.
        self._listed: tuple[int, float] | None = None
        self.taken = 0  # spares this process took (figures)
        self.listings = 0  # listings of the folder (figures)

    def take(self, listed_only: bool = False) -> tuple[int, str] | None:
        """A spare, locked and empty: (descriptor, path), or None when there is none (or,
        `listed_only`, none among the names listed before: the folder is not listed again)."""
        for relisted in (False, True):
            while True:
                with self._lock:
                    if not self._names:
                        break
                    name = self._names.pop()
                found = _open_spare(f"{self.folder}/{name}")
                if found is not None:
                    self.taken += 1
                    return found
            if relisted or listed_only or not self._relist():
                return None
        return None

    def give_back(self, path: str) -> None:
        """A spare taken and not used (its claim lost), closed and still empty: the next take
        tries it first (its folder did not change, so no listing would find it again soon)."""
        with self._lock:
            self._names.append(os.path.basename(path))

    def _relist(self) -> bool:
        try:
            changed = os.stat(self.folder).st_mtime_ns
        except FileNotFoundError:
            return False
        now = self._clock()
        listed = self._listed
        if listed is not None and listed[0] == changed and now - listed[1] < RELIST_AFTER:
            return False  # nothing made or taken since a listing that found none to take
        self._listed = (changed, now)  # before the listing: a change during it is seen next
        self.listings += 1
        try:
            with os.scandir(self.folder) as entries:
                names = [e.name for e in entries if not e.name.startswith(".")]
        except FileNotFoundError:
            return False
        random.shuffle(names)
        with self._lock:
            self._names = names
        return bool(names)


def _open_spare(path: str) -> tuple[int, str] | None:
    try:
        fd = os.open(path, _RDWR)
    except OSError:
        return None  # taken by another process meanwhile (or not ours to write)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        mine = os.fstat(fd)
        now = os.stat(path)
    except OSError:
        os.close(fd)
        return None
    # Taken, filled and moved on by another process while we opened it: not a spare now.
    if (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino) or mine.st_size:
        os.close(fd)
        return None
    return fd, path


def count(root: str) -> int:
    try:
        with os.scandir(f"{root}/{SPARE_DIR}") as entries:
            return sum(1 for e in entries if not e.name.startswith("."))
    except FileNotFoundError:
        return 0


def quiet_lease_breaks() -> bool:
    """Ignore SIGIO in this process, so that a lease broken by an opener (one that found the
    file by its old name just before it was moved) cannot end it: the kernel tells a lease's
    holder with SIGIO, whose default action ends the process. Called from the main thread
    (signal handlers are set there) when the janitor starts; whether leases may be taken."""
    if signal.getsignal(signal.SIGIO) is signal.SIG_DFL:
        try:
            signal.signal(signal.SIGIO, signal.SIG_IGN)
        except ValueError:  # not the main thread: no leases, evicted files are removed
            return False
    return True


def recycle(root: str, path: str) -> bool:
    """Make the evicted block file at `path` a spare if no process has it open; else (or when
    the file system cannot tell, or the file is sealed: fs-verity files are read-only for
    good, or SIGIO is not ignored: quiet_lease_breaks) remove it. Whether it became a spare.
    Either way nothing is left at `path`."""
    if signal.getsignal(signal.SIGIO) is signal.SIG_DFL:
        _remove(path)
        return False
    name = secrets.token_hex(8)
    moving = f"{root}/{SPARE_DIR}/{_RECYCLING}{name}"
    try:
        os.rename(path, moving)
    except FileNotFoundError:
        return False
    except OSError:
        _remove(path)
        return False
    try:
        fd = os.open(moving, _RDWR)
    except OSError:
        _remove(moving)  # sealed (EPERM) or unreadable: removed as before
        return False
    try:
        # Granted only while no other descriptor of the file is open anywhere (this one
        # aside): no reader can then lose the bytes it is reading. Nothing opens spare/'s
        # names but takers, and this one is not yet a spare's.
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
    except OSError:
        os.close(fd)
        _remove(moving)
        return False
    try:
        os.ftruncate(fd, 0)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        os.rename(moving, f"{root}/{SPARE_DIR}/{name}")
    except OSError:
        _remove(moving)
        return False
    finally:
        os.close(fd)
    return True


def make(root: str, wanted: int) -> int:
    """Make up to `wanted` new spares; how many were made. Each is created in spare/.new/ and
    then moved into spare/: a create holds its folder's lock while the file system allocates
    the inode (~20 us, or hundreds after many deletions near it on ext4 without a journal),
    and a fill's claim, on the event loop, removes its spare's name from spare/ under that
    lock: it waited for the creates (a claim's wall time ~530 us, docs/performance.md)."""
    made = 0
    staging = f"{root}/{SPARE_DIR}/{_STAGING}"
    prefix = secrets.token_hex(4)
    try:
        os.makedirs(staging, exist_ok=True)
        for i in range(wanted):
            name = f"{prefix}{i:x}"
            try:
                fd = os.open(f"{staging}/{name}", _RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue
            os.close(fd)
            try:
                os.rename(f"{staging}/{name}", f"{root}/{SPARE_DIR}/{name}")
            except OSError:
                _remove(f"{staging}/{name}")
                raise
            made += 1
    except OSError as exc:
        log.info("cache: could not make spare block files: %s", exc)
    return made


def sweep(root: str) -> int:
    """Remove what a janitor that died while recycling (.r.<name>) or making spares (in .new/)
    left; how many."""
    removed = 0
    with contextlib.suppress(FileNotFoundError), os.scandir(f"{root}/{SPARE_DIR}") as entries:
        for entry in entries:
            if entry.name.startswith(_RECYCLING):
                _remove(entry.path)
                removed += 1
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(f"{root}/{SPARE_DIR}/{_STAGING}"):
            _remove(f"{root}/{SPARE_DIR}/{_STAGING}/{name}")
            removed += 1
    return removed


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
