"""Bytes each job's blocks take in this node's cache, shared by the node's worker processes:
a job's budget (the cache's capacity, or its mount's quota) is the node's, whichever worker
loads a batch. One small file per job under the cache dir, read and changed under a lock.

A worker takes bytes from the file in leases (`lease` bytes at a time, at most 1/256 of the
budget) and counts its blocks against its lease in memory: a preload of small objects would
otherwise pay a thread hop and a locked read and write of the file for each of them. What a
worker holds unused is counted in the file until it gives it back (`release`, at the end of
its share of a batch), so the budget is never exceeded; another worker may meanwhile be
refused up to that much early, near the budget. Near the budget a worker takes only what a
block needs: a small cache is counted exactly. A worker killed holding a lease leaves it
counted (at most `lease` bytes of the job's budget, for the job's life)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator

FOLDER = "job-usage"
_WIDTH = 20  # digits of a count: past any disk
LEASE = 32 << 20  # bytes a worker takes from the file at once, budget permitting
_LEASE_SHARE = 256  # a lease is at most this fraction of the budget


class NodeUsage:
    """`reserve`, `add`, `get` of a job's bytes on this node; the file of a job this node has
    not counted yet is made with what the database says it loaded (`start`)."""

    def __init__(self, cache_root: str, lease: int = LEASE) -> None:
        self._folder = os.path.join(cache_root, FOLDER)
        self._lease = lease
        self._held: dict[int, int] = {}  # job id: bytes counted in the file, unused here

    async def start(self, job_id: int, loaded: int) -> None:
        """The job's count begins at `loaded` unless a worker of this node counts it already."""
        await asyncio.to_thread(self._start, job_id, loaded)

    async def reserve(self, job_id: int, size: int, budget: int) -> bool:
        """Count `size` more bytes for the job if they fit its budget; whether they did."""
        return await self._take(job_id, size, budget, force=False)

    async def add(self, job_id: int, size: int, budget: int | None = None) -> None:
        """Count `size` more bytes (less, if negative) for the job, whatever its budget (by
        which a lease is taken with them, if it fits)."""
        if size < 0:
            self._held[job_id] = self._held.get(job_id, 0) - size  # back into the lease
            return
        await self._take(job_id, size, budget, force=True)

    async def release(self, job_id: int) -> None:
        """Give back to the file what this worker holds of the job's lease."""
        held = self._held.pop(job_id, 0)
        if held:
            await asyncio.to_thread(self._change, job_id, -held, None, 0)

    async def forget(self, job_id: int) -> int | None:
        """The job ended: its file goes; the bytes it counted then (None: there was none)."""
        self._held.pop(job_id, None)
        return await asyncio.to_thread(self._forget, job_id)

    def _forget(self, job_id: int) -> int | None:
        try:
            f = open(self._path(job_id))  # noqa: SIM115 (closed below, after the unlink)
        except FileNotFoundError:
            return None
        with f:
            fcntl.flock(f, fcntl.LOCK_EX)  # a sibling's change ends first
            text = f.read().strip()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(job_id))
        return int(text) if text.isdigit() else 0

    async def get(self, job_id: int) -> int:
        """The job's bytes on this node (without what this worker holds unused)."""
        used = await asyncio.to_thread(self._get, job_id)
        return max(0, used - self._held.get(job_id, 0))

    async def _take(self, job_id: int, size: int, budget: int | None, force: bool) -> bool:
        held = self._held.get(job_id, 0)
        if held >= size:
            self._held[job_id] = held - size
            return True
        # What is held goes into this block now; the rest, and a new lease, from the file.
        self._held[job_id] = 0
        need = size - held
        extra = 0 if budget is None else min(self._lease, budget // _LEASE_SHARE)
        got = None
        try:
            got = await asyncio.to_thread(self._change, job_id, need, budget, extra, force)
        finally:
            if got is None:
                self._held[job_id] = self._held.get(job_id, 0) + held
        if got is None:
            return False
        self._held[job_id] = self._held.get(job_id, 0) + got - need
        return True

    def _path(self, job_id: int) -> str:
        return os.path.join(self._folder, str(job_id))

    def _start(self, job_id: int, loaded: int) -> None:
        os.makedirs(self._folder, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            fd = os.open(self._path(job_id), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                f.write(str(max(0, loaded)).rjust(_WIDTH))

    def _get(self, job_id: int) -> int:
        with self._locked(job_id) as (used, _):
            return used

    def _change(
        self, job_id: int, need: int, budget: int | None, extra: int, force: bool = False
    ) -> int | None:
        """Count `need` bytes (fewer, if negative) and, if that fits the budget too, `extra`
        more; the bytes counted, or None when `need` does not fit (unless `force`)."""
        with self._locked(job_id) as (used, write):
            if budget is not None and used + need + extra <= budget:
                take = need + extra
            elif budget is None or force or used + need <= budget:
                take = need
            else:
                return None
            write(max(0, used + take))
            return take

    @contextlib.contextmanager
    def _locked(self, job_id: int) -> Iterator[tuple[int, Callable[[int], None]]]:
        os.makedirs(self._folder, exist_ok=True)
        fd = os.open(self._path(job_id), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "r+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            text = f.read().strip()
            used = int(text) if text.isdigit() else 0

            def write(value: int) -> None:
                f.seek(0)
                f.write(str(value).rjust(_WIDTH))
                f.flush()

            yield used, write
