"""The node's job loop: it polls the database for jobs, lists a job's prefix when it holds the
listing's lease, and loads its share of each batch of work items: the blocks it owns under
the current placement (or, for a node that has left, that node's share, at the new owners).

Preload never takes a client's place: it has its own bounded concurrency (a client's miss
never waits for it), its own bandwidth limit, and it joins a fill a client started (and a
client joins its fills) through the page store's single flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from gateway import counters, errors
from gateway.cache import FillFailed
from gateway.catalog import SyncBusy, SyncProgress, sync_parallel
from gateway.cluster import Node, PeerUnavailable, Placement
from gateway.jobs import unpin, warm
from gateway.jobs.bandwidth import TokenBucket
from gateway.jobs.db import ActiveJob, Item, JobStore, Tally, WorkRow, batches
from gateway.jobs.model import ACTIVE, LISTING, QUEUED, RUNNING, JobSpec
from gateway.jobs.usage import NodeUsage
from gateway.meta import MetaUnavailable
from gateway.service import Block, FillBudget, Loads, MountHandle, listed_info
from gateway.stores import ListPage, ObjectInfo, VersionChanged

log = logging.getLogger(__name__)

# Fetches from the store by this node's clients in flight at which preload slows down to its
# floor (a client's miss never queues behind preload work: it has slots of its own; this keeps
# preload from taking most of the store's bandwidth while clients wait on it).
FOREGROUND_BUSY = 4
# The share of a job's concurrency that goes on while clients fetch: a store far away is
# bound by its round trip, not its bandwidth, so a preload that stopped for every busy moment
# of an epoch warmed nothing ahead of it (the load moved 0.08x the WAN during epoch 1:
# docs/performance.md, "epochs --preload").
PRELOAD_FLOOR = 0.5

LIST_PAGE = 1000
REPORT_INTERVAL = 0.5  # seconds between a share's lease renewals at the latest
# Progress is written within this long of an object being done, so that a node killed mid-job
# leaves little done-but-unrecorded work for the node that takes its share over.
REPORT_GAP = 0.1


@dataclass(frozen=True, slots=True)
class Member:
    """A node as the database knows it: what the runner needs to take over its share."""

    node: Node
    live: bool
    gone_for: float = 0.0  # seconds since its last heartbeat, when it is not live


Members = Callable[[], Awaitable[Sequence[Member]]]


@dataclass(slots=True)
class _Planned:
    """A block of an item as its share plans it: where the share loads it (empty: not this
    share's), whether the share is its first owner (whose counts the job's progress adds
    up), for a replica (--replicas) the first owner to copy it from rather than from the
    store, and whether it was on this node's disk when the share began."""

    block: Block
    targets: list[Node]
    first: bool
    source: Node | None
    present: bool = False


class _Lost(Exception):
    """The share's lease is gone (taken over), or its job is no longer active."""


