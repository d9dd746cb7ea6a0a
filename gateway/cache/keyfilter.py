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
- The file is written whole when it is made, and bits are set with pwrite: a store
  into a mapped page the file system cannot back (a hole, on a full disk) is a SIGBUS, which
  ends the process (test_cache_faults' full disk found it); a write it refuses is an error,
  and a filter that cannot be made leaves every find to keys.db.
- Bits are never cleared: a key whose record was dropped keeps them, and is asked of SQLite
  as before (a false positive); the answer stays right at any count.
- Its size: a byte per KiB of the cache's capacity (or of its file system, if smaller), a
  power of two from 64 KiB to 16 MiB (2^27 bits, where ~1 % of unrecorded keys go to SQLite
  at 13 million records). The first process makes it; the others map it at its size.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os

FILE = "keys.filter"
_MOST = 16 << 20  # bytes of the file: 2^27 bits
_LEAST = 64 << 10
_PER = 1024  # a byte of filter per this many bytes of cache (8 bits a 1 KiB object)
_PROBES = 7  # bits a key, from the first 28 bytes of its name (a SHA-256: evenly spread)


class KeyFilter:
    """The filter of the cache folder at `root`, mapped (see the module's docstring)."""

    def __init__(self, root: str, capacity: int | None) -> None:
        self.path = os.path.join(root, FILE)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)  # one maker; no bits set while it makes
            try:
                size = _make(self._fd, _size_for(root, capacity))
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            self._mask = size * 8 - 1
            self._map = mmap.mmap(self._fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
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
                at = int.from_bytes(digest[i : i + 4], "big") & self._mask
                if not bits[at >> 3] & (1 << (at & 7)):
                    return False
        except ValueError:  # closed meanwhile (the node stops)
            pass
        return True

    def add(self, digests: list[bytes]) -> None:
        """Set the bits of these key names. Written with pwrite, not through the map: a write
        the file system refuses is an error here, where a store into a map is a SIGBUS that
        ends the process. Blocking: a thread's."""
        bits = self._map
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            for digest in digests:
                for i in range(0, 4 * _PROBES, 4):
                    at = int.from_bytes(digest[i : i + 4], "big") & self._mask
                    byte, bit = at >> 3, 1 << (at & 7)
                    old = bits[byte]
                    if not old & bit:
                        os.pwrite(self._fd, bytes((old | bit,)), byte)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        self.covered = False
        with contextlib.suppress(BufferError, ValueError):
            self._map.close()
        with contextlib.suppress(OSError):
            os.close(self._fd)


def _size_for(root: str, capacity: int | None) -> int:
    """The file's size for a cache of `capacity` bytes on the file system at `root` (the less
    of the two; None: the file system's): a power of two between _LEAST and _MOST."""
    st = os.statvfs(root)
    disk = st.f_blocks * st.f_frsize
    wanted = (disk if capacity is None else min(capacity, disk)) // _PER
    size = _LEAST
    while size * 2 <= min(wanted, _MOST):
        size *= 2
    return size


def _make(fd: int, size: int) -> int:
    """Write the file's zeros up to `size`, from where a maker that died stopped (a file
    shorter than its maker's size was never used: no bit is set in it); the size in use: a
    file made whole before is kept at its size, whatever this process would make."""
    done = os.fstat(fd).st_size
    if done >= _LEAST and done & (done - 1) == 0:
        return done  # made whole (a maker writes a power of two, in pieces of 1 MiB at most)
    zeros = bytes(1 << 20)
    while done < size:
        done += os.pwrite(fd, zeros[: size - done], done)
    return size
