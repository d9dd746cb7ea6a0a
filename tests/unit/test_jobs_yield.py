"""Preload yields to a node's clients: while the node's clients have FOREGROUND_BUSY fetches
from the store in flight, no new preload fetch starts beyond the job's floor (half its
concurrency: gateway/jobs/runner.py); the next starts as soon as one of them ends."""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest

from gateway import counters
from gateway.jobs.runner import FOREGROUND_BUSY, JobRunner
from gateway.jobs.usage import NodeUsage

pytestmark = pytest.mark.anyio


class Fills:
    """A process's count of fills in flight, as the service's Loads tells it the runner
    (gateway/service/loads.py), moved by the test; waiters wake when it drops."""

    def __init__(self, fills: int) -> None:
        self.fills_in_flight = fills
        self._ended = asyncio.Event()

    async def any_fill_ended(self) -> None:
        await self._ended.wait()
        self._ended.clear()

    def end_one(self) -> None:
        self.fills_in_flight -= 1
        self._ended.set()


async def test_preload_waits_while_clients_fetch_and_goes_on_when_one_ends() -> None:
    fills = Fills(FOREGROUND_BUSY + 1)  # one of them the job's own
    runner = SimpleNamespace(loads=fills, own_fills=1, stopping=False)
    yields = counters.JOB_YIELDS._value.get()
    waiting = asyncio.create_task(JobRunner.yield_to_clients(runner))  # type: ignore[arg-type]
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiting.done()
    assert counters.JOB_YIELDS._value.get() == yields + 1
    fills.end_one()  # a client's fetch ends: fewer than FOREGROUND_BUSY of theirs
    await asyncio.wait_for(waiting, 5)


async def test_preload_does_not_wait_for_its_own_fetches() -> None:
    fills = Fills(FOREGROUND_BUSY + 3)
    runner = SimpleNamespace(loads=fills, own_fills=4, stopping=False)
    await asyncio.wait_for(JobRunner.yield_to_clients(runner), 5)  # type: ignore[arg-type]


async def test_preload_keeps_its_floor_while_clients_fetch() -> None:
    """A store far away is bound by its round trip: a preload that stopped whenever clients
    were busy warmed nothing ahead of an epoch. Below its floor it goes on beside them."""
    fills = Fills(FOREGROUND_BUSY + 10 + 2)  # clients' fetches, and 2 of the job's own
    runner = SimpleNamespace(loads=fills, own_fills=2, stopping=False)
    await asyncio.wait_for(JobRunner.yield_to_clients(runner, 3), 5)  # type: ignore[arg-type]
    runner.own_fills = 3  # at its floor: it waits for a fetch to end
    waiting = asyncio.create_task(JobRunner.yield_to_clients(runner, 3))  # type: ignore[arg-type]
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiting.done()
    runner.own_fills = 2
    fills.end_one()  # one of the job's own ended
    await asyncio.wait_for(waiting, 5)


class _Ended:
    """A job store whose job has ended by the time a runner looks at it again."""

    async def get(self, job_id: int) -> SimpleNamespace:
        return SimpleNamespace(id=job_id, state="done")


class _Loads:
    def __init__(self, cache_root: str) -> None:
        self.cache_root = cache_root

    async def mount(self, bucket: str) -> object:
        return object()


class _Bucket:
    closed = False

    def close(self) -> None:
        self.closed = True


async def test_a_runner_forgets_what_it_seeded_of_a_job_once_the_job_has_ended(
    tmp_path: Path,
) -> None:
    """The batches a runner seeded, per job, were kept for the node's life: one entry for
    each job it ever worked on. Once the job is seen ended, it is dropped, its bandwidth
    bucket (a file open, jobs with --bandwidth) let go, and its files on the node removed."""
    files = [tmp_path / folder / str(job_id) for folder in ("job-usage", "job-bandwidth")
             for job_id in (7, 8)]  # fmt: skip
    for path in files:
        path.parent.mkdir(exist_ok=True)
        path.write_text("0")
    buckets = {7: _Bucket(), 8: _Bucket()}
    runner = SimpleNamespace(
        loads=_Loads(str(tmp_path)), store=_Ended(), stopping=False, _seeded={7: 12, 8: 3},
        workers=1, _listed=asyncio.Event(), _buckets=dict(buckets), usage=NodeUsage(str(tmp_path)),
    )  # fmt: skip
    runner._claims = partial(JobRunner._claims, runner)
    runner._ended = partial(JobRunner._ended, runner)
    job = SimpleNamespace(id=7, spec=SimpleNamespace(bucket="b", concurrency=4))
    await asyncio.wait_for(JobRunner._work(runner, job), 5)  # type: ignore[arg-type]
    assert runner._seeded == {8: 3}
    assert runner._buckets == {8: buckets[8]} and buckets[7].closed and not buckets[8].closed
    assert [path.exists() for path in files] == [False, True, False, True]
