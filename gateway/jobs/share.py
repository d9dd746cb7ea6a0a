"""A node's share of one batch of a preload job (gateway/jobs/runner.py takes the shares):
its blocks planned (where each is loaded, whether it is on this node's disk), counted against
the job's budget on the node, and loaded (or checked, for --verify) under the job's
concurrency, the objects done written down in order by the cursor the runner reports."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Protocol

from gateway import counters, errors
from gateway.cache import FillFailed
from gateway.cluster import Node, PeerUnavailable, Placement
from gateway.jobs import unpin, warm
from gateway.jobs.bandwidth import Bucket
from gateway.jobs.db import Item, JobStore, Tally, WorkRow
from gateway.jobs.model import JobSpec
from gateway.jobs.usage import NodeUsage
from gateway.meta import MetaUnavailable
from gateway.service import Block, FillBudget, Loads, MountHandle, listed_info
from gateway.stores import ObjectInfo, VersionChanged


class Runner(Protocol):
    """What of the node's job loop (gateway/jobs/runner.py, JobRunner) a share uses."""

    store: JobStore
    loads: Loads
    me: Node
    stopping: bool
    stopped: asyncio.Event  # set with `stopping`: what waits for the node's stop wakes
    workers: int  # the node's worker processes, each with a runner
    own_fills: int  # the page store's fills in flight that are this process's preloads
    usage: NodeUsage

    def placement(self) -> Placement: ...

    def bucket(self, job_id: int, spec: JobSpec, nodes: int) -> Bucket | None: ...

    async def yield_to_clients(self, floor: int = 0) -> None: ...


# The share of a job's concurrency that goes on while clients fetch: a store far away is
# bound by its round trip, not its bandwidth, so a preload that stopped for every busy moment
# of an epoch warmed nothing ahead of it (the load moved 0.08x the WAN during epoch 1:
# docs/performance.md, "epochs --preload").
PRELOAD_FLOOR = 0.5


class Slots:
    """A job's limits in one worker process, shared by the shares it works on: `fetching`,
    its blocks on their way in (its part of --concurrency: what the store sees); `unsettled`,
    twice that, its blocks fetched or being fetched and not yet committed. A block gives its
    fetching slot back once its bytes are all in, while its fill commits them (a cache-io
    thread's write, rename and key record: ~5-7 ms a block at ~500 blocks a second, a fifth
    of a 100 KiB object's time over a 20 ms WAN; docs/performance.md), so the next fetch does
    not wait for the disk; the bytes held by commits still to come stay bounded."""

    def __init__(self, concurrency: int) -> None:
        self.fetching = asyncio.Semaphore(concurrency)
        self.unsettled = asyncio.Semaphore(2 * concurrency)


