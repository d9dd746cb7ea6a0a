"""A job's bytes on a node, counted by its workers in leases (gateway/jobs/usage.py): two
NodeUsage over one cache folder are two worker processes of a node."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.jobs.usage import NodeUsage

pytestmark = pytest.mark.anyio

MiB = 1 << 20
JOB = 7


def _in_file(root: Path) -> int:
    return int((root / "job-usage" / str(JOB)).read_text())


async def test_blocks_are_counted_against_a_lease_taken_once(tmp_path: Path) -> None:
    usage = NodeUsage(str(tmp_path), lease=MiB)
    await usage.start(JOB, 0)
    budget = 1 << 30
    assert await usage.reserve(JOB, 100_000, budget)
    assert _in_file(tmp_path) == 100_000 + MiB  # the block and a lease, in one change
    for _ in range(10):
        assert await usage.reserve(JOB, 100_000, budget)
    assert _in_file(tmp_path) == 100_000 + MiB  # the next ten from the lease
    assert await usage.get(JOB) == 1_100_000  # what the worker holds unused is not counted
    await usage.add(JOB, -100_000)  # a block not kept: back into the lease
    await usage.release(JOB)
    assert _in_file(tmp_path) == 1_000_000 == await usage.get(JOB)


async def test_the_budget_is_never_exceeded_and_near_it_a_block_takes_what_it_needs(
    tmp_path: Path,
) -> None:
    one, two = NodeUsage(str(tmp_path), lease=MiB), NodeUsage(str(tmp_path), lease=MiB)
    await one.start(JOB, 0)
    budget = 256 * MiB  # a lease is at most 1/256 of the budget: 1 MiB here
    assert await one.reserve(JOB, budget - 3 * MiB, budget)
    assert _in_file(tmp_path) == budget - 2 * MiB  # with its lease
    assert await two.reserve(JOB, MiB // 2, budget)
    assert _in_file(tmp_path) == budget - MiB // 2  # and the other worker's
    assert await two.reserve(JOB, MiB, budget)  # from its lease
    assert _in_file(tmp_path) == budget - MiB // 2
    # Near the budget: the exact need, no lease; then nothing past it.
    assert not await two.reserve(JOB, MiB // 2 + 1, budget)
    assert await two.reserve(JOB, MiB // 2, budget)
    assert _in_file(tmp_path) == budget
    assert not await two.reserve(JOB, 1, budget)
    assert await one.reserve(JOB, MiB, budget)  # its own lease still holds it
    assert not await one.reserve(JOB, 1, budget)
    assert _in_file(tmp_path) == budget
    # Blocks found cached count whatever the budget.
    await two.add(JOB, 5000, budget)
    assert _in_file(tmp_path) == budget + 5000
    await one.add(JOB, -MiB)
    await one.release(JOB)
    assert _in_file(tmp_path) == budget + 5000 - MiB
    assert await two.reserve(JOB, MiB // 2, budget)


async def test_concurrent_reserves_of_one_worker_lose_no_count(tmp_path: Path) -> None:
    usage = NodeUsage(str(tmp_path), lease=64 * 1024)
    await usage.start(JOB, 0)
    budget = 1 << 30
    sizes = [10_000 + i for i in range(200)]
    assert all(await asyncio.gather(*(usage.reserve(JOB, s, budget) for s in sizes)))
    await usage.release(JOB)
    assert _in_file(tmp_path) == sum(sizes)


async def test_a_small_budget_is_counted_exactly(tmp_path: Path) -> None:
    usage = NodeUsage(str(tmp_path))  # the default lease, 1/256 of 8 MiB here
    await usage.start(JOB, 0)
    budget = 8 * MiB
    taken = 0
    while await usage.reserve(JOB, MiB + 100, budget):
        taken += MiB + 100
    assert taken <= budget < taken + MiB + 100
    await usage.release(JOB)
    assert _in_file(tmp_path) == taken
