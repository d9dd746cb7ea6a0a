"""Preload jobs without servers: the bandwidth limit on an injected clock (a process's bucket,
and the node's that its worker processes share), the options and
their patterns, and the jobs tables on SQLite and PostgreSQL (submitting, the one lister,
shares taken under leases and taken over, progress written with its cursor, the end)."""

from __future__ import annotations

import asyncio
import fcntl
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from gateway.jobs.bandwidth import NodeBucket, TokenBucket
from gateway.jobs.db import BATCH, Item, JobStore, UnknownBucket
from gateway.jobs.model import JobSpec, JobView, parse_bandwidth
from gateway.jobs.runner import sweep_job_files
from gateway.meta import MetaStore, SecretBox
from gateway.meta.tables import job_work

pytestmark = pytest.mark.anyio


class FakeTime:
    """A clock that moves only when slept on."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 6))
        self.now += seconds


async def test_the_token_bucket_spends_its_burst_then_waits_for_each_byte() -> None:
    t = FakeTime()
    bucket = TokenBucket(100, burst=100, clock=t.clock, sleep=t.sleep)
    await bucket.take(100)  # the burst
    assert t.slept == []
    await bucket.take(100)  # a second's worth, in debt: wait it out
    await bucket.take(50)
    assert t.slept == [1.0, 0.5]
    t.now += 60  # idle: it saves up no more than its burst
    await bucket.take(100)
    await bucket.take(10)
    assert t.slept == [1.0, 0.5, 0.1]


async def test_a_new_rate_applies_from_then_on() -> None:
    t = FakeTime()
    bucket = TokenBucket(1000, burst=0, clock=t.clock, sleep=t.sleep)
    await bucket.take(1000)
    bucket.set_rate(4000)  # a node left: this node's share of the fleet's limit grows
    await bucket.take(1000)
    assert t.slept == [1.0, 0.25]


async def test_a_node_s_bucket_is_shared_by_its_workers_whichever_of_them_load(
    tmp_path: Path,
) -> None:
    """The node's share of a job's bandwidth is one bucket for all its worker processes (two
    NodeBuckets on one file: two open files, as two processes have; flock tells them apart
    as it does processes). One worker loading alone moves at the node's rate, not at its
    part of it; two loading at once move at the node's rate together."""
    t = FakeTime()
    path = str(tmp_path / "job-bandwidth" / "7")
    one, two = (NodeBucket(path, 1000, burst=100, clock=t.clock, sleep=t.sleep, boot=b"b",
                           alone=0.5) for _ in range(2))  # fmt: skip
    for _ in range(3):
        await one.take(1000)
    assert t.slept == [0.9, 1.0, 1.0]  # 1000 bytes a second: the node's, not half of it
    t.slept.clear()
    for bucket in (one, two, one, two):
        await bucket.take(1000)
    assert t.slept == [1.0, 1.0, 1.0, 1.0]  # together, still the node's rate
    t.now += 60  # idle: the node's bucket saves up its burst, no more
    await two.take(100)
    await one.take(100)
    assert t.slept[4:] == [0.1]
    two.set_rate(4000)  # a node left the fleet: this node's share grows
    await two.take(4000)  # 0.1 s owed still, a second at the new rate, 100 bytes saved
    assert t.slept[5:] == [1.075]
    one.close()
    two.close()


async def test_a_node_s_bucket_waits_for_a_sibling_s_lock_off_the_loop(tmp_path: Path) -> None:
    t = FakeTime()
    path = tmp_path / "job-bandwidth" / "8"
    bucket = NodeBucket(str(path), 1000, burst=0, clock=t.clock, sleep=t.sleep, boot=b"b")
    await bucket.take(500)  # the file made
    sibling = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(sibling, fcntl.LOCK_EX)
        taking = asyncio.create_task(bucket.take(500))
        for _ in range(20):
            await asyncio.sleep(0.01)
            assert not taking.done()  # the loop goes on meanwhile; the take waits its turn
        fcntl.flock(sibling, fcntl.LOCK_UN)
        await asyncio.wait_for(taking, 30)
    finally:
        os.close(sibling)
    assert t.slept == [0.5, 0.5]
    bucket.close()


async def test_a_node_s_bucket_from_another_boot_is_full_and_a_failed_file_limits_a_part(
    tmp_path: Path,
) -> None:
    t = FakeTime()
    path = str(tmp_path / "9")
    before = NodeBucket(path, 1000, burst=100, clock=t.clock, sleep=t.sleep, boot=b"old")
    await before.take(100_000)  # in debt for ~100 s of that boot's clock
    t.slept.clear()
    after = NodeBucket(path, 1000, burst=100, clock=t.clock, sleep=t.sleep, boot=b"new")
    await after.take(100)  # a reboot: the clock began again, the debt is of no meaning
    assert t.slept == []
    (tmp_path / "file").write_bytes(b"")
    broken = NodeBucket(str(tmp_path / "file" / "9"), 1000, burst=100, clock=t.clock,
                        sleep=t.sleep, alone=0.5)  # fmt: skip
    await broken.take(1050)  # this worker's part: 500 bytes a second, 50 saved
    assert t.slept == [2.0]
    for bucket in (before, after, broken):
        bucket.close()