def per_worker(concurrency: int, workers: int) -> int:
    """A job's fetches in flight in one of a node's `workers` processes: `--concurrency` is
    the node's (each worker loads shares of its own), so each takes its part, at least one."""
    return max(1, -(-concurrency // max(1, workers)))


@dataclass(slots=True)
class Planned:
    """A block of an item as its share plans it: where the share loads it (empty: not this
    share's), whether the share is its first owner (whose counts the job's progress adds
    up), for a replica (--replicas) the first owner to copy it from rather than from the
    store, and whether it was on this node's disk when the share began."""

    block: Block
    targets: list[Node]
    first: bool
    source: Node | None
    present: bool = False


class Lost(Exception):
    """The share's lease is gone (taken over), or its job is no longer active."""


class BatchShare:
    """The work on one share: every block of the batch's objects this share owns, loaded
    (or checked, for --verify) with at most `concurrency` in flight."""

    def __init__(
        self, runner: Runner, spec: JobSpec, handle: MountHandle, row: WorkRow,
        departed: list[Node], nodes: int, slots: Slots | None = None,
    ) -> None:  # fmt: skip
        self.runner = runner
        self.loads = runner.loads
        self.spec = spec
        self.handle = handle
        self.row = row
        self.tally = row.tally
        self.me = runner.me
        # The job's fetches in flight in this process, with the other shares it works on.
        self.concurrency = per_worker(spec.concurrency, runner.workers)
        self.slots = slots or Slots(self.concurrency)
        # Every item has started (no more than the slots are left) or the share ended: the
        # runner takes its next share.
        self.started = asyncio.Event()
        self.floor = max(1, int(self.concurrency * PRELOAD_FLOOR))  # loads beside busy clients
        self.progressed = asyncio.Event()  # an object is done: the reporter writes it down
        # Bytes counted in the job's usage for the share up front (its cached blocks, and its
        # missing ones when they fit), not yet taken by a block: given back when it ends.
        self.prepaid = 0  # of the blocks found cached
        self.reserved = 0  # of the blocks to fetch
        self.loaded = (0, 0)  # bytes and objects loaded, for the node's counters at the end
        self.ended = False  # the work is over: the reporter stops
        self.halt: str | None = None  # why the work must stop (the job ended, lease lost)
        self.halted = asyncio.Event()  # set with `halt` (stop()): what waits for it wakes
        self.back = False  # the node this share was stood in for is back: give it up
        self.bucket = runner.bucket(row.job_id, spec, nodes)
        # The batch is shared out over the live nodes and the departed ones that have a share
        # of it: a departed node's share is its own (what it loaded stays on its disk, for when
        # it comes back), or, when it did not finish it, taken over and loaded at the blocks'
        # owners among the live nodes. So no block is the share of two nodes.
        self.now = runner.placement()
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
        left = len(todo)
        if left <= self.concurrency:
            self.started.set()

        async def one(pos: int) -> None:
            nonlocal left
            counted[pos] = await self.item(items[pos], plans.pop(pos, []))
            while self.row.cursor < len(items) and self.row.cursor in counted:
                self.tally.add(counted.pop(self.row.cursor))
                self.row.cursor += 1
            self.progressed.set()
            left -= 1
            if left <= self.concurrency:
                self.started.set()

        try:
            await self.prepare([p for plan in plans.values() for p in plan])
            ends = await asyncio.gather(*(one(pos) for pos in todo), return_exceptions=True)
        finally:
            await self.settle()
        for end in ends:  # every object in flight has ended: none is left half loaded
            if isinstance(end, BaseException):
                raise end

    def plan(self, item: Item) -> list[Planned]:
        """Every block of the item with its roles in this share (pure: no I/O)."""
        info = listed_info(item.key, item.size, item.etag)
        count = max(1, -(-item.size // self.handle.block_size))
        return [
            Planned(self.loads.block(self.handle, info, index), *self.roles(info, index))
            for index in range(count)
        ]

    async def prepare(self, planned: list[Planned]) -> None:
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
        usage, job_id = self.runner.usage, self.row.job_id
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
            await self.runner.usage.add(self.row.job_id, -unused)
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
        return await self.runner.usage.reserve(self.row.job_id, size, self.budget)

    def check(self) -> None:
        """Raise Lost when no more blocks are to be loaded."""
        if self.runner.stopping:
            raise Lost("the node is stopping")
        if self.halt is not None:
            raise Lost(self.halt)

    def stop(self, why: str) -> None:
        """No more blocks: `why` (the first reason given stays), said to what waits."""
        if self.halt is None:
            self.halt = why
        self.halted.set()

    async def bandwidth(self, bucket: Bucket, size: int) -> None:
        """`size` bytes taken from the job's bucket, waiting for them as long as its rate says
        (a block in debt at a low --bandwidth: minutes), unless the share stops or the node
        does first: Lost then, at once. A wait of no byte fetched yet is not a load in flight
        that a stop or a cancel lets end (its bytes stay taken: the bucket's rate holds)."""
        self.check()
        take = asyncio.ensure_future(bucket.take(size))
        halted = asyncio.ensure_future(self.halted.wait())
        stopped = asyncio.ensure_future(self.runner.stopped.wait())
        try:
            await asyncio.wait((take, halted, stopped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in (take, halted, stopped):
                waiter.cancel()
        if not take.done() or take.cancelled():
            self.check()  # the share or the node stopped: Lost
        take.result()

    async def item(self, item: Item, plan: list[Planned]) -> Tally:
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
                    async with self.slots.fetching:
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

    async def block(self, t: Tally, p: Planned) -> tuple[bool, bool]:
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
                async with self.slots.fetching:
                    if self.bucket is not None:
                        await self.bandwidth(self.bucket, block.length)
                    await self.loads.warm_at(node, block, self.spec.pin)
                t.loaded_bytes += block.length
                fetched = True
        if ok and p.first:
            t.bytes += block.length
        return ok, fetched

    async def here(self, t: Tally, p: Planned) -> tuple[bool, bool]:
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
        usage, runner, slots = self.runner.usage, self.runner, self.slots
        async with slots.unsettled:
            async with slots.fetching:
                self.check()
                if self.row.tally.full or not await self.take(on_disk):
                    # Never evict what this job loaded (or pinned data) to make room for more.
                    self.row.tally.full = True
                    return False, False
                if self.bucket is not None and p.source is None:  # a peer's copy: no WAN's
                    try:
                        await self.bandwidth(self.bucket, length)
                        self.check()  # stopped as the wait ended
                    except Lost:
                        await usage.add(job_id, -on_disk)
                        raise
                await runner.yield_to_clients(self.floor)
                self.check()
                runner.own_fills += 1  # until committed: the page store counts it till then
                try:
                    filled = await loads.fetch(block, self.spec.pin, p.source)
                except BaseException:
                    runner.own_fills -= 1
                    raise
            try:
                await loads.committed(filled)  # the next fetch is under way meanwhile
            finally:
                runner.own_fills -= 1
        if not await loads.kept(block):
            await usage.add(job_id, -on_disk)
            t.unkept_bytes += length
            self.row.tally.full = True  # the disk's free-space floor: stop filling here
            return False, True
        t.loaded_bytes += length
        loaded, objects = self.loaded
        self.loaded = (loaded + length, objects + (block.index == 0))
        return True, True
