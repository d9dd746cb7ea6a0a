"""A fill: the single-flight leader's handle that writes one object to a temporary file and
commits it by renaming it into place, so a torn object is never visible under its name."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from gateway.cache import _files
from gateway.cache.keys import CacheEntry, CacheKey, FillAborted, FillSizeError

T = TypeVar("T")

# Writes reach the disk in batches of at least this much: one thread hop per write() would
# cost more than the bytes (a hop is ~50-100 µs on the reference machine).
WRITE_BATCH = 1 << 20


class _State(enum.Enum):
    OPEN = "open"
    COMMITTING = "committing"
    COMMITTED = "committed"
    ABORTED = "aborted"


@dataclass(frozen=True, slots=True)
class FillContext:
    """What a fill needs from its cache, so that this module does not import the cache."""

    loop: asyncio.AbstractEventLoop
    io: Executor
    janitor: Executor  # one thread: renames and removals run in the order they were asked
    fsync: bool
    free_of: str | None  # measure the free bytes of this file system at commit, if set
    keep_max: int  # objects up to this size keep their bytes for the memory tier
    committed: Callable[[Fill, bytes | None, int | None], CacheEntry]
    ended: Callable[[Fill], None]


class Fill:
    """The leader's handle: write() the object's bytes in order, then commit() or abort().

    Used as `async with fill:`, leaving the block without a commit aborts it. Calls on one fill
    must not overlap (one task writes it).
    """

    def __init__(self, key: CacheKey, size: int, tmp: str, dest: str, ctx: FillContext) -> None:
        self.key = key
        self.size = size
        self.error: BaseException | None = None
        # Waiters await this: the committed entry, or None when the fill failed.
        self.done: asyncio.Future[CacheEntry | None] = ctx.loop.create_future()
        self._tmp = tmp
        self._dest = dest
        self._ctx = ctx
        self._keep = size <= ctx.keep_max
        self._buf = bytearray()
        self._received = 0
        self._fd: int | None = None
        # The file call in flight, kept so that cleanup waits for it even after a cancellation.
        self._pending: Future[Any] | None = None
        self._pending_opens = False
        self._state = _State.OPEN
        self._entry: CacheEntry | None = None
        self._commit_task: asyncio.Task[CacheEntry] | None = None

    async def __aenter__(self) -> Fill:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._state is _State.OPEN:
            await self.abort(exc or FillAborted("fill left without a commit"))

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes; raises FillSizeError (and aborts) past the announced size."""
        if self._state is _State.ABORTED:
            raise FillAborted("fill was aborted") from self.error
        if self._state is not _State.OPEN:
            raise RuntimeError(f"write to a fill that is {self._state.value}")
        self._received += len(data)
        if self._received > self.size:
            error = FillSizeError(f"fill of {self.size} bytes received {self._received}")
            await self._abort(error)
            raise error
        self._buf += data
        if not self._keep and len(self._buf) >= WRITE_BATCH:
            await self._flush()

    def name_as(self, key: CacheKey, dest: str) -> None:
        """Give a fill begun without a version (ObjectCache.begin_write) its key before commit."""
        if self._state is _State.OPEN:
            self.key, self._dest = key, dest
        elif self._state is not _State.ABORTED:  # an aborted one fails at commit, as it should
            raise RuntimeError(f"naming a fill that is {self._state.value}")

    async def commit(self) -> CacheEntry:
        """Make the object visible and wake the waiters. A short fill is aborted instead."""
        if self._state is _State.COMMITTED and self._entry is not None:
            return self._entry
        if self._state is _State.ABORTED:
            raise FillAborted("fill was aborted") from self.error
        if self._commit_task is None:
            if self._received != self.size:
                error = FillSizeError(f"fill of {self.size} bytes received {self._received}")
                await self._abort(error)
                raise error
            self._state = _State.COMMITTING
            self._commit_task = asyncio.ensure_future(self._commit())
            self._commit_task.add_done_callback(_retrieve)
        # Shielded: a leader cancelled mid-commit (client gone) must not strand the waiters
        # or half-rename the file; the commit finishes on its own.
        return await asyncio.shield(self._commit_task)

    async def abort(self, exc: BaseException | None = None) -> None:
        """Drop the temporary file and wake the waiters with None. A no-op once committing."""
        if self._state is _State.OPEN:
            await self._abort(exc)

    async def _commit(self) -> CacheEntry:
        data, self._buf = self._buf, bytearray()
        fd, self._fd = self._fd, None  # finish_temp closes it whatever happens
        finished = False
        try:
            io, janitor = self._ctx.io, self._ctx.janitor
            await self._run(False, io, _files.finish_temp, fd, self._tmp, data, self._ctx.fsync)
            finished = True
            free = await self._run(
                False, janitor, _files.install, self._tmp, self._dest, self._ctx.free_of
            )
        except BaseException as exc:
            if not finished and self._pending is not None and self._pending.cancelled():
                self._fd = fd  # finish_temp never ran, so the fd is still ours to close
            await self._abort(exc)
            raise
        entry = self._ctx.committed(self, bytes(data) if self._keep else None, free)
        self._state = _State.COMMITTED
        self._entry = entry
        self.done.set_result(entry)
        return entry

    async def _flush(self) -> None:
        data, self._buf = self._buf, bytearray()
        try:
            if self._fd is None:
                self._fd = await self._run(True, self._ctx.io, _files.create_temp, self._tmp, data)
            else:
                await self._run(False, self._ctx.io, _files.append, self._fd, data)
        except BaseException as exc:
            await self._abort(exc)
            raise

    async def _abort(self, exc: BaseException | None) -> None:
        if self._state in (_State.ABORTED, _State.COMMITTED):
            return
        self._state = _State.ABORTED
        self.error = exc
        self._buf = bytearray()
        self._ctx.ended(self)
        if not self.done.done():
            self.done.set_result(None)
        fd, self._fd = self._fd, None
        pending, self._pending = self._pending, None
        cleanup = self._ctx.io.submit(
            _files.discard_temp, fd, pending, self._pending_opens, self._tmp
        )
        await asyncio.wrap_future(cleanup)

    async def _run(self, opens: bool, executor: Executor, fn: Callable[..., T], *args: Any) -> T:
        future = executor.submit(fn, *args)
        self._pending, self._pending_opens = future, opens
        result: T = await asyncio.wrap_future(future)
        self._pending = None
        return result


def _retrieve(task: asyncio.Task[CacheEntry]) -> None:
    # The commit's error already reached the leader (or it was cancelled and no longer cares);
    # fetching it here keeps asyncio from logging "exception was never retrieved".
    if not task.cancelled():
        task.exception()
