"""The shares of a node that the others stood in for, in the jobs tables on SQLite and
PostgreSQL: the node back does them again from their first item before the job can end;
a job that ends while it is away says so (issue 23 #7)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.cluster.placement import Node
from gateway.cluster.registry import NodeFigures, NodeRegistry
from gateway.jobs.db import Item, JobStore
from gateway.jobs.model import JobSpec, JobView
from gateway.meta import MetaStore, SecretBox

pytestmark = pytest.mark.anyio


@pytest.fixture
async def meta(database_url: str) -> AsyncIterator[MetaStore]:
    async with MetaStore(database_url, SecretBox([SecretBox.generate_key()])) as store:
        await store.migrate()
        await store.add_mount("data", "s3://origin", {})
        yield store


async def listed(store: JobStore, count: int) -> int:
    """A job listed with `count` objects, its one batch shared by n1 and n2."""
    job_id = await store.submit(JobSpec("data"), "me")
    assert await store.take_listing(job_id, "lister", 30)
    items = [Item(i, f"k/{i:03d}", 10, f'"e{i}"') for i in range(count)]
    assert await store.add_items(job_id, "lister", 30, items)
    assert await store.finish_listing(job_id, "lister")
    await store.seed(job_id, 0, 1, ["n1", "n2"])
    return job_id


async def test_a_node_back_does_again_the_share_the_others_did_for_it(meta: MetaStore) -> None:
    store = JobStore(meta.engine)
    job_id = await listed(store, 10)
    own = await store.claim(job_id, "n1", "n1:a", 30, live=["n1", "n2"])
    assert own is not None and await store.report(own, "n1:a", 30, done=True)
    # n2 died with 4 objects done; n1 stands in for it and finishes its share.
    mine = await store.claim(job_id, "n2", "n2:old", 30, live=["n1", "n2"])
    assert mine is not None
    mine.cursor, mine.tally.objects, mine.tally.loaded_objects = 4, 4, 4
    assert await store.report(mine, "n2:old", -1)  # then killed: its lease runs out
    stood = await store.claim(job_id, "n1", "n1:a", 30, live=["n1"])
    assert stood is not None and (stood.node_id, stood.cursor) == ("n2", 4)
    stood.cursor, stood.tally.objects = 10, 10
    assert await store.report(stood, "n1:a", 30, done=True, stand_in=True)
    # n2 is back: the job is not done while its share is at the others.
    assert await store.try_finish(job_id, ["n1", "n2"]) is None
    assert await store.claim(job_id, "n1", "n1:a", 30, live=["n1", "n2"]) is None
    again = await store.claim(job_id, "n2", "n2:new", 30, live=["n1", "n2"])
    assert again is not None and again.node_id == "n2"
    assert (again.cursor, again.tally.objects, again.tally.loaded_objects) == (0, 0, 0)
    job = await store.get(job_id)
    assert job is not None and {n.node: n.batches_done for n in job.nodes} == {"n1": 1, "n2": 0}
    assert await store.try_finish(job_id, ["n1", "n2"]) is None  # n2 at work
    again.cursor, again.tally.objects, again.tally.cached_objects = 10, 10, 4
    assert await store.report(again, "n2:new", 30, done=True)
    assert await store.claim(job_id, "n2", "n2:new", 30, live=["n1", "n2"]) is None
    assert await store.try_finish(job_id, ["n1", "n2"]) == "done"
    job = await store.get(job_id)
    assert job is not None and "away" not in job.message, job.message


async def test_a_share_given_back_or_dropped_by_a_stand_in_is_done_again_from_the_start(
    meta: MetaStore,
) -> None:
    store = JobStore(meta.engine)
    job_id = await listed(store, 10)
    own = await store.claim(job_id, "n1", "n1:own", 30, live=["n1"])  # n1's own first
    stood = await store.claim(job_id, "n1", "n1:a", 30, live=["n1"])
    assert own is not None and own.node_id == "n1"
    assert stood is not None and stood.node_id == "n2"
    stood.cursor, stood.tally.objects = 6, 6
    # n1 sees n2 back and gives the share back: n2 takes it up at once, from the start.
    assert await store.report(stood, "n1:a", 30, release=True, stand_in=True)
    again = await store.claim(job_id, "n2", "n2:p", 30, live=["n1", "n2"])
    assert again is not None and (again.node_id, again.cursor, again.tally.objects) == ("n2", 0, 0)
    # A stand-in killed mid-share: n2, back, does it again from the start too, once the
    # stand-in's lease has run out; its own lease run out is taken up from its cursor.
    again.cursor = 3
    assert await store.report(again, "n2:p", -1)
    dropped = await store.claim(job_id, "n1", "n1:b", -1, live=["n1"])
    assert dropped is not None and (dropped.node_id, dropped.cursor) == ("n2", 3)
    dropped.cursor = 8
    assert await store.report(dropped, "n1:b", -1)
    back = await store.claim(job_id, "n2", "n2:q", 30, live=["n1", "n2"])
    assert back is not None and (back.node_id, back.cursor) == ("n2", 0)
    back.cursor = 5
    assert await store.report(back, "n2:q", -1)  # n2 killed again: its own progress
    resumed = await store.claim(job_id, "n2", "n2:r", 30, live=["n1", "n2"])
    assert resumed is not None and resumed.cursor == 5


async def test_a_job_ending_with_a_node_away_says_its_share_is_at_the_others(
    meta: MetaStore,
) -> None:
    store = JobStore(meta.engine)
    job_id = await listed(store, 10)
    own = await store.claim(job_id, "n1", "n1:a", 30, live=["n1"])
    assert own is not None and await store.report(own, "n1:a", 30, done=True)
    stood = await store.claim(job_id, "n1", "n1:a", 30, live=["n1"])
    assert stood is not None and stood.node_id == "n2"
    stood.cursor, stood.tally.objects, stood.tally.bytes = 10, 10, 100
    assert await store.report(stood, "n1:a", 30, done=True, stand_in=True)
    assert await store.try_finish(job_id, ["n1"]) == "done"
    job = await store.get(job_id)
    assert job is not None and job.objects_done == 10
    assert "n2 away at the end" in job.message and "load again" in job.message, job.message


async def stood_in_and_all_done(store: JobStore, job_id: int) -> None:
    """n1 did its share (5 objects) and, n2 away, n2's (5 objects): every share is done."""
    own = await store.claim(job_id, "n1", "n1:a", 30, live=["n1"])
    assert own is not None and own.node_id == "n1"
    own.cursor, own.tally.objects = 10, 5
    assert await store.report(own, "n1:a", 30, done=True)
    stood = await store.claim(job_id, "n1", "n1:a", 30, live=["n1"])
    assert stood is not None and stood.node_id == "n2"
    stood.cursor, stood.tally.objects = 10, 5
    assert await store.report(stood, "n1:a", 30, done=True, stand_in=True)


