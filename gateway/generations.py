"""How the worker processes of one node tell each other that a key changed.

Each worker keeps the object metadata it has learnt (and the memory tier keeps blocks by
version); a write through one worker would leave its siblings serving the old version until
their `metadata_ttl` ran out, which S3's read-after-write consistency does not allow. So the
workers share a table of change counters in one file in the cache folder, mapped into every
worker: a key hashes to a slot, a write (or any word that a key changed) adds one to its slot
under an exclusive flock, and a worker trusts what it remembers of a key only while the key's
slot holds the value it held when the worker asked. Reading a slot is one aligned 8-byte load
from shared memory (no lock, no system call): what a cache hit pays. A change of another key
in the same slot costs a lookup, never a wrong answer.

Past the keys' slots the same file holds the node's *state* counter: mounts and buckets, their
owners and policies, users, keys and the catalog's sync state. Whoever changes any of them in
the database (a worker answering CreateBucket or PutBucketPolicy, the console, the CLI on the
node's host) adds one to it once the change is committed, before the change is acknowledged;
each worker compares it with the value its last re-read began at, a load per request, and
re-reads before answering a request when it moved (service/namespace.py).

Beside it, `OpenClaims` makes the opening of a key (one store request for its version and its
first block) single-flight across the workers: a byte-range lock per key in one lock file.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import zlib
from collections.abc import Iterator
from typing import Protocol

SLOTS = 1 << 16  # 512 KiB of counters: a change marks 1/65,536 of the keys as to be checked
FILE = "generations"
_STATE = SLOTS  # the node's state counter, just past the keys' slots
_SIZE = (SLOTS + 512) * 8  # a page more, for counters to come
OPEN_LOCKS = "opening.lock"


def key_slot(mount_id: int, key: str) -> int:
    """The slot of a key's change counter."""
    return zlib.crc32(key.encode("utf-8", "surrogatepass"), mount_id) % SLOTS


class Counters(Protocol):
    """Change counters of keys, by slot (`Generations`, shared by a node's workers)."""

    @staticmethod
    def slot(mount_id: int, key: str) -> int: ...

    def current(self, slot: int) -> int: ...

    def bump(self, slot: int) -> int: ...


class Generations:
    """The node's change counters (see the module's docstring); one per worker process."""

    def __init__(self, root: str, create: bool = True) -> None:
        path = os.path.join(root, FILE)
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        self._fd = os.open(path, flags, 0o600)
        if os.fstat(self._fd).st_size < _SIZE:
            # Grown, never cut: a counter that went back could equal a value remembered. Its
            # blocks are allocated now: a store into a hole of a shared mapping on a full disk
            # is a SIGBUS, which would kill the worker.
            with self._locked():
                if os.fstat(self._fd).st_size < _SIZE:
                    os.posix_fallocate(self._fd, 0, _SIZE)
        self._map = mmap.mmap(self._fd, _SIZE, mmap.MAP_SHARED)
        self._slots = memoryview(self._map).cast("Q")

    @staticmethod
    def slot(mount_id: int, key: str) -> int:
        return key_slot(mount_id, key)

    def current(self, slot: int) -> int:
        return self._slots[slot]

    def bump(self, slot: int) -> int:
        """Tell every worker of the node that a key of this slot changed; the slot's value
        after this change."""
        with self._locked():
            value = self._slots[slot] = (self._slots[slot] + 1) & 0xFFFF_FFFF_FFFF_FFFF
        return value

    @classmethod
    def existing(cls, root: str) -> Generations | None:
        """The counters of a node that has run over `root`, or None (no node there: nothing
        to tell, and nothing is made)."""
        try:
            return cls(root, create=False)
        except FileNotFoundError:
            return None

    def state(self) -> int:
        """The node's state counter (see the module's docstring): one load."""
        return self._slots[_STATE]

    def bump_state(self) -> None:
        """Tell every worker of the node that mounts, tenants or keys changed in the database."""
        self.bump(_STATE)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        self._slots.release()
        self._map.close()
        os.close(self._fd)


class OpenClaims:
    """Which worker of the node opens a key: a POSIX byte-range lock on one byte of a lock file
    per key (by a 32-bit hash, so two keys share a byte once in four billion), taken without
    waiting. The kernel drops a dead worker's locks; a worker's own claims are counted here,
    since POSIX locks of one process do not exclude each other (its requests for one key are
    single-flight in the Reader already)."""

    def __init__(self, root: str) -> None:
        path = os.path.join(root, OPEN_LOCKS)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._held: dict[int, int] = {}

    @staticmethod
    def byte(mount_id: int, key: str) -> int:
        return zlib.crc32(key.encode("utf-8", "surrogatepass"), mount_id ^ 0x5BD1E995)

    def take(self, byte: int) -> bool:
        """Claim the key's byte; False while another worker holds it."""
        held = self._held.get(byte)
        if held is None:
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, byte)
            except (BlockingIOError, PermissionError):
                return False
        self._held[byte] = (held or 0) + 1
        return True

    def free(self, byte: int) -> bool:
        """Whether no other worker holds the key's byte now (taken and let go at once)."""
        if byte in self._held:
            return True
        if not self.take(byte):
            return False
        self.drop(byte)
        return True

    def drop(self, byte: int) -> None:
        held = self._held.pop(byte)
        if held > 1:
            self._held[byte] = held - 1
        else:
            fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, byte)

    def close(self) -> None:
        os.close(self._fd)