class JobRunner:
    """One per node process: started in the node's lifespan, stopped with it."""

    def __init__(
        self,
        store: JobStore,
        loads: Loads,
        me: Node,
        members: Members,
        *,
        lease: float = 10.0,
        poll: float = 1.0,
        takeover_after: float = 60.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        workers: int = 1,
    ) -> None:
        self.store = store
        # Each worker process of the node runs a runner: the node's share of a job's bandwidth
        # is split between them.
        self.workers = max(1, workers)
        self.loads = loads
        self.me = me
        self._members = members
        self.lease = lease
        self.poll = poll
        self.takeover_after = takeover_after
        self._sleep = sleep
        # This process, as the holder of leases (a node restarted is another holder). It begins
        # with the node's id: a share held by a holder not named for its node was stood in for
        # (gateway/jobs/db.py, stood_in).
        self.owner = f"{me.id}:{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._listing: dict[int, asyncio.Task[None]] = {}
        self._working: dict[int, asyncio.Task[None]] = {}
        self._seeded: dict[int, int] = {}
        # Bytes each job's blocks take in this node's cache, counted with the node's other
        # workers: the budget is the node's.
        self._usage = NodeUsage(loads.cache_root)
        self._counted: set[int] = set()  # jobs whose count this process has started
        self._buckets: dict[int, TokenBucket] = {}
        self._wake = asyncio.Event()
        self.stopping = False
        self.own_fills = 0  # the page store's fills in flight that are this node's preloads
        # A node without a fleet places every block on itself: built once, since building a
        # placement ranks its partitions (~25 ms), and the reporter asks for it every 0.1 s.
        self._alone = Placement([me])

    def wake(self) -> None:
        """Look for work now (a job was submitted through this node)."""
        self._wake.set()

    async def yield_to_clients(self, floor: int = 0) -> None:
        """Clients' reads first: while this node's clients have FOREGROUND_BUSY fetches or
        more from the store in flight and this process's preloads have `floor` or more of
        theirs, no new preload fetch starts here (one already under way goes on); it starts
        when one of them ends."""
        loads = self.loads
        yielded = False
        while (
            not self.stopping
            and self.own_fills >= floor
            and loads.fills_in_flight - self.own_fills >= FOREGROUND_BUSY
        ):
            if not yielded:
                counters.job_yielded()
                yielded = True
            await loads.any_fill_ended()

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except MetaUnavailable as exc:
                log.warning("jobs: the database is not answering: %s", exc)
            except Exception:
                log.exception("jobs: a pass failed")
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.poll)

    async def stop(self, grace: float = 5.0) -> None:
        """Stop taking blocks, let the loads in flight end (so that a restart does not fetch
        them again), then stop; the shares are taken up again after the restart."""
        self.stopping = True
        tasks = [*self._listing.values(), *self._working.values()]
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
        for task in tasks:
            task.cancel()
        if tasks:  # not awaited each: a cancellation swallowed in a database call never ends
            await asyncio.wait(tasks, timeout=2)

    async def tick(self) -> None:
        """One pass: publish the counts, start listings and work that no task of ours runs."""
        if self.stopping:
            return
        counters.set_jobs(await self.store.counts())
        for job in await self.store.active():
            if (
                job.state in (QUEUED, LISTING)
                and job.listing_lease_lapsed
                and job.id not in self._listing
                and await self.store.take_listing(job.id, self.owner, self.lease)
            ):
                self._spawn(self._listing, job.id, self._list(job))
            if job.state in (LISTING, RUNNING) and job.id not in self._working:
                self._spawn(self._working, job.id, self._work(job))

    def _spawn(
        self, where: dict[int, asyncio.Task[None]], job_id: int, coro: Awaitable[None]
    ) -> None:
        async def guarded() -> None:
            try:
                await coro
            except MetaUnavailable as exc:
                log.warning("jobs: job %d paused, the database is not answering: %s", job_id, exc)
            except Exception:
                log.exception("jobs: job %d: work failed", job_id)
            finally:
                where.pop(job_id, None)

        where[job_id] = asyncio.create_task(guarded())

    # -- listing ---------------------------------------------------------------------------

    async def _list(self, job: ActiveJob) -> None:
        """List the prefix once for the fleet, writing the items page by page; resumes after
        the last key written when an earlier lister died."""
        spec = job.spec
        try:
            handle = await self.loads.mount(spec.bucket)
        except errors.S3Error:
            await self.store.fail(job.id, f"bucket {spec.bucket!r} is not mounted")
            return
        seq, last = await self.store.listed_so_far(job.id)
        # A catalog=on mount: the listing syncs the prefix into the catalog first (unless an
        # earlier lister of the job got past that), and the items come from there: a load is
        # a sync too (docs/catalog.md).
        syncs = handle.catalog is not None and not (spec.verify or spec.unpin) and seq == 0
        if syncs and not await self._sync_catalog(job.id, spec, handle):
            return
        token: str | None = None
        while True:
            try:
                page = await self._page(handle, spec.prefix, token, last if token is None else None)
            except Exception as exc:
                await self.store.fail(job.id, f"listing {spec.bucket}/{spec.prefix} failed: {exc}")
                return
            items = []
            for info in page.objects:
                if spec.wants(info.key):
                    items.append(Item(seq, info.key, info.size, info.etag))
                    seq += 1
            if not await self.store.add_items(job.id, self.owner, self.lease, items):
                return  # cancelled, or another node took the listing over
            self._wake.set()
            token = page.next_token
            if token is None:
                break
        await self.store.finish_listing(job.id, self.owner)
        log.info("jobs: job %d listed: %d objects", job.id, seq)

    async def _page(
        self, handle: MountHandle, prefix: str, token: str | None, after: str | None
    ) -> ListPage:
        """A page of the prefix's keys: from the catalog where it answers for the prefix,
        else (or once it stops answering: its database away) from the store."""
        if handle.catalog is not None:
            catalog = self.loads.catalog
            page = await catalog.list_page(handle.id, prefix, None, token, after, LIST_PAGE)
            if page is not None:
                return page
            token, after = catalog.for_store(token, after)
        return await handle.store.list_page(prefix, None, token, after, LIST_PAGE)

    async def _sync_catalog(self, job_id: int, spec: JobSpec, handle: MountHandle) -> bool:
        """Sync the job's prefix into the catalog (resuming a run that stopped), holding the
        listing's lease meanwhile and telling its progress in the job's message; a run that
        someone else holds (a `gateway sync`, a re-crawl) is waited for. False when the job
        should list no further: cancelled, its lease lost, or the sync failed (the job too)."""
        catalog = self.loads.catalog
        where = f"{spec.bucket}/{spec.prefix}"
        seen: list[SyncProgress] = []
        stop: list[str] = []

        def progressed(p: SyncProgress) -> None:
            seen.append(p)
            if stop:  # raised inside the crawl, between pages: it keeps its cursor
                raise _Lost(stop[0])

        while not self.stopping:
            run = asyncio.create_task(
                sync_parallel(
                    catalog, handle.id, handle.store, spec.prefix,
                    owner=f"{self.owner}:job{job_id}", on_progress=progressed,
                ),
            )  # fmt: skip
            while not run.done():
                await asyncio.wait([run], timeout=self.lease / 3)
                listed = seen[-1].listed if seen else 0
                note = f"syncing the catalog of {where}: {listed:,} keys listed"
                if not stop and not await self.store.note_listing(
                    job_id, self.owner, self.lease, note
                ):
                    stop.append("the job is no longer active or its listing was taken over")
                if self.stopping and not stop:
                    stop.append("the node is stopping")
            try:
                done = run.result()
            except _Lost:
                return False
            except SyncBusy as exc:
                note = f"waiting for the catalog: {exc}"
                if not await self.store.note_listing(job_id, self.owner, self.lease, note):
                    return False
                await self._sleep(self.lease / 3)
                continue
            except Exception as exc:
                await self.store.fail(job_id, f"syncing the catalog of {where} failed: {exc}")
                return False
            await catalog.refresh()  # this node lists the items from it at once
            note = (
                f"catalog synced: {done.listed:,} keys listed, {done.changed:,} written,"
                f" {done.removed:,} removed"
            )
            log.info("jobs: job %d: %s", job_id, note)
            return await self.store.note_listing(job_id, self.owner, self.lease, note)
        return False

    # -- loading ---------------------------------------------------------------------------

    async def _work(self, job: ActiveJob) -> None:
        """Take shares of this job's batches until none is left for this node."""
        try:
            handle = await self.loads.mount(job.spec.bucket)
        except errors.S3Error:
            return  # not mounted here (yet): the next pass looks again
        while not self.stopping:
            current = await self.store.get(job.id)
            if current is None or current.state not in ACTIVE:
                self._seeded.pop(job.id, None)  # ended: its batches are seeded for good
                return
            members = await self._members()
            live = {m.node.id for m in members if m.live} | {self.me.id}
            ready = batches(current.total_objects, listed=current.state == RUNNING)
            first = self._seeded.get(job.id, 0)
            if ready > first:
                await self.store.seed(job.id, first, ready, self._placement_ids() | {self.me.id})
                self._seeded[job.id] = ready
            # A node still in this node's placement is not taken over, even if the database
            # has lost it (this node would count its blocks as that node's), nor one gone for
            # a short while: a restart, which takes its share up again itself.
            keep = live | self._placement_ids()
            keep |= {m.node.id for m in members if m.gone_for < self.takeover_after}
            row = await self.store.claim(job.id, self.me.id, self.owner, self.lease, keep)
            if row is None:
                if current.state == RUNNING:
                    ended = await self.store.try_finish(job.id, live)
                    if ended is not None:
                        self._seeded.pop(job.id, None)
                        log.info("jobs: job %d ended %s", job.id, ended)
                return
            known = {m.node.id: m.node for m in members}
            departed = [
                known.get(node_id) or Node(node_id, "", 1.0)  # not in the table: any weight
                for node_id in await self.store.batch_nodes(job.id, row.batch)
                if node_id not in self._placement_ids()
            ]
            await self._share(current.spec, handle, row, departed, len(live))

    def _placement(self) -> Placement:
        placement = self.loads.placement()
        return self._alone if placement is None else placement

    def _placement_ids(self) -> set[str]:
        return {n.id for n in self._placement().nodes}

    async def _share(
        self, spec: JobSpec, handle: MountHandle, row: WorkRow, departed: list[Node], nodes: int
    ) -> None:
        """One node's share of one batch, under the lease just taken: this node's, or that of
        a node that has left (one of `departed`: the nodes with a share of the batch that are
        not in the placement now)."""
        items = await self.store.batch_items(row.job_id, row.batch)
        job = _Job(self, spec, handle, row, departed, nodes)
        if row.job_id not in self._counted:
            await self._usage.start(row.job_id, await self.store.node_bytes(row.job_id, self.me.id))
            self._counted.add(row.job_id)
        job.leave_room_for_pins(await self.loads.budget(handle), await self._usage.get(row.job_id))
        # The reporter and the work stop each other by word, not by cancelling: a task
        # cancelled inside a database call can have its cancellation swallowed by the
        # connection pool's reset (SQLAlchemy logs it), and would then never end.
        reporter = asyncio.create_task(self._report(row, job))
        try:
            await job.run(items)
        except _Lost as exc:
            job.halt = job.halt or str(exc)
        finally:
            job.ended = True
            job.progressed.set()
            await asyncio.wait([reporter])
            with contextlib.suppress(OSError):  # kept counted: the budget is only lower
                await self._usage.release(row.job_id)  # what this worker holds unused
        reporter.result()
        stand_in = row.node_id != self.me.id
        if job.halt is not None:
            log.info("jobs: job %d batch %d: %s", row.job_id, row.batch, job.halt)
            if self.stopping or job.back:
                # What is done is written down and the share let go: the restart (or, past
                # the takeover delay, another node) goes on from here, not from the last
                # report, and without waiting for the lease to run out. A stand-in's name
                # stays on it: the node, back, does its share again where reads look.
                with contextlib.suppress(MetaUnavailable):
                    await self.store.report(
                        row, self.owner, self.lease, release=True, stand_in=stand_in
                    )
            return
        row.cursor = len(items)
        await self.store.report(row, self.owner, self.lease, done=True, stand_in=stand_in)

    async def _report(self, row: WorkRow, job: _Job) -> None:
        """Write the share's progress and renew its lease until its work ends; tell the work
        to stop (`job.halt`) when the job is no longer active or the lease is lost."""
        while not job.ended:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(job.progressed.wait(), REPORT_INTERVAL)
            job.progressed.clear()
            if job.ended:
                return
            if row.node_id != self.me.id and row.node_id in self._placement_ids():
                # The node this share is stood in for is back, and reads look for its blocks
                # there again: loading more of them elsewhere is of no use.
                job.back = True
                job.halt = f"{row.node_id} is back: its share is its own again"
                return
            if not await self.store.report(row, self.owner, self.lease):
                active = await self.store.state(row.job_id) in ACTIVE
                job.halt = "its lease was taken over" if active else "the job is no longer active"
                return
            await self._sleep(REPORT_GAP)

    def bucket(self, job_id: int, spec: JobSpec, nodes: int) -> TokenBucket | None:
        if spec.bandwidth is None:
            return None
        rate = spec.bandwidth / max(1, nodes) / self.workers
        found = self._buckets.get(job_id)
        if found is None:
            found = self._buckets[job_id] = TokenBucket(rate)
        elif found.rate != rate:
            found.set_rate(rate)
        return found


