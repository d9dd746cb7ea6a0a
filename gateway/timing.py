"""What a request waited for its stores, for its access-log line and /metrics (nginx's
`$upstream_header_time`): the S3 front end gives each request on the full path a `Timing`
(`begin`), and the read path's one way to a store (service/sources.py, `StoreSource`) adds the
time each store read took to its first byte (`store_answered`; an open: to its answer's head).
A task the request starts (a fill, a read-ahead) adds to the same Timing; a request that
joined another's fetch (single flight) made no store read of its own, so none is added to it.
The gateway's own part of a request's time is its line's `ms` less its `store_ms`."""

from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(slots=True)
class Timing:
    store_seconds: float = 0.0  # the request's store reads, each to its first byte, summed
    store_reads: int = 0


_CURRENT: ContextVar[Timing | None] = ContextVar("gateway_timing", default=None)


def begin() -> Timing:
    """A Timing for the request this task runs (and the tasks it starts). Both servers run
    each request in a task of its own, so nothing of it reaches another request."""
    timing = Timing()
    _CURRENT.set(timing)
    return timing


def store_answered(started: float) -> float:
    """A store read begun at `started` (time.perf_counter) has its first byte: the seconds it
    took, added to the Timing of the request it serves, if any."""
    waited = time.perf_counter() - started
    timing = _CURRENT.get()
    if timing is not None:
        timing.store_seconds += waited
        timing.store_reads += 1
    return waited
