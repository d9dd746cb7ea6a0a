"""A load keeps its concurrency in flight across the ends of its batches (issue 39): a node's
share of one batch waited for its slowest object, its report and the next claim before any
fetch of the next batch began, so over a WAN each batch ended with its fetches trickling to
none. The runner now takes its next share once every item of the last has started. Here the
runner works a job of the real jobs tables (SQLite, and PostgreSQL where the suite runs on
it) over a stand-in for the service's face whose fetch of one object waits until the test
lets it go."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.cluster import Node
from gateway.jobs.bandwidth import NodeBucket
from gateway.jobs.db import BATCH, Item, JobStore
from gateway.jobs.model import JobSpec
from gateway.jobs.runner import JobRunner, Member
from gateway.meta import MetaStore
from gateway.service import FillBudget
from gateway.stores.base import ListPage, ObjectInfo
from tests.unit.test_jobs_share import ME, SIZE
from tests.unit.test_jobs_share import Loads as ShareLoads

pytestmark = pytest.mark.anyio


class Loads(ShareLoads):
    """The service's face for a whole job: the fetch of `slow` waits for `go`."""

    def __init__(self, root: Path, slow: str) -> None:
        super().__init__(root, set())
        self.slow = slow
        self.go = asyncio.Event()
        self.waiting = asyncio.Event()  # the slow fetch has begun
        self.changed_warmed = asyncio.Event()  # a warm ended: look again

    async def mount(self, bucket: str) -> Any:
        return SimpleNamespace(id=1, block_size=4 << 20, quota=None)

    async def budget(self, handle: Any) -> FillBudget:
        return FillBudget(1 << 40, None, None)

    async def any_fill_ended(self) -> None:
        await asyncio.sleep(0)

    async def fetch(self, block: Any, pinned: bool, source: Node | None = None) -> Any:
        if block.info.key == self.slow:
            self.waiting.set()
            await self.go.wait()
        key = await super().fetch(block, pinned, source)
        self.changed_warmed.set()
        return key


@pytest.fixture
async def mounted(meta: MetaStore) -> MetaStore:
    """The suite's metadata store (tests/conftest.py) with the bucket `data` mounted."""
    await meta.add_mount("data", "s3://origin", {})
    return meta


async def _members() -> list[Member]:
    return [Member(ME, True)]


async def _job(mounted: MetaStore, objects: int, concurrency: int) -> tuple[JobStore, Any]:
    store = JobStore(mounted.engine)
    job_id = await store.submit(JobSpec("data", "k/", concurrency=concurrency), ME.id)
    assert await store.take_listing(job_id, "lister", 30)
    items = [Item(seq, f"k/{seq:05d}", SIZE, f'"{seq}"') for seq in range(objects)]
    assert await store.add_items(job_id, "lister", 30, items)
    assert await store.finish_listing(job_id, "lister")
    (job,) = await store.active()
    return store, job


async def test_the_next_batch_is_fetched_while_the_last_one_s_slowest_object_is(
    mounted: MetaStore, tmp_path: Path
) -> None:
    slow = f"k/{BATCH - 1:05d}"  # the first batch's last object
    loads = Loads(tmp_path, slow)
    store, job = await _job(mounted, 2 * BATCH, concurrency=8)
    runner = JobRunner(store, loads, ME, _members)  # type: ignore[arg-type]
    work = asyncio.create_task(runner._work(job))
    try:
        await asyncio.wait_for(loads.waiting.wait(), 30)
        # Every object of the second batch is fetched while the first batch's last is.
        second = {f"k/{seq:05d}" for seq in range(BATCH, 2 * BATCH)}
        while not second <= loads.cached:
            loads.changed_warmed.clear()
            await asyncio.wait_for(loads.changed_warmed.wait(), 30)
        assert slow not in loads.cached and not work.done()
        loads.go.set()
        await asyncio.wait_for(work, 30)
    finally:
        work.cancel()
    # Each object fetched once, both shares written down as done, and the job ended on them.
    assert sorted(loads.warmed) == [f"k/{seq:05d}" for seq in range(2 * BATCH)]
    ended = await store.get(job.id)
    assert ended is not None and ended.state == "done"
    assert ended.objects_done == 2 * BATCH and ended.loaded_objects == 2 * BATCH


async def test_a_share_taken_while_another_is_worked_on_is_not_the_same_one(
    mounted: MetaStore,
) -> None:
    """A holder's own leased share counts as open to it (its restart takes it up again),
    unless it says it works on it now."""
    store, job = await _job(mounted, 2 * BATCH, concurrency=8)
    await store.seed(job.id, 0, 2, [ME.id])
    first = await store.claim(job.id, ME.id, "me:p", 30, [ME.id])
    assert first is not None and first.batch == 0
    again = await store.claim(job.id, ME.id, "me:p", 30, [ME.id])
    assert again is not None and again.batch == 0  # a restart's view
    second = await store.claim(job.id, ME.id, "me:p", 30, [ME.id], holding=[(0, ME.id)])
    assert second is not None and second.batch == 1
    both = [(0, ME.id), (1, ME.id)]
    assert await store.claim(job.id, ME.id, "me:p", 30, [ME.id], holding=both) is None