async def test_a_node_back_after_its_job_ended_leaves_the_job_as_it_ended(meta: MetaStore) -> None:
    """n1 ends the job while n2 is away as n1 last saw it; n2, back, would take its share
    up again from its first item (zeroing its counts), but the job has ended: the share
    keeps the counts the job ended on (test_jobs_fleet_faults saw done with 214/300)."""
    store = JobStore(meta.engine)
    job_id = await listed(store, 10)
    await stood_in_and_all_done(store, job_id)
    assert await store.try_finish(job_id, ["n1"]) == "done"
    assert await store.claim(job_id, "n2", "n2:new", 30, live=["n1", "n2"]) is None
    job = await store.get(job_id)
    assert job is not None and (job.state, job.objects_done) == ("done", 10), job


async def test_a_node_live_in_the_database_when_the_job_ends_is_not_taken_for_away(
    meta: MetaStore,
) -> None:
    """n1 saw n2 away when it looked (its members read before its claim), but n2 is back by
    the time n1 decides the end: read in the end's own transaction, n2 is live, and its share,
    which n1 stood in for, is n2's to do again before the job can end. Before, the job ended
    done with n2 "away" and n2's keys at n1, where no read looks for them
    (test_jobs_fleet_faults' killed-and-back test saw one go to the origin)."""
    registry = NodeRegistry(meta.engine, 30.0)
    store = JobStore(meta.engine, registry.live_ids)
    job_id = await listed(store, 10)
    await stood_in_and_all_done(store, job_id)
    await registry.join(Node("n1", "n1:9001"), NodeFigures())
    await registry.join(Node("n2", "n2:9001"), NodeFigures())  # back
    assert await store.try_finish(job_id, ["n1"]) is None
    again = await store.claim(job_id, "n2", "n2:new", 30, live=["n1", "n2"])
    assert again is not None and (again.node_id, again.cursor) == ("n2", 0)
    again.cursor, again.tally.objects = 10, 5
    assert await store.report(again, "n2:new", 30, done=True)
    assert await store.try_finish(job_id, ["n1"]) == "done"
    job = await store.get(job_id)
    assert job is not None and job.objects_done == 10 and "away" not in job.message, job


async def waiting_on_locks(conn: asyncpg.Connection, count: int) -> None:
    """Until `count` other sessions of this database wait on a lock."""
    deadline = time.monotonic() + 30
    while True:
        waiting = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'"
        )
        if waiting >= count:
            return
        assert time.monotonic() < deadline, f"{waiting} sessions wait on a lock, not {count}"
        await asyncio.sleep(0.01)


