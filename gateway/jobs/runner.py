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
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from gateway import counters, errors
from gateway.catalog import SyncBusy, SyncProgress, sync_parallel
from gateway.cluster import Node, Placement
from gateway.jobs.bandwidth import FOLDER as BANDWIDTH_FOLDER
from gateway.jobs.bandwidth import Bucket, NodeBucket
from gateway.jobs.db import ActiveJob, Item, JobStore, WorkRow, batches
from gateway.jobs.model import ACTIVE, LISTING, QUEUED, RUNNING, JobSpec
from gateway.jobs.share import BatchShare, Lost, Slots, per_worker
from gateway.jobs.usage import FOLDER as USAGE_FOLDER
from gateway.jobs.usage import NodeUsage
from gateway.meta import MetaUnavailable
from gateway.service import Loads, MountHandle
from gateway.stores import ListPage

log = logging.getLogger(__name__)

# Fetches from the store by this node's clients in flight at which preload slows down to its
# floor (a client's miss never queues behind preload work: it has slots of its own; this keeps
# preload from taking most of the store's bandwidth while clients wait on it).
FOREGROUND_BUSY = 4

LIST_PAGE = 1000
# Shares of a job one process works on at once: the next one starts as the last one's final
# fetches are in flight (JobRunner._work).
SHARES_AT_ONCE = 2
REPORT_INTERVAL = 0.5  # seconds between a share's lease renewals at the latest
# Progress is written within this long of an object being done, so that a node killed mid-job
# leaves little done-but-unrecorded work for the node that takes its share over.
REPORT_GAP = 0.1
# A job's files on a node (its usage count, its bandwidth bucket) go when it ends: with the
# node's last look at it (`_ended`), else by a sweep of the files of jobs not active, every
# this many seconds, that spares a file changed within as long (one a job just submitted has
# made, before this process saw the job).
SWEEP_INTERVAL = 60.0


# The shares of a job this process works on, by (batch, node): the task, the share.
Shares = dict[tuple[int, str], tuple[asyncio.Task[None], BatchShare]]


@dataclass(frozen=True, slots=True)
class Member:
    """A node as the database knows it: what the runner needs to take over its share."""

    node: Node
    live: bool
    gone_for: float = 0.0  # seconds since its last heartbeat, when it is not live


