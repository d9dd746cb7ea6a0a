"""Which keys the node's cache surely holds no record of, answered without SQLite: a Bloom
filter of the key names in keys.db (keyrecords.py), in a file of the cache folder that every
worker maps, `keys.filter`.

Every cold miss asks keys.db whether its key is recorded; in a node whose workers commit
fills, the file changes between two asks, and SQLite reads its pages again: ~50 us of the
event loop's CPU a miss, and ~150 us of its time waiting for the GIL after it (missprofile,
docs/performance.md). Almost every such key has no record. The filter says so in a few
microseconds: bits set for a key name that is recorded can only be all set; a key whose bits
are not is not in keys.db, and SQLite is asked only for the rest.

- A process sets a key's bits before it writes its record (`add`, on the commit's thread,
  under an flock of the file so that two processes setting bits of one byte lose none), so
  a sibling that finds the record in keys.db afterwards would have found the bits first.
- A process trusts the filter only once it has added every key that keys.db held when it
  opened it (`cover`, a thread's scan at open): the records made before it, by a process gone
  since, are in the filter then; those made after, by their writers.
- Bits are never cleared: a key whose record was dropped keeps them, and is asked of SQLite
  as before (a false positive). At 2^27 bits and seven bits a key, ~1 % of unrecorded keys
  go to SQLite at 13 million records, ~5 % at 20 million; the answer stays right at any count.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os

FILE = "keys.filter"
BITS = 1 << 27  # 16 MiB: a sparse file, its pages made as bits are set
_MASK = BITS - 1
_PROBES = 7  # bits a key, from the first 28 bytes of its name (a SHA-256: evenly spread)


class KeyFilter:
    """The filter of the cache folder at `root`, mapped (see the module's docstring)."""

    def __init__(self, root: str) -> None:
        self.path = os.path.join(root, FILE)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            if os.fstat(self._fd).st_size < BITS // 8:
                os.ftruncate(self._fd, BITS // 8)  # two processes at once: the same size
            self._map = mmap.mmap(self._fd, BITS // 8, mmap.MAP_SHARED)
        except BaseException:
            os.close(self._fd)
            raise
        self.covered = False  # every record keys.db held at open is in (cover)

    def may_hold(self, digest: bytes) -> bool:
        """False when the key of this name (its 32 bytes) surely has no record; True when it
        may (or the filter does not cover keys.db yet)."""
        if not self.covered:
            return True
        bits = self._map
        try:
            for i in range(0, 4 * _PROBES, 4):
                at = int.from_bytes(digest[i : i + 4], "big") & _MASK
                if not bits[at >> 3] & (1 << (at & 7)):
                    return False
        except ValueError:  # closed meanwhile (the node stops)
            pass
        return True

    def add(self, digests: list[bytes]) -> None:
        """Set the bits of these key names. Blocking: a thread's."""
        bits = self._map
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            for digest in digests:
                for i in range(0, 4 * _PROBES, 4):
                    at = int.from_bytes(digest[i : i + 4], "big") & _MASK
                    bits[at >> 3] |= 1 << (at & 7)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        self.covered = False
        with contextlib.suppress(BufferError, ValueError):
            self._map.close()
        with contextlib.suppress(OSError):
            os.close(self._fd)
