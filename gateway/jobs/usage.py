"""Bytes each job's blocks take in this node's cache, shared by the node's worker processes:
a job's budget (the cache's capacity, or its mount's quota) is the node's, whichever worker
loads a batch. One small file per job under the cache dir, read and changed under a lock."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator

FOLDER = "job-usage"
_WIDTH = 20  # digits of a count: past any disk


class NodeUsage:
    """`reserve`, `add`, `get` of a job's bytes on this node; the file of a job this node has
    not counted yet is made with what the database says it loaded (`start`)."""

    def __init__(self, cache_root: str) -> None:
        self._folder = os.path.join(cache_root, FOLDER)

    async def start(self, job_id: int, loaded: int) -> None:
        """The job's count begins at `loaded` unless a worker of this node counts it already."""
        await asyncio.to_thread(self._start, job_id, loaded)

    async def reserve(self, job_id: int, size: int, budget: int) -> bool:
        """Count `size` more bytes for the job if they fit its budget; whether they did."""
        return await asyncio.to_thread(self._change, job_id, size, budget)

    async def add(self, job_id: int, size: int) -> None:
        """Count `size` more bytes (less, if negative) for the job, whatever its budget."""
        await asyncio.to_thread(self._change, job_id, size, None)

    async def get(self, job_id: int) -> int:
        return await asyncio.to_thread(self._get, job_id)

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

    def _change(self, job_id: int, size: int, budget: int | None) -> bool:
        with self._locked(job_id) as (used, write):
            if budget is not None and used + size > budget:
                return False
            write(max(0, used + size))
            return True

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
