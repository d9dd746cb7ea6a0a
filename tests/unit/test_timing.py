"""gateway/timing.py: a request's store time reaches its own Timing, from the tasks it starts
too (a fill), and never another request's (each runs in a task of its own)."""

from __future__ import annotations

import asyncio
import time

from gateway import timing


def test_store_reads_add_to_the_request_that_made_them_and_to_no_other() -> None:
    async def request(reads: int) -> timing.Timing:
        waits = timing.begin()
        for _ in range(reads):
            # A fill the request starts runs in a task of its own, with the request's Timing.
            await asyncio.create_task(_read())
        return waits

    async def _read() -> None:
        timing.store_answered(time.perf_counter() - 0.002)

    async def main() -> tuple[timing.Timing, timing.Timing, float]:
        one, none = await asyncio.gather(request(2), request(0))
        return one, none, timing.store_answered(time.perf_counter())  # outside any request

    one, none, outside = asyncio.run(main())
    assert one.store_reads == 2 and one.store_seconds >= 0.004
    assert none.store_reads == 0 and none.store_seconds == 0.0
    assert outside >= 0.0
