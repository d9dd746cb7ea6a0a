"""A token bucket for a job's bytes per second on one node (its share of the fleet's limit)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


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