def test_bandwidths_are_read_in_binary_and_decimal_units() -> None:
    assert parse_bandwidth("200MiB/s") == 200 << 20
    assert parse_bandwidth("1.5GB/s") == 1_500_000_000
    assert parse_bandwidth("500k") == 500_000
    assert parse_bandwidth("64KiB") == 64 << 10
    for bad in ("fast", "-1MiB/s", "0", "10 MiB/h"):
        with pytest.raises(ValueError):
            parse_bandwidth(bad)


def test_include_and_exclude_match_the_key_after_the_prefix() -> None:
    spec = JobSpec("data", "train/", include=("*.parquet", "shard-*"), exclude=("tmp/*",))
    assert spec.wants("train/a.parquet") and spec.wants("train/shard-7")
    assert spec.wants("train/deep/x.parquet")  # * crosses "/", as fnmatch does
    assert not spec.wants("train/tmp/b.parquet") and not spec.wants("train/readme.txt")
    assert JobSpec("data").wants("anything")


def test_options_from_json_are_checked() -> None:
    spec = JobSpec("data", "p/", include=("*.bin",), replicas=2, bandwidth=1 << 20, pin=True)
    assert JobSpec.from_json(spec.to_json()) == spec
    for bad in (
        {"bucket": "data", "colour": "red"},
        {"bucket": "data", "replicas": "2"},
        {"bucket": "data", "replicas": 0},
        {"bucket": "data", "include": "*.bin"},
        {"bucket": "data", "pin": 1},
        {"bucket": "data", "verify": True, "pin": True},
        {"prefix": "p/"},
    ):
        with pytest.raises(ValueError):
            JobSpec.from_json(bad)


@pytest.fixture
async def meta(database_url: str) -> AsyncIterator[MetaStore]:
    async with MetaStore(database_url, SecretBox([SecretBox.generate_key()])) as store:
        await store.migrate()
        await store.add_mount("data", "s3://origin", {})
        yield store


def items(first: int, count: int) -> list[Item]:
    return [Item(i, f"k/{i:05d}", 10, f'"e{i}"') for i in range(first, first + count)]


async def test_a_job_is_listed_by_one_node_and_shared_out_by_batches(meta: MetaStore) -> None:
    store = JobStore(meta.engine)
    with pytest.raises(UnknownBucket):
        await store.submit(JobSpec("nope"), "me")
    job_id = await store.submit(JobSpec("data", "k/"), "me")
    assert await store.take_listing(job_id, "a", 30)
    assert not await store.take_listing(job_id, "b", 30)  # a holds the listing's lease
    assert await store.add_items(job_id, "a", 30, items(0, BATCH + 5))
    assert not await store.add_items(job_id, "b", 30, items(BATCH + 5, 1))
    assert await store.listed_so_far(job_id) == (BATCH + 5, f"k/{BATCH + 4:05d}")
    assert await store.finish_listing(job_id, "a")
    job = await store.get(job_id)
    assert job is not None and job.state == "running" and job.listed
    assert (job.total_objects, job.total_bytes) == (BATCH + 5, 10 * (BATCH + 5))

    await store.seed(job_id, 0, 2, ["n1", "n2"])
    await store.seed(job_id, 0, 2, ["n1", "n2"])  # seeding again changes nothing
    assert sorted(await store.batch_nodes(job_id, 1)) == ["n1", "n2"]
    assert len(await store.batch_items(job_id, 1)) == 5
    # Each node takes its own shares, in order, each once.
    first = await store.claim(job_id, "n1", "n1:p", 30, live=["n1", "n2"])
    second = await store.claim(job_id, "n1", "n1:p2", 30, live=["n1", "n2"])
    assert first is not None and second is not None
    assert (first.batch, second.batch) == (0, 1)
    assert await store.claim(job_id, "n1", "n1:p3", 30, live=["n1", "n2"]) is None
    # n2 is live: its shares are its own, not n1's to take.
    assert await store.claim(job_id, "n1", "n1:p3", 30, live=["n1", "n2"]) is None
    # Progress is written with its cursor, and only by the lease's holder.
    first.cursor, first.tally.objects, first.tally.loaded_bytes = 3, 3, 30
    assert await store.report(first, "n1:p", 30)
    assert not await store.report(first, "n1:other", 30)
    assert await store.report(first, "n1:p", 30, done=True)
    assert await store.report(second, "n1:p2", 30, done=True)
    # n2 has left: its shares, pending, go to a live node.
    taken = await store.claim(job_id, "n1", "n1:p4", 30, live=["n1"])
    assert taken is not None and (taken.node_id, taken.batch) == ("n2", 0)
    assert await store.try_finish(job_id, ["n1"]) is None  # n2's shares are not done
    assert await store.report(taken, "n1:p4", 30, done=True)
    rest = await store.claim(job_id, "n1", "n1:p4", 30, live=["n1"])
    assert rest is not None and await store.report(rest, "n1:p4", 30, done=True)
    assert await store.try_finish(job_id, ["n1"]) == "done"  # every share done, none short
    job = await store.get(job_id)
    assert job is not None and job.ended and job.objects_done == 3
    assert {n.node: n.loaded_bytes for n in job.nodes} == {"n1": 30, "n2": 0}
    assert JobView.from_json(job.to_json()) == job


