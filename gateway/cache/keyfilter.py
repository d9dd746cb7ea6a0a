"""Which keys the node's cache surely holds no record of, answered without SQLite: a Bloom
filter of the key names in keys.db (keyrecords.py), in a file of the cache folder that every
worker maps, `keys.bloom`.

Every cold miss asks keys.db whether its key is recorded; in a node whose workers commit
fills, the file changes between two asks, and SQLite reads its pages again: ~50 us of the
event loop's CPU a miss, and ~150 us of its time waiting for the GIL after it (missprofile,
docs/performance.md). Almost every such key has no record. The filter says so in a few
microseconds: bits set for a key name that is recorded can only be all set; a key whose bits
are not is not in keys.db, and SQLite is asked only for the rest.

- A process sets a key's bits before it writes its record (`add`, on the commit's thread,
  under an flock of the file so that two processes setting bits of one block lose none), so
  a sibling that finds the record in keys.db afterwards would have found the bits first.
- A process trusts the filter only once it has added every key that keys.db held when it
  opened it (`cover`, a thread's scan at open): the records made before it, by a process gone
  since, are in the filter then; those made after, by their writers.
- The file is written whole when it is made, and bits are set with pwrite: a store
  into a mapped page the file system cannot back (a hole, on a full disk) is a SIGBUS, which
  ends the process (test_cache_faults' full disk found it); a write it refuses is an error,
  and a filter that cannot be made leaves every find to keys.db.
- A key's bits all lie in one 64-byte block of the file (a blocked Bloom filter), so that
  setting them is one pwrite, not one a bit: `add` runs on a cache-io thread, in each fill's
  commit, and each system call there lets the GIL go and waits to take it back from a busy
  event loop (~20-55 us of the thread's CPU a call, up to the 5 ms switch interval of its
  time: loadtest/gilcost.py). The false positives grow a little for it (1.0 % against 0.8 %
  at 10 bits a key, 200,000 keys asked), and a key's add costs 4.9 us alone, not 16.
  `keys.filter`, the file of the layout before (a key's bits spread over the whole file), is
  removed: the filter is made anew and covered from keys.db.
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

FILE = "keys.bloom"
_OLD = "keys.filter"  # a key's bits over the whole file: removed when met
_MOST = 16 << 20  # bytes of the file: 2^27 bits
_LEAST = 64 << 10
_PER = 1024  # a byte of filter per this many bytes of cache (8 bits a 1 KiB object)
_BLOCK = 64  # bytes: a key's bits all lie in one block (a cache line)
_PROBES = 7  # bits a key
# Of a key's name (a SHA-256: evenly spread): bytes 0-3 its block, then seven 9-bit offsets
# within it from bytes 4-11.


class KeyFilter:
    """The filter of the cache folder at `root`, mapped (see the module's docstring)."""

    def __init__(self, root: str, capacity: int | None) -> None:
        self.path = os.path.join(root, FILE)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(root, _OLD))
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)  # one maker; no bits set while it makes
            try:
                size = _make(self._fd, _size_for(root, capacity))
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            self._blocks = size // _BLOCK - 1  # a mask: the size is a power of two
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
        base, offsets = self._place(digest)
        bits = self._map
        try:
            for at in offsets:
                if not bits[base + (at >> 3)] & (1 << (at & 7)):
                    return False
        except ValueError:  # closed meanwhile (the node stops)
            pass
        return True

    def _place(self, digest: bytes) -> tuple[int, list[int]]:
        """The byte where the key's block begins, and its bits' offsets within the block."""
        base = (int.from_bytes(digest[:4], "big") & self._blocks) * _BLOCK
        word = int.from_bytes(digest[4:12], "big")
        return base, [(word >> (9 * i)) & 511 for i in range(_PROBES)]

    def add(self, digests: list[bytes]) -> None:
        """Set the bits of these key names. Written with pwrite, not through the map: a write
        the file system refuses is an error here, where a store into a map is a SIGBUS that
        ends the process. Blocking: a thread's."""
        bits = self._map
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            for digest in digests:
                base, offsets = self._place(digest)
                block = bytearray(bits[base : base + _BLOCK])
                for at in offsets:
                    block[at >> 3] |= 1 << (at & 7)
                if block != bits[base : base + _BLOCK]:
                    os.pwrite(self._fd, block, base)
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
