"""A job's bytes per second on one node (its share of the fleet's limit): a token bucket of
one process, or the node's, shared by its worker processes (NodeBucket)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import struct
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Protocol

log = logging.getLogger(__name__)


class TokenBucket:
    """`rate` bytes a second, with up to `burst` bytes saved up. A take larger than what is
    saved goes into debt, and the taker waits until the debt is paid: a 4 MiB block under a
    1 MiB/s limit waits 4 s, whatever the burst. Takers wait in turn (FIFO)."""

    def __init__(
        self,
        rate: float,
        burst: float | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self._clock = clock
        self._sleep = sleep
        self.rate = float(rate)
        self.burst = float(burst if burst is not None else rate / 10)
        self._tokens = self.burst
        self._at = clock()
        self._lock = asyncio.Lock()

    def set_rate(self, rate: float) -> None:
        """A new rate (the fleet's limit over a new count of nodes), from now on."""
        if rate <= 0:
            raise ValueError("rate must be positive")
        self._refill()
        self.rate = float(rate)

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now

    async def take(self, amount: int) -> None:
        async with self._lock:
            self._refill()
            self._tokens -= amount
            if self._tokens < 0:
                await self._sleep(-self._tokens / self.rate)

    def close(self) -> None:
        """Nothing to let go (as NodeBucket's)."""


class Bucket(Protocol):
    """What a job's loads take their bytes from: TokenBucket (this process's) or NodeBucket
    (the node's, shared by its worker processes)."""

    rate: float

    def set_rate(self, rate: float) -> None: ...

    async def take(self, amount: int) -> None: ...

    def close(self) -> None: ...


FOLDER = "job-bandwidth"  # under the cache folder: a file a job, its node's bucket
_STATE = struct.Struct("<d16s")  # when the bucket is next full (its clock), the clock's boot


class NodeBucket:
    """A job's `rate` bytes a second on this node, shared by the node's worker processes: a
    worker that loads alone moves at the node's rate, two at once each at about half of it.
    One small file a job (`path`) holds the moment its bucket is full again (GCRA: a take of
    n bytes moves it on by n / rate from now or from itself, whichever is later, and its taker
    waits until it is within `burst` bytes' time of now), changed under an flock. The same
    semantics as TokenBucket: up to `burst` saved, a large take in debt, waited out. The lock
    is tried without waiting on the event loop (four system calls, held for a few
    microseconds); if a sibling holds it, on a thread.

    The clock must be one that every process of the host reads alike (time.monotonic:
    CLOCK_MONOTONIC). It starts again at a reboot: a state written under another boot (the
    kernel's boot id) is read as a full bucket. Where the file cannot be used (the disk's
    trouble), this process goes on with a bucket of its own at `alone` of the rate."""

    def __init__(
        self,
        path: str,
        rate: float,
        burst: float | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        boot: bytes | None = None,
        alone: float = 1.0,
    ) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.path = path
        self.rate = float(rate)
        self.burst = float(burst if burst is not None else rate / 10)
        self._clock = clock
        self._sleep = sleep
        self._boot = (boot if boot is not None else _boot_id())[:16].ljust(16, b"\0")
        self._fd: int | None = None
        self._alone = alone
        self._own: TokenBucket | None = None  # once the file failed, or was let go
        self._opening = asyncio.Lock()

    def set_rate(self, rate: float) -> None:
        """A new rate (the fleet's limit over a new count of nodes), from now on."""
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = float(rate)
        if self._own is not None:
            self._own.set_rate(rate * self._alone)

    async def take(self, amount: int) -> None:
        try:
            if self._fd is None and self._own is None:
                async with self._opening:
                    if self._fd is None and self._own is None:
                        self._fd = await asyncio.to_thread(_open, self.path)
                        if self._own is not None:  # let go meanwhile
                            self.close()
            if self._own is None:
                wait = self._reserve(amount, block=False)
                if wait is None:  # a sibling holds the lock this moment
                    wait = await asyncio.to_thread(self._reserve_waiting, amount)
                if wait > 0:
                    await self._sleep(wait)
                return
        except OSError as exc:
            log.warning("jobs: the node's bandwidth file %s failed (%s): this worker "
                        "limits its own part", self.path, exc)  # fmt: skip
            self.close()
        assert self._own is not None
        await self._own.take(amount)

    def _reserve(self, amount: int, block: bool) -> float | None:
        """Move the bucket's full-again moment on by `amount`; how long its taker waits (None:
        the lock was busy and `block` is false)."""
        fd = self._fd
        if fd is None:  # let go meanwhile
            raise OSError("the job's bucket was let go")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if block else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        try:
            now = self._clock()
            raw = os.pread(fd, _STATE.size, 0)
            full = now
            if len(raw) == _STATE.size:
                at, boot = _STATE.unpack(raw)
                if boot == self._boot and at > now:
                    full = at
            full += amount / self.rate
            os.pwrite(fd, _STATE.pack(full, self._boot), 0)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        return full - now - self.burst / self.rate

    def _reserve_waiting(self, amount: int) -> float:
        wait = self._reserve(amount, block=True)
        assert wait is not None
        return wait

    def close(self) -> None:
        """Let the file go (the job ended here); a take after it, by a load still under way,
        is this process's own bucket's."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        if self._own is None:
            self._own = TokenBucket(self.rate * self._alone, self.burst * self._alone,
                                    clock=self._clock, sleep=self._sleep)  # fmt: skip


def _open(path: str) -> int:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def _boot_id() -> bytes:
    """This boot's id (Linux), or nothing (a clock that never starts again is assumed)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return uuid.UUID(f.read().strip().decode()).bytes
    except (OSError, ValueError):
        return b""