async def test_a_lapsed_lease_is_taken_again_and_a_cancelled_job_stops(meta: MetaStore) -> None:
    store = JobStore(meta.engine)
    job_id = await store.submit(JobSpec("data"), "me")
    assert await store.take_listing(job_id, "a", 0.001)
    assert await store.add_items(job_id, "a", -10, items(0, 1))  # its lease ran out already
    assert await store.take_listing(job_id, "b", 30)  # so b lists on, after the last key
    assert await store.listed_so_far(job_id) == (1, "k/00000")
    assert await store.finish_listing(job_id, "b")
    await store.seed(job_id, 0, 1, ["n1"])
    row = await store.claim(job_id, "n1", "n1:old", -10, live=["n1"])  # a lease run out
    assert row is not None
    again = await store.claim(job_id, "n1", "n1:new", 30, live=["n1"])  # after a restart
    assert again is not None and again.batch == row.batch
    assert not await store.report(row, "n1:old", 30)  # the old holder has lost it
    cancelled = await store.cancel(job_id)
    assert cancelled is not None and cancelled.state == "cancelled"
    assert await store.try_finish(job_id, ["n1"]) is None
    assert (await store.counts()) == {"cancelled": 1}
    async with meta.engine.connect() as conn:
        states = (await conn.execute(sa.select(job_work.c.state))).scalars().all()
    assert states == ["leased"]


async def test_a_share_given_up_at_a_stop_is_taken_up_at_once_from_its_cursor(
    meta: MetaStore,
) -> None:
    store = JobStore(meta.engine)
    job_id = await store.submit(JobSpec("data"), "me")
    assert await store.take_listing(job_id, "a", 30)
    assert await store.add_items(job_id, "a", 30, items(0, 10))
    assert await store.finish_listing(job_id, "a")
    await store.seed(job_id, 0, 1, ["n1", "n2"])
    row = await store.claim(job_id, "n1", "n1:before", 30, live=["n1", "n2"])
    assert row is not None
    row.cursor, row.tally.objects = 4, 4
    assert await store.report(row, "n1:before", 30, release=True)  # the node stops
    assert not await store.report(row, "n1:before", 30)  # and holds it no more
    # n2 does not take n1's share (n1 is kept: back soon); n1's restart takes it at once,
    # with a lease of 30 s that has not run out, from where it was.
    assert await store.claim(job_id, "n2", "n2:p", 30, live=["n1", "n2"]) is not None  # own
    assert await store.claim(job_id, "n2", "n2:p2", 30, live=["n1", "n2"]) is None
    again = await store.claim(job_id, "n1", "n1:after", 30, live=["n1", "n2"])
    assert again is not None and (again.cursor, again.tally.objects) == (4, 4)
    # A renewal fails once the job is no longer active: the reporter stops the work.
    assert await store.report(again, "n1:after", 30)
    await store.cancel(job_id)
    assert not await store.report(again, "n1:after", 30)
    assert await store.state(job_id) == "cancelled"


def test_a_job_is_shown_in_binary_units_with_its_nodes() -> None:
    from datetime import UTC, datetime

    from gateway.jobs import progress
    from gateway.jobs.model import NodeProgress

    job = JobView(
        id=4, spec=JobSpec("data", "train/", verify=True), state="done", message="",
        submitted_by="ops", submitted_at=datetime(2026, 12, 1, tzinfo=UTC), started_at=None,
        ended_at=None, total_objects=10, total_bytes=3 << 20, listed=True,
        nodes=(NodeProgress("node-0", objects=6, bytes=2 << 20, cached_objects=6,
                            cached_bytes=2 << 20),
               NodeProgress("node-1", objects=9, bytes=5 << 20)),
    )  # fmt: skip
    assert progress.size(1536) == "1.5 KiB" and progress.size(12) == "12 B"
    assert progress.status_line(job) == "job 4 done, 10/10 objects, 3.0 MiB/3.0 MiB"  # capped
    shown = progress.detail(job)
    assert "job 4: verify s3://data/train/" in shown and "--verify" in shown
    assert "node-0  6               2.0 MiB" in shown


def test_the_sweep_removes_the_files_of_jobs_not_active_unless_changed_just_now(
    tmp_path: Path,
) -> None:
    usage, bandwidth = tmp_path / "job-usage", tmp_path / "job-bandwidth"
    usage.mkdir()
    bandwidth.mkdir()
    old = time.time() - 600
    for path in (usage / "1", usage / "2", bandwidth / "2", usage / "3", usage / "notes"):
        path.write_text("0")
        os.utime(path, (old, old))
    (usage / "4").write_text("0")  # a job just submitted, not yet seen active here
    removed = sweep_job_files([str(usage), str(bandwidth), str(tmp_path / "none")], {1}, 60)
    assert removed == 3
    assert sorted(p.name for p in usage.iterdir()) == ["1", "4", "notes"]
    assert list(bandwidth.iterdir()) == []
