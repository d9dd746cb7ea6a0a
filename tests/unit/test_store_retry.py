"""The stores' backoff between attempts (gateway/stores/retry.py), on a clock that only moves
when it is told to wait: the attempts, the growing caps, and the deadline, with and without
the last pause cut short to land on it."""

from __future__ import annotations

import asyncio

import pytest

from gateway.stores.retry import Backoff
from tests.support.stores import FakeClock


def _pauses(backoff: Backoff) -> list[float]:
    async def run() -> list[float]:
        while await backoff.pause():
            pass
        assert isinstance(backoff.clock, FakeClock)
        return backoff.clock.pauses

    return asyncio.run(run())


def test_attempts_bound_the_pauses_and_each_stays_under_its_doubling_cap() -> None:
    pauses = _pauses(Backoff(5, 1000.0, base=0.1, cap=1.0, clock=FakeClock()))
    assert len(pauses) == 4  # five attempts: four pauses between them
    for step, pause in enumerate(pauses):
        assert 0 <= pause <= min(1.0, 0.1 * 2**step)


def test_a_pause_past_the_deadline_is_not_taken() -> None:
    clock = FakeClock()
    pauses = _pauses(Backoff(1000, 2.0, base=0.5, cap=0.5, clock=clock))
    assert clock.now < 2.0  # never waited past the deadline
    assert all(p <= 0.5 for p in pauses)


def test_trim_cuts_the_last_pause_to_end_on_the_deadline() -> None:
    clock = FakeClock()
    _pauses(Backoff(1000, 2.0, base=5.0, cap=5.0, trim=True, clock=clock))
    assert clock.now == pytest.approx(2.0)  # the last attempt lands on the deadline
