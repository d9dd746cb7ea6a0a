"""An unpin job's work on one object (`gateway load --unpin`): every node takes the pin off
every block of the object it has on its disk, whoever owns the block now. Pins are where a
load put them, which a later placement no longer says (a node joined, `--replicas`), so each
node looks for every block rather than only for those it owns; a look is one stat.

An unpin of a whole mount (no prefix, no --include or --exclude) also takes off every other
pin of the mount on each node: those of versions no listing names any more (an object
overwritten at the origin since its load) and of another block size. Their blocks are not in
the job's counts (the node cannot name them); the janitor counts them.

A node's share taken over after it left cannot reach that node's disk: its objects count as
failed (the job ends partial), and the pins stay there until an unpin runs while it is up.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from gateway.cluster import Node, Placement
from gateway.cluster.placement import owner_key
from gateway.jobs.db import BATCH, Item, JobStore, Tally, WorkRow
from gateway.jobs.model import JobSpec
from gateway.service import Loads, MountHandle


class Slots(Protocol):
    """The job's limits in the worker (share.Slots): an unpin takes a fetch's slot."""

    fetching: asyncio.Semaphore


class Share(Protocol):
    """What of the runner's share of a batch the unpin needs."""

    spec: JobSpec
    handle: MountHandle
    batch: Placement  # the placement the batch was shared out under
    actor: str  # whose share: this node's, or a departed node's
    me: Node
    row: WorkRow

    @property
    def slots(self) -> Slots: ...

    def check(self) -> None: ...


async def item(share: Share, loads: Loads, store: JobStore, listed: Item) -> Tally:
    """Unpin the object's blocks found on this node. The counts: `objects` and `bytes` by the
    first owner of each block (the job's progress, as a load counts it), `cached_objects` and
    `cached_bytes` the blocks found here and unpinned (their data bytes)."""
    t = Tally()
    handle = share.handle
    size = handle.block_size
    count = max(1, -(-listed.size // size))
    for index in range(count):
        placed = owner_key(handle.id, listed.key, listed.etag, index)
        if share.batch.owners(placed, 1)[0].id == share.actor:
            t.bytes += min(size, listed.size - index * size)
            if index == 0:
                t.objects += 1
    if share.actor != share.me.id:
        t.failures += 1
        if listed.seq % BATCH == 0:  # the batch's first: one error a share, not one a key
            await store.add_error(
                share.row.job_id, share.me.id, listed.key,
                f"node {share.actor} is gone: the pins on its disk stay (unpin again when it"
                " is back)",
            )  # fmt: skip
        return t
    share.check()
    spec = share.spec
    # Every node has a share of the first batch: each unpins the whole mount once.
    whole = not (spec.prefix or spec.include or spec.exclude) and listed.seq == 0
    async with share.slots.fetching:
        done = await loads.unpin(handle, listed.key, listed.etag, count, whole)
    if done.trouble is not None:  # the pins stay
        t.failures += 1
        await store.add_error(share.row.job_id, share.me.id, listed.key, done.trouble)
    for index in done.indices:
        t.cached_objects += 1
        t.cached_bytes += min(size, listed.size - index * size)
    return t