Members = Callable[[], Awaitable[Sequence[Member]]]


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
        # Each worker process of the node runs a runner: the node's share of a job's
        # concurrency is split between them; its bandwidth they share (NodeBucket).
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
        self._swept_at: float | None = None  # the loop's time of the last sweep of job files
        # Bytes each job's blocks take in this node's cache, counted with the node's other
        # workers: the budget is the node's.
        self.usage = NodeUsage(loads.cache_root)
        self._counted: set[int] = set()  # jobs whose count this process has started
        self._buckets: dict[int, Bucket] = {}
        self._wake = asyncio.Event()
        # Set (and replaced by a new one) each time this process's listing adds items: a
        # worker whose shares are all in flight and found none free asks again at once.
        self._listed = asyncio.Event()
        self.stopping = False
        self.stopped = asyncio.Event()  # set with `stopping`
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
        self.stopped.set()  # a share waiting for its job's bandwidth stops waiting
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
        active = await self.store.active()
        now = asyncio.get_running_loop().time()
        if self._swept_at is None or now - self._swept_at >= SWEEP_INTERVAL:
            self._swept_at = now
            ids = {job.id for job in active}
            folders = [os.path.join(self.loads.cache_root, f) for f in _JOB_FOLDERS]
            try:
                swept = await asyncio.to_thread(sweep_job_files, folders, ids, SWEEP_INTERVAL)
            except OSError as exc:
                log.warning("jobs: could not sweep the files of ended jobs: %s", exc)
            else:
                if swept:
                    log.info("jobs: removed %d files of jobs that ended", swept)
        for job in active:
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
            self._listed.set()
            self._listed = asyncio.Event()
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
                raise Lost(stop[0])

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
            except Lost:
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
        """Take shares of this job's batches until none is left for this node: the next one
        as soon as every item of the last has started (its last fetches hold their slots),
        so that the job's `concurrency` fetches stay in flight across the batches' ends (a
        batch waited for its slowest object, then for its report and the next claim: ~20 %
        of a load's time over a WAN; docs/performance.md). At most SHARES_AT_ONCE shares of a
        job are worked on at once by this process, their fetches under one concurrency."""
        try:
            handle = await self.loads.mount(job.spec.bucket)
        except errors.S3Error:
            return  # not mounted here (yet): the next pass looks again
        shares: Shares = {}
        slots = Slots(per_worker(job.spec.concurrency, self.workers))
        try:
            await self._claims(job, handle, shares, slots)
        except asyncio.CancelledError:
            for task, _ in shares.values():
                task.cancel()
            raise
        finally:
            if shares:  # each ends on its own (a stop, a lost lease), or as cancelled above
                await asyncio.wait([task for task, _ in shares.values()])
            for task, _ in shares.values():
                if not task.cancelled() and task.exception() is not None:
                    log.error("jobs: job %d: a share failed", job.id, exc_info=task.exception())

    async def _claims(
        self, job: ActiveJob, handle: MountHandle,
        shares: Shares, slots: Slots,
    ) -> None:  # fmt: skip
        """_work's loop: `shares` holds the ones started and not yet seen to end."""
        while not self.stopping:
            for key, (task, _) in list(shares.items()):
                if task.done():
                    del shares[key]
                    task.result()  # a share that failed ends the work (guarded logs it)
            listed = self._listed  # set once this process lists more after this look
            current = await self.store.get(job.id)
            if current is None or current.state not in ACTIVE:
                await self._ended(job.id)
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
            row = await self.store.claim(
                job.id, self.me.id, self.owner, self.lease, keep, holding=list(shares)
            )
            if row is None:
                if shares:
                    # None free, ours in flight: ask again when one of them ends (a failed
                    # one gives its share back), when this process lists more batches, or
                    # after a poll (another node's listing, a share another node gave back).
                    more = asyncio.ensure_future(listed.wait())
                    ours = [task for task, _ in shares.values()]
                    try:
                        await asyncio.wait([*ours, more], timeout=self.poll,
                                           return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
                    finally:
                        more.cancel()
                    continue
                if current.state == RUNNING:
                    ended = await self.store.try_finish(job.id, live)
                    if ended is not None:
                        await self._ended(job.id)
                        log.info("jobs: job %d ended %s", job.id, ended)
                return
            known = {m.node.id: m.node for m in members}
            departed = [
                known.get(node_id) or Node(node_id, "", 1.0)  # not in the table: any weight
                for node_id in await self.store.batch_nodes(job.id, row.batch)
                if node_id not in self._placement_ids()
            ]
            share = BatchShare(self, current.spec, handle, row, departed, len(live), slots)
            task = asyncio.create_task(self._share(share))
            shares[(row.batch, row.node_id)] = (task, share)
            # The next share once this one's every item has started (set too when it ends),
            # and while fewer than SHARES_AT_ONCE are worked on.
            await share.started.wait()
            while len(shares) >= SHARES_AT_ONCE:
                await asyncio.wait([t for t, _ in shares.values()],
                                   return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
                for key, (done, _) in list(shares.items()):
                    if done.done():
                        del shares[key]
                        done.result()

    def placement(self) -> Placement:
        placement = self.loads.placement()
        return self._alone if placement is None else placement

    def _placement_ids(self) -> set[str]:
        return {n.id for n in self.placement().nodes}

    async def _share(self, job: BatchShare) -> None:
        """One node's share of one batch, under the lease just taken: this node's, or that of
        a node that has left (one of the job's `departed`: the nodes with a share of the batch
        that are not in the placement now)."""
        try:
            await self._share_work(job)
        finally:
            job.started.set()

    async def _share_work(self, job: BatchShare) -> None:
        row, handle = job.row, job.handle
        items = await self.store.batch_items(row.job_id, row.batch)
        if row.job_id not in self._counted:
            await self.usage.start(row.job_id, await self.store.node_bytes(row.job_id, self.me.id))
            self._counted.add(row.job_id)
        job.leave_room_for_pins(await self.loads.budget(handle), await self.usage.get(row.job_id))
        # The reporter and the work stop each other by word, not by cancelling: a task
        # cancelled inside a database call can have its cancellation swallowed by the
        # connection pool's reset (SQLAlchemy logs it), and would then never end.
        reporter = asyncio.create_task(self._report(row, job))
        try:
            await job.run(items)
        except Lost as exc:
            job.stop(str(exc))
        finally:
            job.ended = True
            job.progressed.set()
            await asyncio.wait([reporter])
            with contextlib.suppress(OSError):  # kept counted: the budget is only lower
                await self.usage.release(row.job_id)  # what this worker holds unused
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

    async def _report(self, row: WorkRow, job: BatchShare) -> None:
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
                job.stop(f"{row.node_id} is back: its share is its own again")
                return
            if not await self.store.report(row, self.owner, self.lease):
                active = await self.store.state(row.job_id) in ACTIVE
                job.stop("its lease was taken over" if active else "the job is no longer active")
                return
            await self._sleep(REPORT_GAP)

    async def _ended(self, job_id: int) -> None:
        """The job ended: its batches are seeded for good, its bucket closed here, and its
        files on the node removed, its count of bytes said (a sibling still at work on it
        makes a file again: swept)."""
        self._seeded.pop(job_id, None)
        bucket = self._buckets.pop(job_id, None)
        if bucket is not None:
            bucket.close()
        try:
            counted = await self.usage.forget(job_id)
            with contextlib.suppress(FileNotFoundError):
                await asyncio.to_thread(os.unlink, _bandwidth_path(self.loads.cache_root, job_id))
        except OSError as exc:
            log.warning("jobs: job %d: its files on this node stay (swept later): %s", job_id, exc)
            return
        if counted is not None:
            log.info("jobs: job %d ended: its blocks counted %d bytes on this node",
                     job_id, counted)  # fmt: skip

    def bucket(self, job_id: int, spec: JobSpec, nodes: int) -> Bucket | None:
        """The job's bandwidth on this node (its share of the fleet's), shared by the node's
        worker processes: whichever of them load, together they move at the node's share."""
        if spec.bandwidth is None:
            return None
        rate = spec.bandwidth / max(1, nodes)
        found = self._buckets.get(job_id)
        if found is None:
            path = _bandwidth_path(self.loads.cache_root, job_id)
            found = NodeBucket(path, rate, alone=1 / self.workers)
            self._buckets[job_id] = found
        elif found.rate != rate:
            found.set_rate(rate)
        return found


def _bandwidth_path(cache_root: str, job_id: int) -> str:
    """The file of the job's bucket on this node (NodeBucket), under the cache folder."""
    return os.path.join(cache_root, BANDWIDTH_FOLDER, str(job_id))


_JOB_FOLDERS = (USAGE_FOLDER, BANDWIDTH_FOLDER)


def sweep_job_files(folders: Sequence[str], active: set[int], spare_age: float) -> int:
    """Remove the files named by a job id not in `active` (ended, or of a database this cache
    outlived: a new job of the same id would take its count up) and not changed within
    `spare_age` seconds; how many went."""
    removed = 0
    now = time.time()
    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            continue
        for entry in entries:
            if not entry.name.isdigit() or int(entry.name) in active:
                continue
            with contextlib.suppress(FileNotFoundError):
                if now - entry.stat().st_mtime < spare_age:
                    continue
                os.unlink(entry.path)
                removed += 1
    return removed