async def test_a_batch_listed_while_the_last_one_s_slowest_object_is_fetched_is_taken_at_once(
    mounted: MetaStore, tmp_path: Path
) -> None:
    """While a job is still being listed (here by another node) and this worker's only share
    is down to its slowest object, a batch listed meanwhile is taken within a poll, not once
    that object is fetched (a worker waited for every share of its own to end)."""
    slow = f"k/{BATCH - 1:05d}"
    loads = Loads(tmp_path, slow)
    store = JobStore(mounted.engine)
    job_id = await store.submit(JobSpec("data", "k/", concurrency=8), ME.id)
    assert await store.take_listing(job_id, "lister", 30)
    first = [Item(seq, f"k/{seq:05d}", SIZE, f'"{seq}"') for seq in range(BATCH)]
    assert await store.add_items(job_id, "lister", 30, first)
    (job,) = await store.active()
    runner = JobRunner(store, loads, ME, _members, poll=0.05)  # type: ignore[arg-type]
    work = asyncio.create_task(runner._work(job))
    try:
        await asyncio.wait_for(loads.waiting.wait(), 30)
        more = [Item(seq, f"k/{seq:05d}", SIZE, f'"{seq}"') for seq in range(BATCH, 2 * BATCH)]
        assert await store.add_items(job_id, "lister", 30, more)
        second = {item.key for item in more}
        while not second <= loads.cached:
            loads.changed_warmed.clear()
            await asyncio.wait_for(loads.changed_warmed.wait(), 30)
        assert slow not in loads.cached and not work.done()
        assert await store.finish_listing(job_id, "lister")
        loads.go.set()
        await asyncio.wait_for(work, 30)
    finally:
        work.cancel()
    assert sorted(loads.warmed) == [f"k/{seq:05d}" for seq in range(2 * BATCH)]
    ended = await store.get(job_id)
    assert ended is not None and ended.state == "done", ended


class Lister(Loads):
    """The service's face with a store to list: a first page of one batch at once, a second
    once `more` is set (the test sets it while the first batch's slowest object is held)."""

    def __init__(self, root: Path, slow: str) -> None:
        super().__init__(root, slow)
        self.more = asyncio.Event()

    async def mount(self, bucket: str) -> Any:
        return SimpleNamespace(id=1, block_size=4 << 20, quota=None, catalog=None, store=self)

    async def list_page(
        self, prefix: str, delimiter: str | None, token: str | None, after: str | None, limit: int
    ) -> ListPage:
        if token is None:
            return _page(range(BATCH), "2")
        await self.more.wait()
        return _page(range(BATCH, 2 * BATCH), None)


def _page(seqs: range, token: str | None) -> ListPage:
    when = datetime.now(UTC)
    return ListPage([ObjectInfo(f"k/{i:05d}", SIZE, f'"{i}"', when) for i in seqs], [], token)


async def test_a_batch_this_process_lists_while_its_shares_are_in_flight_is_taken_at_once(
    mounted: MetaStore, tmp_path: Path
) -> None:
    """The same as above when the batch is listed by this process's own lister: the worker,
    its one share down to its slowest object, is woken by the listing's page (the runner's
    `_listed` event), not by its poll (here ten minutes: the test would time out first)."""
    slow = f"k/{BATCH - 1:05d}"
    loads = Lister(tmp_path, slow)
    store = JobStore(mounted.engine)
    job_id = await store.submit(JobSpec("data", "k/", concurrency=8), ME.id)
    (queued,) = await store.active()
    assert await store.take_listing(job_id, "me", 30)
    runner = JobRunner(store, loads, ME, _members, poll=600)  # type: ignore[arg-type]
    runner.owner = "me"
    first_page = runner._listed
    listing = asyncio.create_task(runner._list(queued))
    work: asyncio.Task[None] | None = None
    try:
        await asyncio.wait_for(first_page.wait(), 30)
        (job,) = await store.active()
        work = asyncio.create_task(runner._work(job))
        await asyncio.wait_for(loads.waiting.wait(), 30)
        loads.more.set()
        second = {f"k/{seq:05d}" for seq in range(BATCH, 2 * BATCH)}
        while not second <= loads.cached:
            loads.changed_warmed.clear()
            await asyncio.wait_for(loads.changed_warmed.wait(), 30)
        assert slow not in loads.cached and not work.done()
        await asyncio.wait_for(listing, 30)
        loads.go.set()
        await asyncio.wait_for(work, 30)
    finally:
        listing.cancel()
        if work is not None:
            work.cancel()
    ended = await store.get(job_id)
    assert ended is not None and ended.state == "done", ended


