"""Backoff between the attempts of one call to a store's server, for the wire clients that
retry by themselves (GCS, Azure, WebHDFS), on a clock that tests can replace."""

from __future__ import annotations

import random
import time
from typing import Protocol

import anyio


class Clock(Protocol):
    """Where a backoff reads the time and waits."""

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real one: time.monotonic and anyio.sleep."""

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


SYSTEM_CLOCK = SystemClock()


class Backoff:
    """The pauses between the attempts of one call: exponential with full jitter (a random
    pause up to a cap that doubles with each attempt from `base`), within a number of
    attempts and a deadline that starts now.

    A pause that would end past the deadline is not taken: the call gives up instead, or,
    with `trim`, the pause is cut to end at the deadline, for one last attempt there.
    """

    def __init__(
        self,
        attempts: int,
        deadline: float,
        *,
        base: float,
        cap: float,
        trim: bool = False,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.clock = clock
        self._left = attempts - 1  # the first attempt needs no pause
        self._until = clock.monotonic() + deadline
        self._base, self._cap, self._trim = base, cap, trim
        self._step = 0

    def remaining(self) -> float:
        """Seconds until the deadline (negative once it has passed)."""
        return self._until - self.clock.monotonic()

    def next_pause(self) -> float | None:
        """The pause before the next attempt, None when no attempt is left."""
        if self._left <= 0:
            return None
        pause = random.uniform(0, min(self._cap, self._base * 2**self._step))
        left = self.remaining()
        if self._trim:
            if left <= 0:
                return None
            pause = min(pause, left)
        elif pause >= left:
            return None
        self._left -= 1
        self._step += 1
        return pause

    async def pause(self) -> bool:
        """Wait before the next attempt; False (at once) when none is left."""
        pause = self.next_pause()
        if pause is None:
            return False
        await self.clock.sleep(pause)
        return True