# SQLite runs one transaction at a time (BEGIN IMMEDIATE): there, nothing interleaves.
@pytest.mark.parametrize("backend", ["postgresql"])
async def test_a_node_taking_its_share_again_while_the_job_ends_never_lowers_its_figures(
    meta: MetaStore, database_url: str
) -> None:
    """The end of a job and a share taken again, side by side on PostgreSQL: n1 decides the
    end (n2 away as it last saw it) while n2, back, takes up its share that n1 stood in for.
    The job's row is held by a third session so that n1's end is under way, and n2's claim
    is made then. The job either ends with the share's counts or does not end; before, n2's
    claim zeroed the counts n1 had found done, and the job ended done with 5 of 10."""
    store = JobStore(meta.engine)
    job_id = await listed(store, 10)
    await stood_in_and_all_done(store, job_id)
    dsn = database_url.replace("postgresql+asyncpg://", "postgresql://")
    holder, watcher = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    try:
        hold = holder.transaction()
        await hold.start()
        await holder.execute("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE", job_id)
        ending = asyncio.create_task(store.try_finish(job_id, ["n1"]))
        await waiting_on_locks(watcher, 1)
        taking = asyncio.create_task(store.claim(job_id, "n2", "n2:new", 30, live=["n1", "n2"]))
        waiting = asyncio.create_task(waiting_on_locks(watcher, 2))
        await asyncio.wait([taking, waiting], return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting  # a claim that went through before the end: it waited on nothing
        await hold.commit()
        ended, taken = await ending, await taking
    finally:
        await holder.close()
        await watcher.close()
    job = await store.get(job_id)
    assert job is not None
    assert (ended, taken, job.state, job.objects_done) == ("done", None, "done", 10), (
        taken,
        job,
    )


async def own_shares_done(store: JobStore, job_id: int, nodes: list[str]) -> None:
    """Each node did its own share of the one batch: 10 objects over them."""
    for node in nodes:
        own = await store.claim(job_id, node, f"{node}:a", 30, live=nodes)
        assert own is not None and own.node_id == node
        own.cursor, own.tally.objects = 10, 10 // len(nodes)
        assert await store.report(own, f"{node}:a", 30, done=True)


def shares(job: JobView) -> dict[str, tuple[int, int]]:
    """Each node's shares of the job: (done, all)."""
    return {n.node: (n.batches_done, n.batches) for n in job.nodes}


async def test_a_share_seeded_after_its_job_ended_is_not_added(meta: MetaStore) -> None:
    """A node that joins (n3) before the end: its share, seeded, holds the end off until it is
    done. One that joins (n4) after the end: its seed adds nothing to the ended job, which
    keeps the shares it ended on. Before, the seed added n4's share, pending, to a job done."""
    store = JobStore(meta.engine)
    job_id = await listed(store, 10)
    await own_shares_done(store, job_id, ["n1", "n2"])
    await store.seed(job_id, 0, 1, ["n1", "n2", "n3"])
    assert await store.try_finish(job_id, ["n1", "n2"]) is None  # n3's share is open
    joined = await store.claim(job_id, "n3", "n3:a", 30, live=["n1", "n2", "n3"])
    assert joined is not None and joined.node_id == "n3"
    joined.cursor = 10
    assert await store.report(joined, "n3:a", 30, done=True)
    assert await store.try_finish(job_id, ["n1", "n2", "n3"]) == "done"
    await store.seed(job_id, 0, 1, ["n1", "n2", "n3", "n4"])
    job = await store.get(job_id)
    assert job is not None and job.state == "done"
    assert shares(job) == {"n1": (1, 1), "n2": (1, 1), "n3": (1, 1)}, job


# SQLite runs one transaction at a time (BEGIN IMMEDIATE): there, nothing interleaves.
@pytest.mark.parametrize("backend", ["postgresql"])
async def test_a_seed_while_the_job_ends_waits_for_the_end_and_adds_nothing(
    meta: MetaStore, database_url: str
) -> None:
    """A joining node's share seeded while try_finish holds the job's row (paused where it
    reads the fleet's live nodes, its shares not read yet): the seed waits on the row, and
    once the end is decided adds nothing. Before, the seed's rows, written beside the end and
    committed after it, were not among the shares the end read: the job ended done with n3's
    share pending, its keys never loaded at n3."""
    holding, go = asyncio.Event(), asyncio.Event()

    async def live_nodes(conn: AsyncConnection) -> set[str]:
        holding.set()
        await go.wait()
        return set()

    store = JobStore(meta.engine, live_nodes)
    job_id = await listed(store, 10)
    await own_shares_done(store, job_id, ["n1", "n2"])
    dsn = database_url.replace("postgresql+asyncpg://", "postgresql://")
    watcher = await asyncpg.connect(dsn)
    try:
        ending = asyncio.create_task(store.try_finish(job_id, ["n1", "n2"]))
        await holding.wait()
        seeding = asyncio.create_task(store.seed(job_id, 0, 1, ["n1", "n2", "n3"]))
        await waiting_on_locks(watcher, 1)  # the seed, on the row try_finish holds
        go.set()
        ended = await ending
        await seeding
    finally:
        await watcher.close()
    job = await store.get(job_id)
    assert job is not None
    assert (ended, job.state, shares(job)) == ("done", "done", {"n1": (1, 1), "n2": (1, 1)})
