"""The `nodes` table: joins, heartbeats, leaves and reads, all timed by the database's clock.

PostgreSQL also carries the fleet's change notifications (NOTIFY on CHANNEL); on SQLite there
are none and members learn of changes by polling.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from gateway.meta.store import transaction
from gateway.meta.tables import UTCDateTime, node_samples, nodes

from .placement import Node

# The PostgreSQL channel every member listens on; payloads are "<event> <node id>".
CHANNEL = "gateway_nodes"
UP = "up"
LEFT = "left"
LAPSED = "lapsed"  # never stored: UP in the table, but silent for longer than the timeout

# SQLite's CURRENT_TIMESTAMP has whole seconds only; this keeps milliseconds, in the layout
# SQLAlchemy reads back as a datetime (and julianday() parses).
_SQLITE_NOW = "%Y-%m-%d %H:%M:%f"
_SECONDS_PER_DAY = 86400.0
_UNIX_EPOCH_JULIAN_DAY = 2440587.5

# A heartbeat writes a sample of the node's totals (node_samples) when its last is this old;
# samples are kept this long (the console charts the last hour).
SAMPLE_INTERVAL = 5.0
SAMPLES_KEPT = 3600.0


def _ratio(hits: int, misses: int) -> float | None:
    """Hits over lookups; None before the first lookup."""
    return hits / (hits + misses) if hits + misses else None


@dataclass(frozen=True, slots=True)
class MountLine:
    """One mount's share of a node's cache, as the node reports it with each heartbeat."""

    mount: str  # the mount's bucket
    cache_bytes: int = 0
    pinned_bytes: int = 0
    capacity_bytes: int = 0  # its quota, else the node's capacity
    hits: int = 0
    misses: int = 0
    preload_fills: int = 0

    def summary(self) -> dict[str, Any]:
        return {
            "mount": self.mount, "cache_bytes": self.cache_bytes,
            "pinned_bytes": self.pinned_bytes, "capacity_bytes": self.capacity_bytes,
            "hits": self.hits, "misses": self.misses, "preload_fills": self.preload_fills,
            "hit_ratio": _ratio(self.hits, self.misses),
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class NodeFigures:
    """What a node reports of its cache with each heartbeat, for `gateway status`: bytes held
    and pinned, its budget, the clients' hits and misses, and the blocks preload fetched
    (counted apart: they are no client's misses), for the node and per mount."""

    cache_bytes: int = 0
    hits: int = 0
    misses: int = 0
    # Sampled for the console's charts (node_samples), not kept in the nodes table.
    requests: int = 0
    sent_bytes: int = 0
    capacity_bytes: int = 0
    pinned_bytes: int = 0
    preload_fills: int = 0
    mounts: tuple[MountLine, ...] = ()

    @property
    def hit_ratio(self) -> float | None:
        """The clients' hits over their lookups; None before the first lookup."""
        return _ratio(self.hits, self.misses)

    def summary(self) -> dict[str, Any]:
        """The figures as JSON-ready values (`gateway status --json`, the console)."""
        return {
            "cache_bytes": self.cache_bytes, "pinned_bytes": self.pinned_bytes,
            "capacity_bytes": self.capacity_bytes, "hits": self.hits, "misses": self.misses,
            "preload_fills": self.preload_fills, "hit_ratio": self.hit_ratio,
            "mounts": [m.summary() for m in self.mounts],
        }  # fmt: skip

    @classmethod
    def from_summary(cls, doc: dict[str, Any]) -> NodeFigures:
        """Back from summary() (the nodes table keeps the mounts as such a JSON list)."""
        mounts = tuple(
            MountLine(**{k: v for k, v in m.items() if k != "hit_ratio"})
            for m in doc.get("mounts", ())
        )
        return cls(
            cache_bytes=doc["cache_bytes"], hits=doc["hits"], misses=doc["misses"],
            capacity_bytes=doc.get("capacity_bytes", 0),
            pinned_bytes=doc.get("pinned_bytes", 0),
            preload_fills=doc.get("preload_fills", 0), mounts=mounts,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """One row of the nodes table, with its age and liveness as the database judged them."""

    node: Node
    state: str  # UP or LEFT, as the node last wrote it
    live: bool  # UP, and heard from within the timeout
    age: float  # seconds since the last heartbeat
    started_at: datetime
    heartbeat_at: datetime
    figures: NodeFigures

    @property
    def status(self) -> str:
        """UP, LEFT, or LAPSED for a node still up in the table but silent past the timeout."""
        return LAPSED if self.state == UP and not self.live else self.state

    def summary(self) -> dict[str, Any]:
        """The record as JSON-ready values, for `gateway status --json` and operator pages."""
        return {
            "id": self.node.id,
            "address": self.node.address,
            "zone": self.node.zone,
            "weight": self.node.weight,
            "state": self.status,
            "live": self.live,
            "heartbeat_age": round(self.age, 3),
            "heartbeat_at": self.heartbeat_at.isoformat(),
            "started_at": self.started_at.isoformat(),
            **self.figures.summary(),
        }


class NodeRegistry:
    """Queries on the nodes table over an engine it borrows (the MetaStore's); never closes it.

    A node is live while it is UP and its last heartbeat is younger than `heartbeat_timeout`
    seconds. Every method raises MetaUnavailable when the database cannot be reached, as
    MetaStore does.

    `clock` gives the time written with joins, heartbeats and leaves instead of the database's
    (ages are always the database's): tests use it to write a heartbeat that is already old.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        heartbeat_timeout: float,
        *,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self._engine = engine
        self.heartbeat_timeout = heartbeat_timeout
        self._postgres = engine.dialect.name == "postgresql"
        self._clock = clock
        self._sampled = -SAMPLE_INTERVAL  # monotonic time of this process's last sample

    async def join(self, me: Node, figures: NodeFigures) -> list[NodeRecord]:
        """Mark `me` up as just started, tell the fleet, and return every node's record."""
        async with self._begin() as conn:
            await conn.execute(self._upsert(me, figures, restart=True))
            await self._sample(conn, me, figures)
            await self._notify(conn, "join", [me.id])
            return await self._records(conn)

    async def beat(
        self, me: Node, figures: NodeFigures, *, announce: bool = False
    ) -> list[NodeRecord]:
        """Heartbeat `me` and return every node's record.

        `announce` tells the fleet as a join does: after an outage the others may have let
        this node lapse, and should take it back at once rather than at their next poll.
        """
        async with self._begin() as conn:
            await conn.execute(self._upsert(me, figures, restart=False))
            await self._sample(conn, me, figures)
            if announce:
                await self._notify(conn, "join", [me.id])
            return await self._records(conn)

    async def read(self) -> list[NodeRecord]:
        """Every node's record, live or not, ordered by id."""
        async with self._begin() as conn:
            return await self._records(conn)

    async def live_ids(self, conn: AsyncConnection) -> set[str]:
        """The ids of the nodes live now, read in the caller's transaction `conn` (a job's
        end is decided with what it reads there: gateway/jobs/db.py, try_finish)."""
        found = await conn.execute(sa.select(nodes.c.id).where(self._live(self._age())))
        return {str(node_id) for (node_id,) in found}

    async def leave(self, node_id: str) -> None:
        """Mark the node as gone, so that it leaves the placement now instead of at a timeout."""
        query = (
            sa.update(nodes)
            .where(nodes.c.id == node_id)
            .values(state=LEFT, heartbeat_at=self._now())
        )
        async with self._begin() as conn:
            await conn.execute(query)
            await self._notify(conn, "leave", [node_id])

    async def announce_lapse(self, node_ids: Iterable[str]) -> None:
        """Tell the fleet that these nodes fell silent, so that every member drops them now."""
        if not self._postgres:
            return
        async with self._begin() as conn:
            await self._notify(conn, "lapse", node_ids)

    def _upsert(self, me: Node, figures: NodeFigures, *, restart: bool) -> Any:
        now = self._now()
        row = {
            "id": me.id,
            "address": me.address,
            "weight": me.weight,
            "zone": me.zone,
            "state": UP,
            "started_at": now,
            "heartbeat_at": now,
            "cache_bytes": figures.cache_bytes,
            "hits": figures.hits,
            "misses": figures.misses,
            "capacity_bytes": figures.capacity_bytes,
            "pinned_bytes": figures.pinned_bytes,
            "preload_fills": figures.preload_fills,
            "mounts": json.dumps([m.summary() for m in figures.mounts]),
        }
        insert = postgresql.insert if self._postgres else sqlite.insert
        statement = insert(nodes).values(row)
        kept = {"id"} if restart else {"id", "started_at"}
        return statement.on_conflict_do_update(
            index_elements=[nodes.c.id],
            set_={name: statement.excluded[name] for name in row if name not in kept},
        )

    async def samples(self, since: float) -> tuple[float, list[dict[str, Any]]]:
        """The database's clock (seconds since the epoch) and the samples of the last `since`
        seconds by it, ordered by node, worker and time."""
        async with self._begin() as conn:
            now = float((await conn.execute(sa.select(self._epoch()))).scalar_one())
            query = (
                sa.select(node_samples)
                .where(node_samples.c.at > now - since)
                .order_by(node_samples.c.node_id, node_samples.c.worker, node_samples.c.at)
            )
            rows = (await conn.execute(query)).mappings().all()
        return now, [dict(row) for row in rows]

    async def _sample(self, conn: AsyncConnection, me: Node, figures: NodeFigures) -> None:
        """Every SAMPLE_INTERVAL: this process's totals into node_samples, and the fleet's
        samples older than SAMPLES_KEPT out of it."""
        moment = time.monotonic()
        if moment - self._sampled < SAMPLE_INTERVAL:
            return
        self._sampled = moment
        now = self._epoch()
        row = {
            "node_id": me.id, "worker": os.getpid(), "at": now,
            "requests": figures.requests, "sent_bytes": figures.sent_bytes,
            "hits": figures.hits, "misses": figures.misses,
            "cache_bytes": figures.cache_bytes, "capacity_bytes": figures.capacity_bytes,
        }  # fmt: skip
        insert = postgresql.insert if self._postgres else sqlite.insert
        await conn.execute(insert(node_samples).values(row).on_conflict_do_nothing())
        await conn.execute(sa.delete(node_samples).where(node_samples.c.at < now - SAMPLES_KEPT))

    async def _records(self, conn: AsyncConnection) -> list[NodeRecord]:
        age = self._age()
        live = self._live(age)
        query = sa.select(nodes, age.label("age"), live.label("live")).order_by(nodes.c.id)
        rows = (await conn.execute(query)).mappings().all()
        return [
            NodeRecord(
                node=Node(row["id"], row["address"], row["weight"], row["zone"]),
                state=row["state"],
                live=bool(row["live"]),
                age=float(row["age"]),
                started_at=row["started_at"],
                heartbeat_at=row["heartbeat_at"],
                figures=NodeFigures.from_summary(
                    {**row, "mounts": json.loads(row["mounts"] or "[]")}
                ),
            )
            for row in rows
        ]

    async def _notify(self, conn: AsyncConnection, event: str, node_ids: Iterable[str]) -> None:
        # Sent at commit, so a listener that wakes up reads the change that caused it.
        if self._postgres:
            for node_id in node_ids:
                await conn.execute(sa.select(sa.func.pg_notify(CHANNEL, f"{event} {node_id}")))

    def _now(self) -> sa.ColumnElement[Any]:
        """The database's clock, so that no node's clock decides who is live."""
        if self._clock is not None:
            return sa.literal(self._clock(), UTCDateTime())
        if self._postgres:
            return sa.func.now()
        return sa.func.strftime(_SQLITE_NOW, "now")

    def _epoch(self) -> sa.ColumnElement[float]:
        """The database's clock (or the injected one) in seconds since the Unix epoch."""
        if self._clock is not None:
            return sa.literal(self._clock().timestamp(), sa.Float)
        if self._postgres:
            return sa.cast(sa.extract("epoch", sa.func.now()), sa.Float)
        days = sa.func.julianday("now") - _UNIX_EPOCH_JULIAN_DAY
        return sa.cast(days * _SECONDS_PER_DAY, sa.Float)

    def _age(self) -> sa.ColumnElement[float]:
        """Seconds since each node's heartbeat, by the database's clock."""
        if self._postgres:
            elapsed = sa.extract("epoch", sa.func.now() - nodes.c.heartbeat_at)
            return sa.cast(elapsed, sa.Float)
        days = sa.func.julianday("now") - sa.func.julianday(nodes.c.heartbeat_at)
        return sa.cast(days * _SECONDS_PER_DAY, sa.Float)

    def _live(self, age: sa.ColumnElement[float]) -> sa.ColumnElement[bool]:
        """Whether a node is live: UP, its heartbeat (`age` seconds ago) within the timeout."""
        return sa.and_(nodes.c.state == UP, age < self.heartbeat_timeout)

    def _begin(self) -> AbstractAsyncContextManager[AsyncConnection]:
        return transaction(self._engine)
