"""How the worker processes of a node tell the janitor what they filled, used and dropped
(one append-only journal file each), and the janitor's snapshot of its index.

A journal is a run of fixed-size records. Its writer holds an exclusive flock on it for as long
as it lives, so the janitor can tell a journal that may still grow from one that never will.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import struct
import threading
import time
import zlib
from collections.abc import Iterable, Iterator, Mapping, Set
from typing import NamedTuple

from gateway.cache.layout import FLAG_PINNED, JOURNAL_DIR, SNAPSHOT
from gateway.cache.policy import Entry

log = logging.getLogger(__name__)

# op, flags, version (OPEN only), mount (the pid for OPEN), size, name (the magic for OPEN)
RECORD = struct.Struct("<BBHIQ32s")
OPEN, FILL, ACCESS, DROP, SEAL = 1, 2, 3, 4, 5
# An operator's unpin (`gateway load --unpin`). A new op rather than a flag on ACCESS: a use
# that does not pin says nothing of pins, and a janitor of an earlier version skips an op it
# does not know (the pin then stays, as it was before unpin existed).
UNPIN = 6
UNPIN_MOUNT = 7  # every pin of the mount (its name unused), whichever version it is of
_MAGIC = b"S3GW journal".ljust(32, b"\0")
_VERSION = 1
_SUFFIX = ".log"
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
_STALE_PRIVATE = 60.0  # seconds: a private journal name this old belongs to a dead process


class JournalWriter:
    """This process's journal. fill(), access() and drop() only append to a buffer in memory
    and never block; flush() writes the buffer in one write (call it on a thread, every half
    second or so); close() flushes and seals. One per process: create it after a fork."""

    def __init__(self, root: str, *, max_bytes: int = 64 << 20) -> None:
        self._dir = os.path.join(root, JOURNAL_DIR)
        self._max_bytes = max_bytes  # a longer journal is sealed and a new one begun
        self._lock = threading.Lock()  # guards the buffer, held only to append or swap it
        self._write_lock = threading.Lock()  # one flush at a time
        self._buf = bytearray()
        self._seen: set[tuple[int, bytes, bool]] = set()
        self._closed = False
        self._fd, self.path = _create(self._dir)
        self._end = RECORD.size

    def fill(self, name: bytes, size: int, mount: int, pinned: bool) -> None:
        """A block was committed: `size` bytes on disk. `pinned` sets or clears its pin."""
        self._append(RECORD.pack(FILL, FLAG_PINNED if pinned else 0, 0, mount, size, name))

    def access(self, name: bytes, mount: int, pinned: bool = False) -> None:
        """A block was read. `pinned` True pins it; False leaves its pin alone, because a reader
        does not always know. Repeats within one flush are dropped: one use per window is all
        the policy needs to tell hot from cold."""
        key = (mount, name, pinned)
        with self._lock:
            if key in self._seen or self._closed:
                return
            self._seen.add(key)
            self._buf += RECORD.pack(ACCESS, FLAG_PINNED if pinned else 0, 0, mount, 0, name)

    def drop(self, name: bytes, mount: int) -> None:
        """A block was removed (damaged, or its version invalidated)."""
        self._append(RECORD.pack(DROP, 0, 0, mount, 0, name))

    def unpin(self, name: bytes, mount: int) -> None:
        """The block's pin is to go: it becomes an ordinary block the janitor may evict. The
        janitor applies it after every other record it reads in the same pass, so that a pin
        written earlier, in a journal it happens to read later, does not come back."""
        self._append(RECORD.pack(UNPIN, 0, 0, mount, 0, name))

    def unpin_mount(self, mount: int) -> None:
        """Every pinned block of the mount is to lose its pin, as unpin() of each: also those
        of versions no listing names any more (overwritten at the origin since the load)."""
        self._append(RECORD.pack(UNPIN_MOUNT, 0, 0, mount, 0, bytes(32)))

    def flush(self) -> None:
        """Write what gathered. Blocks. On an OSError the batch is lost (the janitor's next
        rescan finds what it missed) and the file still ends at a whole record."""
        with self._write_lock:
            data = self._swap()
            if self._closed:
                return
            if data:
                self._write(data)
            if self._end >= self._max_bytes:
                fd, path = _create(self._dir)
                self._seal()
                self._fd, self.path, self._end = fd, path, RECORD.size

    def close(self) -> None:
        """Flush, seal and let go of the journal (its lock with it). Later calls do nothing."""
        with self._write_lock:
            with self._lock:
                self._closed = True
            data = self._swap()
            if self._fd < 0:
                return
            try:
                if data:
                    self._write(data)
            finally:
                self._seal()

    def _append(self, record: bytes) -> None:
        with self._lock:
            if not self._closed:
                self._buf += record

    def _swap(self) -> bytearray:
        with self._lock:
            data, self._buf = self._buf, bytearray()
            self._seen.clear()
        return data

    def _write(self, data: bytearray) -> None:
        view = memoryview(data)
        written = 0
        try:
            while written < len(view):
                written += os.write(self._fd, view[written:])
        except OSError:
            # Cut a torn record off: every record after it would be misread.
            written -= written % RECORD.size
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._end + written)
            raise
        finally:
            self._end += written

    def _seal(self) -> None:
        fd, self._fd = self._fd, -1
        try:
            os.write(fd, RECORD.pack(SEAL, 0, 0, 0, 0, bytes(32)))
        except OSError:
            log.warning("cache: could not seal the journal %s", self.path, exc_info=True)
        finally:
            os.close(fd)


def _create(directory: str) -> tuple[int, str]:
    """Create, lock and head a journal under a private name, then give it its public one: the
    janitor never sees a journal unlocked while its writer lives."""
    os.makedirs(directory, exist_ok=True)
    stem = f"{os.getpid()}-{secrets.token_hex(6)}"
    private, public = f"{directory}/.{stem}.tmp", f"{directory}/{stem}{_SUFFIX}"
    fd = os.open(private, _CREATE | os.O_APPEND, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, RECORD.pack(OPEN, 0, _VERSION, os.getpid(), 0, _MAGIC))
        os.rename(private, public)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(private)
        raise
    return fd, public


class JournalReader:
    """The janitor's side: tails every journal from where it stopped, and deletes a journal
    once its writer is dead, all of it was read and a snapshot covers it."""

    def __init__(self, root: str, offsets: Mapping[str, int] | None = None) -> None:
        self._dir = os.path.join(root, JOURNAL_DIR)
        self._offsets: dict[str, int] = dict(offsets or {})
        self._fds: dict[str, int] = {}
        self._foreign: set[str] = set()
        self._finished: set[str] = set()  # writer dead and every whole record read
        # Journals found finished without their seal: a writer killed or crashed, whose last
        # records (up to a flush's worth) never reached the file. take_unsealed() hands them on.
        self._unsealed: list[str] = []

    @property
    def offsets(self) -> dict[str, int]:
        """Journal file name -> bytes consumed, for the snapshot."""
        return dict(self._offsets)

    def read(self) -> list[tuple[str, bytes]]:
        """(journal name, whole new records) of every journal with any. A record still being
        written is left for a later read."""
        out = []
        for name in self._current():
            fd = self._fds[name]
            # Liveness first: whatever a writer dead by now wrote is in the file already.
            alive = _locked(fd)
            offset = self._offsets[name]
            length = (os.fstat(fd).st_size - offset) // RECORD.size * RECORD.size
            if length > 0:
                out.append((name, _pread_all(fd, length, offset)))
                self._offsets[name] = offset + length
            if not alive and name not in self._finished:
                self._finished.add(name)
                if not _sealed(fd):
                    self._unsealed.append(name)
        return out

    def take_unsealed(self) -> list[str]:
        """The journals found finished without their seal since the last call."""
        names, self._unsealed = self._unsealed, []
        return names

    def skip_to_end(self) -> None:
        """Consider every whole record written so far as read (before a full scan, which
        finds what they say)."""
        for name in self._current():
            fd = self._fds[name]
            alive = _locked(fd)
            offset = self._offsets[name]
            size = os.fstat(fd).st_size
            self._offsets[name] = offset + (size - offset) // RECORD.size * RECORD.size
            if not alive:
                self._finished.add(name)  # sealed or not: the scan sees what it left

    def prune(self, covered: Mapping[str, int], keep: Set[str] = frozenset()) -> None:
        """Delete the finished journals that `covered` (a snapshot's offsets) holds to their
        end, but those in `keep`, and private names a crash left."""
        for name in sorted(self._finished - keep):
            if covered.get(name) == self._offsets.get(name):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"{self._dir}/{name}")
                self._forget(name)
        with contextlib.suppress(FileNotFoundError), os.scandir(self._dir) as entries:
            for entry in entries:
                if entry.name.startswith(".") and entry.name.endswith(".tmp"):
                    with contextlib.suppress(FileNotFoundError):
                        if time.time() - entry.stat().st_mtime > _STALE_PRIVATE:
                            os.unlink(entry.path)

    def close(self) -> None:
        for name in list(self._fds):
            self._forget(name)

    def _current(self) -> list[str]:
        """The journals there are now, opened, with their headers checked."""
        try:
            names = {n for n in os.listdir(self._dir) if n.endswith(_SUFFIX) and n[0] != "."}
        except FileNotFoundError:
            names = set()
        for name in [n for n in self._fds if n not in names]:
            self._forget(name)  # deleted by an earlier janitor
        for name in [n for n in self._offsets if n not in names]:
            del self._offsets[name]  # a snapshot's, of a journal deleted since
        for name in names - self._fds.keys() - self._foreign:
            with contextlib.suppress(FileNotFoundError):
                self._open(name)
        return sorted(self._fds)

    def _open(self, name: str) -> None:
        fd = os.open(f"{self._dir}/{name}", os.O_RDONLY | os.O_CLOEXEC)
        head = os.pread(fd, RECORD.size, 0)
        if len(head) < RECORD.size or not _is_head(head):
            os.close(fd)
            self._foreign.add(name)  # not ours: leave it alone
            return
        self._fds[name] = fd
        self._offsets[name] = max(self._offsets.get(name, 0), RECORD.size)

    def _forget(self, name: str) -> None:
        os.close(self._fds.pop(name))
        self._offsets.pop(name, None)
        self._finished.discard(name)


def _is_head(raw: bytes) -> bool:
    op, _, version, _, _, magic = RECORD.unpack(raw)
    return op == OPEN and magic == _MAGIC and version == _VERSION


def records(data: bytes) -> Iterator[tuple[int, int, int, int, bytes]]:
    """(op, flags, mount, size, name) of each record read()."""
    for op, flags, _, mount, size, name in RECORD.iter_unpack(data):
        yield op, flags, mount, size, name


def _locked(fd: int) -> bool:
    """Whether a writer holds its lock on the journal."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def _sealed(fd: int) -> bool:
    """Whether the journal's last record is its seal (its writer closed it)."""
    size = os.fstat(fd).st_size
    if size % RECORD.size or size < 2 * RECORD.size:
        return False  # a torn last record, or a head alone: nothing closed it
    last = os.pread(fd, RECORD.size, size - RECORD.size)
    return len(last) == RECORD.size and last[0] == SEAL


def _pread_all(fd: int, length: int, offset: int) -> bytes:
    parts = []
    while length > 0:
        data = os.pread(fd, length, offset)
        if not data:
            break
        parts.append(data)
        length -= len(data)
        offset += len(data)
    return b"".join(parts)


# -- the snapshot of the janitor's index ----------------------------------------------------------

# magic, version, journals, entries, body length, crc32 of the body
_SNAP_HEAD = struct.Struct("<8sIIQQI4x")
_SNAP_MAGIC = b"S3GWSNAP"
_SNAP_VERSION = 1
SNAP_ENTRY = struct.Struct("<I32sQB3xQ")  # an Entry: mount, name, size, segment, tick
_SNAP_OFFSET = struct.Struct("<HQ")  # name length, offset; the name follows


class Snapshot(NamedTuple):
    entries: Iterator[Entry]  # in the order Policy.entries() gave them
    journal_offsets: dict[str, int]


def write_snapshot(root: str, entries: Iterable[Entry], journal_offsets: Mapping[str, int]) -> int:
    """Replace <root>/index.snap atomically and durably. Returns the entries written."""
    body = bytearray()
    pack = SNAP_ENTRY.pack
    count = 0
    for entry in entries:
        body += pack(*entry)
        count += 1
    for name, offset in journal_offsets.items():
        raw = name.encode()
        body += _SNAP_OFFSET.pack(len(raw), offset) + raw
    head = _SNAP_HEAD.pack(
        _SNAP_MAGIC, _SNAP_VERSION, len(journal_offsets), count, len(body), zlib.crc32(body)
    )
    path = os.path.join(root, SNAPSHOT)
    tmp = f"{root}/.{SNAPSHOT}.{secrets.token_hex(6)}.tmp"
    try:
        with open(tmp, "xb") as f:
            f.write(head)
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    # The rename must be durable before the journals it covers are deleted.
    dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return count


def load_snapshot(root: str) -> Snapshot | None:
    """The snapshot, or None when there is none or it is torn, foreign or of another version."""
    try:
        with open(os.path.join(root, SNAPSHOT), "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    try:
        return _parse(raw)
    except _Unusable as exc:
        log.warning("cache: index snapshot ignored: %s", exc)
        return None


class _Unusable(Exception):
    pass


def _parse(raw: bytes) -> Snapshot:
    if len(raw) < _SNAP_HEAD.size:
        raise _Unusable("shorter than its header")
    magic, version, journals, count, length, crc = _SNAP_HEAD.unpack_from(raw)
    if magic != _SNAP_MAGIC or version != _SNAP_VERSION:
        raise _Unusable("not a snapshot of this version")
    body = memoryview(raw)[_SNAP_HEAD.size :]
    if len(body) != length or zlib.crc32(body) != crc:
        raise _Unusable("torn (length or checksum)")
    pos = count * SNAP_ENTRY.size
    offsets: dict[str, int] = {}
    try:
        for _ in range(journals):
            size, offset = _SNAP_OFFSET.unpack_from(body, pos)
            pos += _SNAP_OFFSET.size
            offsets[bytes(body[pos : pos + size]).decode()] = offset
            pos += size
    except (struct.error, UnicodeDecodeError):
        raise _Unusable("its journal offsets do not parse") from None
    if pos != length:
        raise _Unusable("its lengths do not add up")
    return Snapshot(SNAP_ENTRY.iter_unpack(body[: count * SNAP_ENTRY.size]), offsets)