class _Job:
    """The work on one share: every block of the batch's objects this share owns, loaded
    (or checked, for --verify) with at most `concurrency` in flight."""

    def __init__(
        self, runner: JobRunner, spec: JobSpec, handle: MountHandle, row: WorkRow,
        departed: list[Node], nodes: int,
    ) -> None:  # fmt: skip
        self.runner = runner
        self.loads = runner.loads
        self.spec = spec
        self.handle = handle
        self.row = row
        self.tally = row.tally
        self.me = runner.me
        self.slots = asyncio.Semaphore(spec.concurrency)
        self.floor = max(1, int(spec.concurrency * PRELOAD_FLOOR))  # loads beside busy clients
        self.progressed = asyncio.Event()  # an object is done: the reporter writes it down
        # Bytes counted in the job's usage for the share up front (its cached blocks, and its
        # missing ones when they fit), not yet taken by a block: given back when it ends.
        self.prepaid = 0  # of the blocks found cached
        self.reserved = 0  # of the blocks to fetch
        self.loaded = (0, 0)  # bytes and objects loaded, for the node's counters at the end
        self.ended = False  # the work is over: the reporter stops
        self.halt: str | None = None  # why the work must stop (the job ended, lease lost)
        self.back = False  # the node this share was stood in for is back: give it up
        self.bucket = runner.bucket(row.job_id, spec, nodes)
        # The batch is shared out over the live nodes and the departed ones that have a share
        # of it: a departed node's share is its own (what it loaded stays on its disk, for when
        # it comes back), or, when it did not finish it, taken over and loaded at the blocks'
        # owners among the live nodes. So no block is the share of two nodes.
        self.now = runner._placement()
        self.batch = (
            Placement([*self.now.nodes, *departed], partitions=self.now.partitions,
                      max_replicas=self.now.max_replicas)
            if departed
            else self.now
        )  # fmt: skip
        self.actor = row.node_id  # whose share: this node's, or a departed one's
        self.live = {n.id for n in self.now.nodes}
        self.alone = self.actor == self.me.id and [n.id for n in self.batch.nodes] == [self.me.id]
        self.budget = 0  # bytes the job may fill on this node: leave_room_for_pins sets it

    def leave_room_for_pins(self, room: FillBudget, used: int) -> None:
        """The mount's quota within the cache's capacity. Pinned blocks are never evicted: the
        job may fill only what the cache holds beside them, or it would make room for more of
        itself by evicting what it loaded. A --pin job's own pins (from before a restart) are
        in `used` already: counted once."""
        self.budget = room.limit
        if room.pinned is None:
            return
        pinned = max(0, room.pinned - used) if self.spec.pin else room.pinned
        self.budget = min(self.budget, max(0, room.capacity - pinned))

    async def run(self, items: list[Item]) -> None:
        """Every item from the cursor on: planned first (each block's roles, and which of
        this node's are on its disk: one look for the share), counted against the budget at
        once, then loaded. An item's counts join the share's when the cursor passes it, so
        that what is written down is exactly the items before the cursor, and a share taken
        up again (after a restart, or by another node) counts nothing twice."""
        todo = range(self.row.cursor, len(items))
        plans = {pos: self.plan(items[pos]) for pos in todo} if not self.spec.unpin else {}
        counted: dict[int, Tally] = {}

        async def one(pos: int) -> None:
            counted[pos] = await self.item(items[pos], plans.pop(pos, []))
            while self.row.cursor < len(items) and self.row.cursor in counted:
                self.tally.add(counted.pop(self.row.cursor))
                self.row.cursor += 1
            self.progressed.set()

        try:
            await self.prepare([p for plan in plans.values() for p in plan])
            ends = await asyncio.gather(*(one(pos) for pos in todo), return_exceptions=True)
        finally:
            await self.settle()
        for end in ends:  # every object in flight has ended: none is left half loaded
            if isinstance(end, BaseException):
                raise end

    def plan(self, item: Item) -> list[_Planned]:
        """Every block of the item with its roles in this share (pure: no I/O)."""
        info = listed_info(item.key, item.size, item.etag)
        count = max(1, -(-item.size // self.handle.block_size))
        return [
            _Planned(self.loads.block(self.handle, info, index), *self.roles(info, index))
            for index in range(count)
        ]

    async def prepare(self, planned: list[_Planned]) -> None:
        """Look for the share's blocks on this node's disk in one go, and count them in the
        job's usage at once: the cached ones, and the missing ones if they all fit its budget
        (else each is counted as it is fetched, so that near the budget the count is exact).
        The bookkeeping of a share, not of each block: a load of small objects paid it per
        block."""
        if self.spec.metadata_only:
            return
        mine = [p for p in planned if any(n.id == self.me.id for n in p.targets)]
        if not mine:
            return
        found = await self.loads.present_all([p.block for p in mine])
        for p, there in zip(mine, found, strict=True):
            p.present = there
        if self.spec.verify:
            return
        usage, job_id = self.runner._usage, self.row.job_id
        cached = sum(p.block.on_disk for p in mine if p.present)
        missing = sum(p.block.on_disk for p in mine if not p.present)
        whole = missing and not self.row.tally.full
        if whole and await usage.reserve(job_id, cached + missing, self.budget):
            self.prepaid, self.reserved = cached, missing
            return
        if cached:
            await usage.add(job_id, cached, self.budget)
            self.prepaid = cached

    async def settle(self) -> None:
        """Give back what the share counted up front for blocks it did not reach, and add
        what it loaded to the node's counters."""
        unused, self.prepaid, self.reserved = self.prepaid + self.reserved, 0, 0
        if unused:
            await self.runner._usage.add(self.row.job_id, -unused)
        loaded, objects = self.loaded
        if loaded:
            counters.job_loaded(loaded, objects)
        self.loaded = (0, 0)

    async def take(self, size: int) -> bool:
        """Count a block about to be fetched: from what the share reserved, else from the
        job's usage if it fits the budget."""
        if self.reserved >= size:
            self.reserved -= size
            return True
        return await self.runner._usage.reserve(self.row.job_id, size, self.budget)

    def check(self) -> None:
        """Raise _Lost when no more blocks are to be loaded."""
        if self.runner.stopping:
            raise _Lost("the node is stopping")
        if self.halt is not None:
            raise _Lost(self.halt)

    async def item(self, item: Item, plan: list[_Planned]) -> Tally:
        if self.spec.unpin:
            return await unpin.item(self, self.loads, self.runner.store, item)
        t = Tally()
        handle, spec = self.handle, self.spec
        mine = [p for p in plan if p.targets]
        if not mine:
            return t
        first_of_object = plan[0].first
        if self.loads.changed(handle, item.key, item.etag) and not spec.verify:
            if not spec.refresh:
                if first_of_object:
                    t.skipped += 1
                return t
            self.loads.forget(handle, item.key)  # drop the old version, load the new
        try:
            if spec.metadata_only:
                if first_of_object:
                    async with self.slots:
                        await self.loads.current(handle, item.key)
                    t.objects += 1
                    t.bytes += item.size
                return t
            if len(mine) == 1:  # most objects: no task for its one block
                results = [await self.block(t, mine[0])]
            else:
                results = await asyncio.gather(*(self.block(t, p) for p in mine))
        except (errors.S3Error, VersionChanged, FillFailed, PeerUnavailable, OSError) as exc:
            t.failures += 1
            message = f"{type(exc).__name__}: {exc}".rstrip(": ")
            with contextlib.suppress(MetaUnavailable):
                await self.runner.store.add_error(self.row.job_id, self.me.id, item.key, message)
            return t
        if all(ok for ok, _ in results):
            if any(fetched for _, fetched in results):
                t.loaded_objects += 1
            else:
                t.cached_objects += 1
            if first_of_object and mine[0].block.index == 0 and results[0][0]:
                t.objects += 1
        return t

    def roles(self, info: ObjectInfo, index: int) -> tuple[list[Node], bool, Node | None]:
        """Where this share loads the block (empty: not this share's); whether the share is
        the block's first owner (whose counts the job's progress adds up); and, for a replica
        (--replicas), the first owner to copy it from rather than from the store."""
        if self.alone:  # every block is this node's, its first owner's
            return [self.me], True, None
        replicas, mount = self.spec.replicas, self.handle.id
        then = warm.owners(self.batch, mount, info, index, replicas)
        if all(n.id != self.actor for n in then):
            return [], False, None
        first = then[0].id == self.actor
        if self.actor == self.me.id:
            source = None if first or then[0].id not in self.live else then[0]
            return [self.me], first, source
        now = warm.owners(self.now, mount, info, index, replicas)
        had = {n.id for n in then}
        return [n for n in now if n.id not in had], first, None

    async def block(self, t: Tally, p: _Planned) -> tuple[bool, bool]:
        """Load (or check) one block at its targets: (whether it is in place, fetched now)."""
        block = p.block
        ok, fetched = True, False
        for node in p.targets:
            if node.id == self.me.id:
                here, got = await self.here(t, p)
                ok, fetched = ok and here, fetched or got
            elif self.spec.verify:
                ok = False  # a peer's cache is the peer's to count
            else:
                self.check()
                async with self.slots:
                    if self.bucket is not None:
                        await self.bucket.take(block.length)
                    await self.loads.warm_at(node, block, self.spec.pin)
                t.loaded_bytes += block.length
                fetched = True
        if ok and p.first:
            t.bytes += block.length
        return ok, fetched

    async def here(self, t: Tally, p: _Planned) -> tuple[bool, bool]:
        """The block on this node: counted as cached if it was on the disk when the share
        began (and counted then), else fetched."""
        loads, job_id, block = self.loads, self.row.job_id, p.block
        length, on_disk = block.length, block.on_disk
        if p.present:
            if self.spec.pin:
                await loads.pin(block)
            if not self.spec.verify:
                self.prepaid -= on_disk  # counted by prepare()
            t.cached_bytes += length
            return True, False
        if self.spec.verify:
            return False, False
        usage = self.runner._usage
        async with self.slots:
            self.check()
            if self.row.tally.full or not await self.take(on_disk):
                # Never evict what this job loaded (or pinned data) to make room for more.
                self.row.tally.full = True
                return False, False
            if self.bucket is not None and p.source is None:  # a copy from a peer is no WAN's
                await self.bucket.take(length)
                if self.runner.stopping or self.halt is not None:
                    await usage.add(job_id, -on_disk)
                    self.check()
            await self.runner.yield_to_clients(self.floor)
            self.check()
            self.runner.own_fills += 1
            try:
                await loads.warm(block, self.spec.pin, p.source)
            finally:
                self.runner.own_fills -= 1
        if not await loads.kept(block):
            await usage.add(job_id, -on_disk)
            t.unkept_bytes += length
            self.row.tally.full = True  # the disk's free-space floor: stop filling here
            return False, True
        t.loaded_bytes += length
        loaded, objects = self.loaded
        self.loaded = (loaded + length, objects + (block.index == 0))
        return True, True
