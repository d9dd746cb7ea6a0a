"""Jobs in the database: submitting, listing into work items, taking a node's share of a batch
under a lease, reporting progress, ending. Leases run by the database's clock, as the upload
leases of gateway/meta/uploads.py do, so no node's clock decides whose lease ran out."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from gateway.jobs.model import (
    ACTIVE,
    CANCELLED,
    DONE,
    FAILED,
    LISTING,
    PARTIAL,
    QUEUED,
    RUNNING,
    STATES,
    JobError,
    JobSpec,
    JobView,
    NodeProgress,
)
from gateway.meta.store import transaction
from gateway.meta.tables import job_errors, job_items, job_work, jobs, mounts

BATCH = 128  # work items per batch: a node takes its share of one batch at a time
MAX_ERRORS = 20  # errors kept per job: the first ones, with their keys
PENDING, LEASED, WORK_DONE = "pending", "leased", "done"
_SQLITE_TIME = "%Y-%m-%d %H:%M:%f"


class UnknownBucket(ValueError):
    """No mount serves the bucket a job was asked for."""


@dataclass(frozen=True, slots=True)
class Item:
    """One object of a job, as its listing found it."""

    seq: int
    key: str
    size: int
    etag: str


@dataclass(frozen=True, slots=True)
class ActiveJob:
    id: int
    spec: JobSpec
    state: str
    total_objects: int
    listing_lease_lapsed: bool  # no node holds the listing (queued, or its lister died)


@dataclass(slots=True)
class Tally:
    """One (batch, node) row's counters, as its worker keeps them."""

    objects: int = 0
    bytes: int = 0
    loaded_objects: int = 0
    loaded_bytes: int = 0
    cached_objects: int = 0
    cached_bytes: int = 0
    skipped: int = 0
    failures: int = 0
    unkept_bytes: int = 0
    full: bool = False

    def values(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def add(self, other: Tally) -> None:
        """Add another's counts (`full` is the share's, set on it directly)."""
        for name in _COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))


_TALLY = tuple(f.name for f in fields(Tally))
_COUNTS = tuple(name for name in _TALLY if name != "full")


@dataclass(slots=True)
class WorkRow:
    """A node's share of a batch, taken under a lease by `owner` (possibly for another node)."""

    job_id: int
    batch: int
    node_id: str
    cursor: int
    tally: Tally


