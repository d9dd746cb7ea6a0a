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
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import zlib
from collections.abc import Iterator

SLOTS = 1 << 16  # 512 KiB of counters: a change marks 1/65,536 of the keys as to be checked
FILE = "generations"
_SIZE = SLOTS * 8


class Generations:
    """The node's change counters (see the module's docstring); one per worker process."""

    def __init__(self, root: str) -> None:
        path = os.path.join(root, FILE)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        if os.fstat(self._fd).st_size < _SIZE:
            # Grown, never cut: a counter that went back could equal a value remembered.
            with self._locked():
                if os.fstat(self._fd).st_size < _SIZE:
                    os.ftruncate(self._fd, _SIZE)
        self._map = mmap.mmap(self._fd, _SIZE, mmap.MAP_SHARED)
        self._slots = memoryview(self._map).cast("Q")

    @staticmethod
    def slot(mount_id: int, key: str) -> int:
        return zlib.crc32(key.encode("utf-8", "surrogatepass"), mount_id) % SLOTS

    def current(self, slot: int) -> int:
        return self._slots[slot]

    def bump(self, slot: int) -> None:
        """Tell every worker of the node that a key of this slot changed."""
        with self._locked():
            self._slots[slot] = (self._slots[slot] + 1) & 0xFFFF_FFFF_FFFF_FFFF

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
