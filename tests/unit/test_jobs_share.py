"""A preload share's bookkeeping is the share's, not each block's (issue 39): one look for its
blocks on the node's disk and one change of the job's usage file for a batch of small
objects; near the budget each block is still counted as it is fetched, and the budget is
never exceeded. The runner's share (gateway/jobs/runner.py) runs over a stand-in for the
service's face (gateway/service/loads.py) that says which blocks are cached; the usage file
is the real one, in a temporary cache folder."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.cluster import Node
from gateway.jobs.db import BATCH, Item, Tally, WorkRow
from gateway.jobs.model import JobSpec
from gateway.jobs.runner import JobRunner
from gateway.jobs.share import BatchShare
from gateway.jobs.usage import NodeUsage
from gateway.service import FillBudget

pytestmark = pytest.mark.anyio

SIZE = 100_000  # an object: one block
ME = Node("node-1", "127.0.0.1:1")


class Usage(NodeUsage):
    """The job's usage file, its locked changes counted (lease 0: every change is one)."""

    changes = 0

    def _change(self, *args: Any, **kwargs: Any) -> int | None:
        self.changes += 1
        return super()._change(*args, **kwargs)


class Loads:
    """The service's face as the share uses it, over a set of cached keys."""

    def __init__(self, root: Path, cached: set[str]) -> None:
        self.cache_root = str(root)
        self.cached = cached
        self.looks = 0  # looks for blocks on the disk, by the share
        self.warmed: list[str] = []
        self.fills_in_flight = 0

    def placement(self) -> None:
        return None  # a node alone

    def block(self, handle: Any, info: Any, index: int) -> Any:
        length = min(handle.block_size, info.size - index * handle.block_size)
        return SimpleNamespace(info=info, index=index, length=length, on_disk=length)

    async def present_all(self, blocks: list[Any]) -> list[bool]:
        self.looks += 1
        return [b.info.key in self.cached for b in blocks]

    def changed(self, handle: Any, key: str, etag: str) -> bool:
        return False

    async def fetch(self, block: Any, pinned: bool, source: Node | None = None) -> Any:
        self.warmed.append(block.info.key)
        self.cached.add(block.info.key)
        return block.info.key

    async def committed(self, key: Any) -> None:
        pass

    async def kept(self, block: Any) -> bool:
        return True


def _share(tmp_path: Path, cached: set[str], capacity: int) -> tuple[BatchShare, Loads, Usage]:
    loads = Loads(tmp_path, cached)
    runner = JobRunner(None, loads, ME, None)  # type: ignore[arg-type]
    usage = runner.usage = Usage(str(tmp_path), lease=0)
    handle = SimpleNamespace(id=1, block_size=4 << 20, quota=None)
    row = WorkRow(job_id=7, batch=0, node_id=ME.id, cursor=0, tally=Tally())
    job = BatchShare(runner, JobSpec(bucket="b"), handle, row, [], 1)  # type: ignore[arg-type]
    job.leave_room_for_pins(FillBudget(capacity, None, None), 0)
    return job, loads, usage


def _items() -> list[Item]:
    return [Item(seq, f"k/{seq:04d}", SIZE, f'"{seq}"') for seq in range(BATCH)]


async def test_a_share_of_small_objects_looks_and_counts_once_not_per_block(
    tmp_path: Path,
) -> None:
    items = _items()
    cached = {i.key for i in items[::2]}
    job, loads, usage = _share(tmp_path, cached, capacity=1 << 30)
    await usage.start(7, 0)
    await job.run(items)
    assert loads.looks == 1
    assert usage.changes == 1  # before: one locked change of the file a block (lease 0)
    assert sorted(loads.warmed) == sorted(i.key for i in items[1::2])
    assert (job.tally.cached_objects, job.tally.loaded_objects) == (BATCH // 2, BATCH // 2)
    assert job.row.cursor == BATCH
    await usage.release(7)
    assert await usage.get(7) == BATCH * SIZE  # every block counted once


async def test_near_the_budget_each_block_is_counted_and_the_budget_holds(
    tmp_path: Path,
) -> None:
    items = _items()
    cached = {i.key for i in items[:10]}
    room = 40 * SIZE  # the 10 cached, and 30 of the 118 missing
    job, loads, usage = _share(tmp_path, cached, capacity=room)
    await usage.start(7, 0)
    await job.run(items)
    assert len(loads.warmed) == 30
    assert job.tally.full
    await usage.release(7)
    assert await usage.get(7) == room