def batches(total_items: int, listed: bool) -> int:
    """Batches ready for work: only whole ones while the listing goes on."""
    return -(-total_items // BATCH) if listed else total_items // BATCH


def stood_in(node_id: str, lease_owner: str | None) -> bool:
    """Whether a share of `node_id` was held by another node: a lease holder is named
    `<node id>:...` (JobRunner.owner), and the node's own ending or giving up clears it."""
    return lease_owner is not None and not lease_owner.startswith(f"{node_id}:")


class JobStore:
    """The jobs tables over the gateway's database engine."""

    def __init__(
        self,
        engine: AsyncEngine,
        live_nodes: Callable[[AsyncConnection], Awaitable[set[str]]] | None = None,
    ) -> None:
        self._engine = engine
        # The fleet's nodes live now, read in a transaction of this store's (the node
        # registry's `live_ids`); None: one node, no fleet.
        self._live_nodes = live_nodes

    @property
    def dialect(self) -> str:
        return self._engine.dialect.name

    def _clock(self, ahead: float = 0.0) -> sa.ColumnElement[Any]:
        if self.dialect == "postgresql":
            return sa.func.now() + sa.literal(timedelta(seconds=ahead))
        return sa.func.strftime(_SQLITE_TIME, "now", f"{ahead:+.3f} seconds")

    def _insert(self, table: sa.Table) -> Any:
        return (postgresql.insert if self.dialect == "postgresql" else sqlite.insert)(table)

    # -- what the CLI and the API do ---------------------------------------------------------

    async def submit(self, spec: JobSpec, submitted_by: str) -> int:
        """A new queued job; UnknownBucket when no mount serves its bucket."""
        async with transaction(self._engine) as conn:
            found = await conn.execute(sa.select(mounts.c.id).where(mounts.c.bucket == spec.bucket))
            if found.first() is None:
                raise UnknownBucket(f"bucket {spec.bucket!r} is not mounted")
            values = {
                "bucket": spec.bucket,
                "prefix": spec.prefix,
                "spec": json.dumps(spec.to_json()),
                "state": QUEUED,
                "submitted_by": submitted_by,
                "submitted_at": datetime.now(UTC),
            }
            result = await conn.execute(sa.insert(jobs).values(values).returning(jobs.c.id))
            return int(result.scalar_one())

    async def get(self, job_id: int) -> JobView | None:
        found = await self._views(jobs.c.id == job_id, limit=1, details=True)
        return found[0] if found else None

    async def recent(self, limit: int = 50, states: Iterable[str] = STATES) -> list[JobView]:
        """The newest jobs first."""
        return await self._views(jobs.c.state.in_(list(states)), limit=limit, details=False)

    async def cancel(self, job_id: int) -> JobView | None:
        """Cancel a job that has not ended (an ended one is left as it is)."""
        query = (
            sa.update(jobs)
            .where(jobs.c.id == job_id, jobs.c.state.in_(ACTIVE))
            .values(state=CANCELLED, ended_at=datetime.now(UTC), message="cancelled",
                    lease_owner=None, lease_expires=None)
        )  # fmt: skip
        async with transaction(self._engine) as conn:
            await conn.execute(query)
        return await self.get(job_id)

    async def _views(self, where: Any, *, limit: int, details: bool) -> list[JobView]:
        query = sa.select(jobs).where(where).order_by(jobs.c.id.desc()).limit(limit)
        async with transaction(self._engine) as conn:
            rows = (await conn.execute(query)).mappings().all()
            ids = [row["id"] for row in rows]
            sums = [sa.func.sum(job_work.c[name]).label(name) for name in _TALLY if name != "full"]
            progress = (
                await conn.execute(
                    sa.select(
                        job_work.c.job_id,
                        job_work.c.node_id,
                        *sums,
                        sa.func.max(sa.cast(job_work.c.full, sa.Integer)).label("full"),
                        sa.func.count().label("batches"),
                        sa.func.sum(
                            sa.case((job_work.c.state == WORK_DONE, 1), else_=0)
                        ).label("batches_done"),
                    )
                    .where(job_work.c.job_id.in_(ids))
                    .group_by(job_work.c.job_id, job_work.c.node_id)
                    .order_by(job_work.c.node_id)
                )
            ).mappings().all()  # fmt: skip
            errors: list[sa.RowMapping] = []
            if details and ids:
                errors = list(
                    (
                        await conn.execute(
                            sa.select(job_errors)
                            .where(job_errors.c.job_id.in_(ids))
                            .order_by(job_errors.c.id)
                            .limit(MAX_ERRORS)
                        )
                    ).mappings()
                )
        by_job: dict[int, list[NodeProgress]] = {}
        for p in progress:
            counts = {name: int(p[name] or 0) for name in _TALLY if name != "full"}
            by_job.setdefault(p["job_id"], []).append(
                NodeProgress(node=p["node_id"], full=bool(p["full"]),
                             batches=int(p["batches"]),
                             batches_done=int(p["batches_done"] or 0), **counts)
            )  # fmt: skip
        return [
            JobView(
                id=row["id"],
                spec=JobSpec.from_json(json.loads(row["spec"])),
                state=row["state"],
                message=row["message"],
                submitted_by=row["submitted_by"],
                submitted_at=row["submitted_at"],
                started_at=row["started_at"],
                ended_at=row["ended_at"],
                total_objects=row["total_objects"],
                total_bytes=row["total_bytes"],
                listed=row["state"] not in (QUEUED, LISTING),
                nodes=tuple(by_job.get(row["id"], ())),
                errors=tuple(
                    JobError(e["node_id"], e["key"], e["message"])
                    for e in errors
                    if e["job_id"] == row["id"]
                ),
            )
            for row in rows
        ]

    async def counts(self) -> dict[str, int]:
        """Jobs by state, for the metrics."""
        query = sa.select(jobs.c.state, sa.func.count()).group_by(jobs.c.state)
        async with transaction(self._engine) as conn:
            rows = (await conn.execute(query)).all()
        return {state: int(n) for state, n in rows}

    # -- what the nodes do -------------------------------------------------------------------

    async def active(self) -> list[ActiveJob]:
        lapsed = sa.or_(jobs.c.lease_expires.is_(None), jobs.c.lease_expires < self._clock())
        query = (
            sa.select(jobs.c.id, jobs.c.spec, jobs.c.state, jobs.c.total_objects,
                      lapsed.label("lapsed"))
            .where(jobs.c.state.in_(ACTIVE))
            .order_by(jobs.c.id)
        )  # fmt: skip
        async with transaction(self._engine) as conn:
            rows = (await conn.execute(query)).all()
        return [
            ActiveJob(row.id, JobSpec.from_json(json.loads(row.spec)), row.state,
                      row.total_objects, bool(row.lapsed))
            for row in rows
        ]  # fmt: skip

    async def state(self, job_id: int) -> str | None:
        async with transaction(self._engine) as conn:
            found = await conn.execute(sa.select(jobs.c.state).where(jobs.c.id == job_id))
            return found.scalar_one_or_none()

    async def take_listing(self, job_id: int, owner: str, lease: float) -> bool:
        """Become the job's one lister: it is queued, or its lister's lease ran out."""
        query = (
            sa.update(jobs)
            .where(
                jobs.c.id == job_id,
                sa.or_(
                    jobs.c.state == QUEUED,
                    sa.and_(jobs.c.state == LISTING,
                            sa.or_(jobs.c.lease_expires.is_(None),
                                   jobs.c.lease_expires < self._clock(),
                                   jobs.c.lease_owner == owner)),
                ),
            )
            .values(state=LISTING, lease_owner=owner, lease_expires=self._clock(lease),
                    started_at=sa.func.coalesce(jobs.c.started_at, datetime.now(UTC)))
        )  # fmt: skip
        async with transaction(self._engine) as conn:
            return (await conn.execute(query)).rowcount > 0

    async def listed_so_far(self, job_id: int) -> tuple[int, str | None]:
        """Where a listing resumes: the next item's number, and the last key written."""
        query = sa.select(sa.func.count(), sa.func.max(job_items.c.key)).where(
            job_items.c.job_id == job_id
        )
        async with transaction(self._engine) as conn:
            count, last = (await conn.execute(query)).one()
        return int(count), last

    async def add_items(self, job_id: int, owner: str, lease: float, items: Sequence[Item]) -> bool:
        """Write a page of the listing and renew the lease; False when the lease is no longer
        ours (or the job was cancelled): the items are not written."""
        renew = (
            sa.update(jobs)
            .where(jobs.c.id == job_id, jobs.c.state == LISTING, jobs.c.lease_owner == owner)
            .values(
                lease_expires=self._clock(lease),
                total_objects=jobs.c.total_objects + len(items),
                total_bytes=jobs.c.total_bytes + sum(i.size for i in items),
            )
        )
        async with transaction(self._engine) as conn:
            if (await conn.execute(renew)).rowcount == 0:
                return False
            if items:
                await conn.execute(
                    sa.insert(job_items),
                    [{"job_id": job_id, "seq": i.seq, "key": i.key, "size": i.size,
                      "etag": i.etag} for i in items],
                )  # fmt: skip
        return True

    async def note_listing(self, job_id: int, owner: str, lease: float, message: str) -> bool:
        """Renew the listing's lease and say where it stands (a catalog sync's progress);
        False when the lease is no longer ours or the job was cancelled."""
        query = (
            sa.update(jobs)
            .where(jobs.c.id == job_id, jobs.c.state == LISTING, jobs.c.lease_owner == owner)
            .values(lease_expires=self._clock(lease), message=message)
        )
        async with transaction(self._engine) as conn:
            return (await conn.execute(query)).rowcount > 0

    async def finish_listing(self, job_id: int, owner: str) -> bool:
        query = (
            sa.update(jobs)
            .where(jobs.c.id == job_id, jobs.c.state == LISTING, jobs.c.lease_owner == owner)
            .values(state=RUNNING, lease_owner=None, lease_expires=None)
        )
        async with transaction(self._engine) as conn:
            return (await conn.execute(query)).rowcount > 0

    async def fail(self, job_id: int, message: str) -> None:
        query = (
            sa.update(jobs)
            .where(jobs.c.id == job_id, jobs.c.state.in_(ACTIVE))
            .values(state=FAILED, message=message, ended_at=datetime.now(UTC),
                    lease_owner=None, lease_expires=None)
        )  # fmt: skip
        async with transaction(self._engine) as conn:
            await conn.execute(query)

    async def seed(self, job_id: int, first: int, last: int, node_ids: Iterable[str]) -> None:
        """Rows for batches [first, last) for each node, where missing: a node's share of a
        batch exists before anyone works on it, so that it is taken over if the node dies.
        Nothing once the job has ended (the caller's claim then finds it ended too)."""
        rows = [
            {"job_id": job_id, "batch": b, "node_id": n, "state": PENDING}
            for b in range(first, last)
            for n in node_ids
        ]
        if not rows:
            return
        query = self._insert(job_work).on_conflict_do_nothing()
        async with transaction(self._engine) as conn:
            # The job's row held in key share, as a claim holds it, against try_finish: a
            # joining node's shares added between its looks and the end would be left out of
            # a job that ends done (its keys never loaded where reads look for them), and
            # shares added after the end belong to no job that runs. (The foreign key's check
            # locks the row too, but after the rows are written: they went in once it ended.)
            state = await conn.execute(
                sa.select(jobs.c.state)
                .where(jobs.c.id == job_id)
                .with_for_update(read=True, key_share=True)
            )
            if state.scalar_one_or_none() not in ACTIVE:
                return
            for at in range(0, len(rows), 1000):
                await conn.execute(query, rows[at : at + 1000])

    async def claim(
        self, job_id: int, me: str, owner: str, lease: float, live: Iterable[str],
        holding: Iterable[tuple[int, str]] = (),
    ) -> WorkRow | None:  # fmt: skip
        """A share to work on, under a lease: this node's own first (pending, or leased by a
        holder whose lease ran out: this node before a restart), else the share of a node
        that is no longer live and whose lease ran out. `holding`: the shares (batch, node)
        this holder works on now, not taken again (the runner takes its next share while
        the last one ends).

        A share of this node's that others stood in for (`stood_in`: done, given back or
        dropped by a node holding it for this one) is taken to be done again from its first
        item: what they loaded is at other nodes, not on this one's disk. None once the job
        has ended: the counts it ended on are kept as they are."""
        table = job_work
        open_ = sa.and_(
            table.c.job_id == job_id,
            table.c.state != WORK_DONE,
            sa.or_(table.c.state == PENDING, table.c.lease_expires < self._clock(),
                   table.c.lease_owner == owner),
        )  # fmt: skip
        # Only a stand-in leaves its name on a share it ended (the node's own ending clears it).
        redo = sa.and_(
            table.c.job_id == job_id, table.c.state == WORK_DONE, table.c.lease_owner.is_not(None)
        )
        live = list(live)
        held = list(holding)
        if held:
            open_ = sa.and_(open_, sa.tuple_(table.c.batch, table.c.node_id).not_in(held))
        async with transaction(self._engine) as conn:
            # No share is taken once the job has ended, nor while its end is being decided:
            # taking one again zeroes its counts, and the counts a job ended on are its
            # figures. The job's row held in key share (claims do not wait for each other, nor
            # for the listing's renewals) against try_finish, which holds it for update.
            state = await conn.execute(
                sa.select(jobs.c.state)
                .where(jobs.c.id == job_id)
                .with_for_update(read=True, key_share=True)
            )
            if state.scalar_one_or_none() not in ACTIVE:
                return None
            for mine in (True, False):
                who = table.c.node_id == me if mine else table.c.node_id.not_in([me, *live])
                takeable = sa.or_(open_, redo) if mine else open_
                rows = (
                    await conn.execute(
                        sa.select(table).where(takeable, who).order_by(table.c.batch).limit(4)
                    )
                ).mappings().all()  # fmt: skip
                for row in rows:
                    again = mine and stood_in(me, row["lease_owner"])
                    values: dict[str, Any] = {
                        "state": LEASED, "lease_owner": owner, "lease_expires": self._clock(lease),
                    }  # fmt: skip
                    if again:
                        values.update(Tally().values(), cursor=0)
                    take = (
                        sa.update(table)
                        .where(table.c.job_id == job_id, table.c.batch == row["batch"],
                               table.c.node_id == row["node_id"], takeable,
                               table.c.lease_owner.is_not_distinct_from(row["lease_owner"]))
                        .values(values)
                    )  # fmt: skip
                    if (await conn.execute(take)).rowcount:
                        if again:
                            return WorkRow(job_id, row["batch"], row["node_id"], 0, Tally())
                        tally = Tally(**{name: row[name] for name in _TALLY})
                        tally.full = bool(tally.full)
                        return WorkRow(job_id, row["batch"], row["node_id"], row["cursor"], tally)
        return None

    async def batch_nodes(self, job_id: int, batch: int) -> list[str]:
        """The nodes with a share of the batch."""
        query = sa.select(job_work.c.node_id).where(
            job_work.c.job_id == job_id, job_work.c.batch == batch
        )
        async with transaction(self._engine) as conn:
            return list((await conn.execute(query)).scalars())

    async def batch_items(self, job_id: int, batch: int) -> list[Item]:
        query = (
            sa.select(job_items.c.seq, job_items.c.key, job_items.c.size, job_items.c.etag)
            .where(
                job_items.c.job_id == job_id,
                job_items.c.seq >= batch * BATCH,
                job_items.c.seq < (batch + 1) * BATCH,
            )
            .order_by(job_items.c.seq)
        )
        async with transaction(self._engine) as conn:
            rows = (await conn.execute(query)).all()
        return [Item(*row) for row in rows]

    async def report(
        self, row: WorkRow, owner: str, lease: float, *, done: bool = False, release: bool = False,
        stand_in: bool = False,
    ) -> bool:  # fmt: skip
        """Write a row's counters and cursor, and renew its lease (or end it: `done`; or give
        it up with the share unfinished: `release`, so that it is taken up again at once);
        False when the lease is no longer ours, or (a renewal) the job is no longer active:
        one round trip for both, as the reporter asks after each object. A `stand_in` (the
        holder is not the row's node) leaves its name on the row it ends or gives up: the
        row's node, back, does the share again (`claim`)."""
        values = {**row.tally.values(), "cursor": row.cursor}
        where = [
            job_work.c.job_id == row.job_id, job_work.c.batch == row.batch,
            job_work.c.node_id == row.node_id, job_work.c.lease_owner == owner,
            job_work.c.state == LEASED,
        ]  # fmt: skip
        if done or release:
            values.update(state=WORK_DONE if done else PENDING, lease_expires=None)
            if not stand_in:
                values["lease_owner"] = None
        else:
            values["lease_expires"] = self._clock(lease)
            active = sa.select(jobs.c.id).where(jobs.c.id == row.job_id, jobs.c.state.in_(ACTIVE))
            where.append(active.exists())
        query = sa.update(job_work).where(*where).values(values)
        async with transaction(self._engine) as conn:
            return (await conn.execute(query)).rowcount > 0

    async def add_error(self, job_id: int, node_id: str, key: str, message: str) -> None:
        """Keep the error if the job has fewer than MAX_ERRORS."""
        count = sa.select(sa.func.count()).where(job_errors.c.job_id == job_id)
        async with transaction(self._engine) as conn:
            if (await conn.execute(count)).scalar_one() >= MAX_ERRORS:
                return
            await conn.execute(
                sa.insert(job_errors).values(job_id=job_id, node_id=node_id, key=key,
                                             message=message[:500], at=datetime.now(UTC))
            )  # fmt: skip

    async def node_bytes(self, job_id: int, node_id: str) -> int:
        """What the job has put (or found) in this node's cache so far, over its batches."""
        query = sa.select(
            sa.func.coalesce(sa.func.sum(job_work.c.loaded_bytes + job_work.c.cached_bytes), 0)
        ).where(job_work.c.job_id == job_id, job_work.c.node_id == node_id)
        async with transaction(self._engine) as conn:
            return int((await conn.execute(query)).scalar_one())

    async def try_finish(self, job_id: int, live: Iterable[str]) -> str | None:
        """End a listed job once every share of every batch is done and every live node has a
        share of each: `done`, or `partial` when something was not loaded. The state it ended
        in, or None while work is left. `live`: the nodes the caller saw live; with the fleet's
        registry (`live_nodes`), those live by the database when the end is decided are too: a
        node back since the caller looked is not taken for away, its share left at the others
        who stood in for it (it does that share again first)."""
        async with transaction(self._engine) as conn:
            # The job's row held for update, so that no share is claimed (`claim`) between
            # the looks below and the end: on PostgreSQL each statement reads the database as
            # it is then, and a share of a node back, taken again in between, had its counts
            # zeroed after they were found done (the job ended done with fewer objects).
            job = (
                await conn.execute(sa.select(jobs).where(jobs.c.id == job_id).with_for_update())
            ).mappings().first()  # fmt: skip
            if job is None or job["state"] != RUNNING:
                return None
            seen = set(live)
            if self._live_nodes is not None:
                seen |= await self._live_nodes(conn)
            live = sorted(seen)
            want = batches(job["total_objects"], listed=True)
            open_ = await conn.execute(
                sa.select(sa.func.count()).where(
                    job_work.c.job_id == job_id, job_work.c.state != WORK_DONE
                )
            )
            if open_.scalar_one():
                return None
            counted = await conn.execute(
                sa.select(job_work.c.node_id, sa.func.count())
                .where(job_work.c.job_id == job_id, job_work.c.node_id.in_(live))
                .group_by(job_work.c.node_id)
            )
            per_node = {str(node): int(n) for node, n in counted.all()}
            if any(per_node.get(node, 0) < want for node in live):
                return None
            # A share the others stood in for is at other nodes than the placement reads now
            # that its node is back: that node does it again before the job is done.
            stood = sa.and_(
                job_work.c.job_id == job_id, job_work.c.state == WORK_DONE,
                job_work.c.lease_owner.is_not(None),
            )  # fmt: skip
            back = await conn.execute(
                sa.select(sa.func.count()).where(stood, job_work.c.node_id.in_(live))
            )
            if back.scalar_one():
                return None
            away = sorted(
                str(n)
                for n in (
                    await conn.execute(sa.select(job_work.c.node_id).where(stood).distinct())
                ).scalars()
            )
            sums = (
                await conn.execute(
                    sa.select(
                        sa.func.coalesce(sa.func.sum(job_work.c.bytes), 0),
                        sa.func.coalesce(sa.func.sum(job_work.c.failures), 0),
                        sa.func.coalesce(sa.func.sum(job_work.c.unkept_bytes), 0),
                        sa.func.coalesce(sa.func.sum(job_work.c.skipped), 0),
                        sa.func.coalesce(sa.func.sum(job_work.c.cached_objects), 0),
                        sa.func.coalesce(sa.func.sum(job_work.c.cached_bytes), 0),
                        sa.func.max(sa.cast(job_work.c.full, sa.Integer)),
                        sa.func.count(sa.distinct(
                            sa.case((job_work.c.full, job_work.c.node_id), else_=None))),
                        sa.func.coalesce(sa.func.sum(job_work.c.loaded_bytes), 0),
                        sa.func.coalesce(sa.func.sum(job_work.c.loaded_objects), 0),
                    ).where(job_work.c.job_id == job_id)
                )
            ).one()  # fmt: skip
            done_bytes, failures, unkept, skipped, cached_objects, cached_bytes = sums[:6]
            full, full_nodes, fetched_bytes, fetched_objects = sums[6:]
            spec = JobSpec.from_json(json.loads(job["spec"]))
            if spec.verify:
                state, message = (
                    DONE,
                    (
                        f"cached: {cached_objects} of {job['total_objects']} objects, "
                        f"{_size(int(cached_bytes))} of {_size(job['total_bytes'])}"
                    ),
                )
            elif spec.unpin:
                state, message = _unpinned(
                    job["total_objects"], int(cached_objects), int(cached_bytes), int(failures)
                )
            else:
                state, message = _ending(
                    spec, job["total_objects"], job["total_bytes"], int(done_bytes),
                    int(failures), int(unkept), int(skipped), bool(full), int(full_nodes or 0),
                )  # fmt: skip
                if state == DONE and not spec.metadata_only:
                    message += _fetched(
                        job["total_objects"], int(fetched_objects), int(fetched_bytes),
                        int(cached_bytes),
                    )  # fmt: skip
            if away and spec.kind == "load":  # an unpin says so in its errors
                message += f"; {_stood_in_for(away)}"
            ended = await conn.execute(
                sa.update(jobs)
                .where(jobs.c.id == job_id, jobs.c.state == RUNNING)
                .values(state=state, message=message, ended_at=datetime.now(UTC))
            )
            return state if ended.rowcount else None


def _size(count: int) -> str:
    from gateway.jobs.progress import size  # the one way sizes are written for people

    return size(count)


def _unpinned(objects: int, blocks: int, size: int, failures: int) -> tuple[str, str]:
    """The end of an unpin job (its nodes count the blocks they unpinned as `cached_*`:
    every block of the prefix cached on a node, pinned before or not, is unpinned now)."""
    blocks_of = f"{blocks} block{'s' if blocks != 1 else ''} ({_size(size)})"
    what = f"unpinned the {blocks_of} of {objects} objects cached on the fleet"
    if failures:
        return PARTIAL, f"{what}; {failures} objects not unpinned on every node (see the errors)"
    return DONE, what


def _stood_in_for(away: list[str]) -> str:
    """What the job's end says of the nodes whose shares the others did while they were away."""
    names = ", ".join(away[:5]) + (f" and {len(away) - 5} more" if len(away) > 5 else "")
    them = "it is" if len(away) == 1 else "they are"
    return (
        f"{names} away at the end: the others loaded {'its' if len(away) == 1 else 'their'}"
        f" share for the fleet without {'it' if len(away) == 1 else 'them'} (load again once"
        f" {them} back)"
    )


def _fetched(objects: int, fetched_objects: int, fetched: int, cached: int) -> str:
    """What a load that ended well fetched from the store, and what it found cached already:
    a reload of an unchanged prefix says it fetched nothing. (In a fleet an object whose
    blocks several nodes fetched counts on each of them: the count of objects fetched is then
    at most the objects', the bytes exact.)"""
    if not fetched:
        return f": nothing fetched, all {objects} already cached"
    if not cached:
        return ": all fetched from the store"
    fetched_objects = min(fetched_objects, objects)
    return (
        f": {fetched_objects} fetched from the store ({_size(fetched)}),"
        f" {objects - fetched_objects} already cached ({_size(cached)})"
    )


def _ending(
    spec: JobSpec, objects: int, total: int, done: int, failures: int, unkept: int,
    skipped: int, full: bool, full_nodes: int,
) -> tuple[str, str]:  # fmt: skip
    """The end state of a job whose work is all done, and what to tell the user."""
    size = _size
    problems = []
    if full:
        problems.append(
            f"the cache of {full_nodes} node{'s' if full_nodes != 1 else ''} is full "
            "(capacity, quota or free-space floor): loading stopped there"
        )
    if unkept:
        problems.append(f"{size(unkept)} fetched but not kept (disk full)")
    if failures:
        problems.append(f"{failures} objects failed")
    if skipped:
        problems.append(f"{skipped} objects changed and were not reloaded (use --refresh)")
    if not problems:
        what = "learnt the metadata of" if spec.metadata_only else "loaded"
        return DONE, f"{what} {objects} objects, {size(total)}"
    fit = f"{size(min(done, total))} of {size(total)} loaded" if not spec.metadata_only else ""
    return PARTIAL, "; ".join(p for p in [fit, *problems] if p)