class Counting(Loads):
    """Fetches that take a few turns of the loop, those in flight at once counted."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, slow="")
        self.inflight = self.most = 0

    async def fetch(self, block: Any, pinned: bool, source: Node | None = None) -> Any:
        self.inflight += 1
        self.most = max(self.most, self.inflight)
        for _ in range(3):
            await asyncio.sleep(0)
        self.inflight -= 1
        return await super().fetch(block, pinned, source)


@pytest.mark.parametrize(("concurrency", "workers", "most"), [(8, 2, 4), (8, 1, 8), (3, 2, 2)])
async def test_a_job_s_concurrency_is_the_node_s_shared_by_its_workers(
    mounted: MetaStore, tmp_path: Path, concurrency: int, workers: int, most: int
) -> None:
    """`--concurrency N` is blocks in flight per node: each of its worker processes, each with
    a runner taking shares of its own, has its part (rounded up), across its shares."""
    loads = Counting(tmp_path)
    store, job = await _job(mounted, 2 * BATCH, concurrency=concurrency)
    runner = JobRunner(store, loads, ME, _members, workers=workers)  # type: ignore[arg-type]
    await asyncio.wait_for(runner._work(job), 30)
    assert len(loads.warmed) == 2 * BATCH
    assert loads.most == most


async def test_a_job_s_bandwidth_is_the_node_s_share_whichever_of_its_workers_load(
    mounted: MetaStore, tmp_path: Path
) -> None:
    """`--bandwidth` is the fleet's; each node's share of it (here half: two nodes) is one
    bucket for all the node's worker processes, not a fixed part each: a worker that loads
    alone (a job of one batch) moves at the node's share, not at half of it
    (tests/unit/test_jobs.py holds the bucket itself). Let go when the job ends here."""
    store, job = await _job(mounted, BATCH, concurrency=8)
    spec = JobSpec("data", "k/", bandwidth=8_000_000)
    one, two = (JobRunner(store, Counting(tmp_path), ME, _members, workers=2)  # type: ignore[arg-type]
                for _ in range(2))  # fmt: skip
    mine, sibling = one.bucket(job.id, spec, 2), two.bucket(job.id, spec, 2)
    assert isinstance(mine, NodeBucket) and isinstance(sibling, NodeBucket)
    assert mine.rate == sibling.rate == 4_000_000
    assert mine.path == sibling.path == str(tmp_path / "job-bandwidth" / str(job.id))
    assert one.bucket(job.id, spec, 2) is mine
    await mine.take(1000)
    await store.cancel(job.id)
    await asyncio.wait_for(one._work(job), 30)
    again = one.bucket(job.id, spec, 2)
    assert again is not mine  # the ended job's was let go
    for bucket in (again, sibling):
        assert bucket is not None
        bucket.close()


class HeldCommits(Loads):
    """Fetches that end at once, and commits held until the test lets them go."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, slow="")
        self.fetched: list[str] = []
        self.commits = asyncio.Event()  # let every commit end
        self.fetching = asyncio.Event()  # a fetch has begun

    async def fetch(self, block: Any, pinned: bool, source: Node | None = None) -> Any:
        self.fetched.append(block.info.key)
        self.fetching.set()
        return await super().fetch(block, pinned, source)

    async def committed(self, key: Any) -> None:
        await self.commits.wait()


async def test_a_fetch_s_slot_is_free_once_its_bytes_are_in_and_commits_are_bounded(
    mounted: MetaStore, tmp_path: Path
) -> None:
    """With one fetch in flight (--concurrency 1), the next object's fetch begins while the
    last one's commit (the disk's part) goes on; blocks not yet committed are at most twice
    the concurrency, so the bytes held for commits stay bounded."""
    loads = HeldCommits(tmp_path)
    store, job = await _job(mounted, 5, concurrency=1)
    runner = JobRunner(store, loads, ME, _members)  # type: ignore[arg-type]
    work = asyncio.create_task(runner._work(job))
    try:
        while len(loads.fetched) < 2:
            loads.fetching.clear()
            await asyncio.wait_for(loads.fetching.wait(), 30)
        for _ in range(20):  # a third would begin within a few turns of the loop
            await asyncio.sleep(0)
        assert loads.fetched == ["k/00000", "k/00001"] and not work.done()
        loads.commits.set()
        await asyncio.wait_for(work, 30)
    finally:
        work.cancel()
    assert loads.fetched == [f"k/{seq:05d}" for seq in range(5)]
    ended = await store.get(job.id)
    assert ended is not None and ended.state == "done" and ended.loaded_objects == 5, ended
