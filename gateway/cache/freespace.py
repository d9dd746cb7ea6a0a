"""The free bytes of the cache's file system: asked of it (`free_bytes`: the janitor's
passes), or, for the commits' floor, from a recent figure (`FreeSpace`)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable


def free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class FreeSpace:
    """The free bytes of the cache's file system for the commits' floor (`below`), without a
    statvfs a commit: a system call on a cache-io thread lets the GIL go and waits to take it
    back from a busy event loop (docs/performance.md). The last statvfs's figure, less what
    this process's commits wrote since, stands for `every` seconds while it is more than
    `near` above the floor; nearer, each commit asks the file system. What the node's other
    processes write in `every` seconds is not seen meanwhile: tens of MB at disk speed, and
    only while a quarter of a GiB above the floor. Shared by the cache-io
    threads: a race between two of them loses a count (an estimate), never a check near the
    floor."""

    def __init__(
        self,
        root: str,
        every: float = 0.05,
        near: int = 256 << 20,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root
        self._every = every
        self._near = near
        self._clock = clock
        self._seen = (-1.0, 0)  # (when, free bytes then, less what was written since)
        self.asked = 0  # statvfs calls (tests)

    def below(self, floor: int, wrote: int) -> bool:
        """Whether the free space is below `floor` now that `wrote` more bytes are written."""
        now = self._clock()
        at, free = self._seen
        free -= wrote
        if now - at < self._every and free - self._near >= floor:
            self._seen = (at, free)
            return False
        self.asked += 1
        free = free_bytes(self.root)
        self._seen = (now, free)
        return free < floor
