"""Block files kept open for the zero-copy sends of hot blocks that are in the memory tier too:
a hit of such a block goes out from the page cache (sendfile) with no open, fstat or seal
probe of its own (each a system call of 1.5-2.5 us on this VM: docs/performance.md, "Hot
blocks sent from their files"). The page store decides when a kept file may be sent
(PageStore.hot_region); this module only keeps the descriptors.

A kept descriptor holds its file: a block file evicted meanwhile is unlinked rather than
recycled as a spare (a spare is taken only when no process has it open, spare.py), so its
bytes cannot change under a send; its space comes back when the descriptor is closed, which
is at the latest when its block's check falls due (`zero_copy_recheck`, sealed or not: the
file is then opened again by its name) or when MAX_KEPT others are kept after it.
"""

from __future__ import annotations

import os
from collections import OrderedDict

# The smallest block sent from its file rather than copied from the memory tier. Measured end to
# end (loadtest.hitprofile, 64 connections, alternated with the copy): the file costs more CPU a
# hit at 32-100 KiB, the same at 128-192 KiB, 10-30 % less at 256 KiB (docs/performance.md,
# "Hot blocks sent from their files"): on loopback the copy saved is a few us, and the send
# takes four more system calls (dup, cachestat, the head's send, close) at 1-2.5 us each here.
HOT_FILE_MIN = 192 << 10
MAX_KEPT = 256  # descriptors per process: at most 256 x memory_object_max of files held


class Kept:
    """One open block file: its descriptor, whether it is sealed (fs-verity), and the
    monotonic time until which it may be sent without being opened and checked again."""

    __slots__ = ("fd", "sealed", "until")

    def __init__(self, fd: int, sealed: bool, until: float) -> None:
        self.fd = fd
        self.sealed = sealed
        self.until = until


class HotFiles:
    """Open block files by block name, the least recently used closed past MAX_KEPT."""

    def __init__(self, limit: int = MAX_KEPT) -> None:
        self._limit = limit
        self._files: OrderedDict[str, Kept] = OrderedDict()

    def __len__(self) -> int:
        return len(self._files)

    def get(self, name: str) -> Kept | None:
        kept = self._files.get(name)
        if kept is not None:
            self._files.move_to_end(name)
        return kept

    def keep(self, name: str, fd: int, sealed: bool, until: float) -> Kept:
        """Keep `fd` (now owned here) as the file of block `name` until `until`."""
        self.drop(name)
        kept = self._files[name] = Kept(fd, sealed, until)
        while len(self._files) > self._limit:
            _, old = self._files.popitem(last=False)
            os.close(old.fd)
        return kept

    def drop(self, name: str) -> None:
        """Close the file kept for `name`, if any (a send under way holds a duplicate)."""
        kept = self._files.pop(name, None)
        if kept is not None:
            os.close(kept.fd)

    def clear(self) -> None:
        for kept in self._files.values():
            os.close(kept.fd)
        self._files.clear()
