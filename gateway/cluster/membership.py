"""Membership: this node's heartbeat in the database, and the fleet's live set as a Placement.

Changes are learnt at once through PostgreSQL LISTEN/NOTIFY, and by polling every interval
(the only way on SQLite). A database outage freezes the live set instead of emptying it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.meta import MetaStore, MetaUnavailable
from gateway.meta.engine import POSTGRES_CONNECT_TIMEOUT_S

from .placement import DEFAULT_MAX_REPLICAS, DEFAULT_PARTITIONS, Node, Placement
from .registry import CHANNEL, UP, NodeFigures, NodeRecord, NodeRegistry

log = logging.getLogger(__name__)

# Woken this long after a peer's heartbeat is due to lapse: rounding in the database's clock
# arithmetic must not make us look a hair too early and then wait a whole interval.
_LAPSE_SLACK = 0.05
# How long stop() lets a tick under way finish before cancelling it.
STOP_WAIT = 5.0


class Membership:
    """Keeps `me` in the fleet and `placement` in step with the fleet's live nodes.

    `start()` joins and then heartbeats every `interval` seconds; a node not heard from for
    `timeout` seconds (by the database's clock) leaves the live set, and `stop()` leaves at
    once. `on_change(placement)` is called with a new Placement whenever the live set changes,
    the first time from `start()`. This node is always in its own live set: it serves what it
    owns even while the database is away.
    """

    def __init__(
        self,
        meta: MetaStore | AsyncEngine,
        me: Node,
        *,
        interval: float = 2.0,
        timeout: float = 10.0,
        figures: Callable[[], NodeFigures] = NodeFigures,
        on_change: Callable[[Placement], None] | None = None,
        partitions: int = DEFAULT_PARTITIONS,
        max_replicas: int = DEFAULT_MAX_REPLICAS,
    ) -> None:
        if not 0 < interval < timeout:
            # With a timeout at or below the interval, every node would lapse between beats.
            raise ValueError(f"need 0 < interval < timeout, not {interval} and {timeout}")
        engine = meta.engine if isinstance(meta, MetaStore) else meta
        self.me = me
        self.interval = interval
        self.timeout = timeout
        self._registry = NodeRegistry(engine, timeout)
        self._figures = figures
        self._on_change = on_change
        self._partitions = partitions
        self._max_replicas = max_replicas
        self._listen_args = _listen_args(engine) if engine.dialect.name == "postgresql" else None
        # Empty until the first read of the table, so that the first live set counts as a change.
        self._live: dict[str, Node] = {}
        self.placement = Placement([me], partitions, max_replicas)
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._stopping = False
        self._listener: Any = None  # asyncpg.Connection, typed loosely as asyncpg ships no hints
        self._listen_failed = False  # said once in the logs, not at every retry
        self._joined = False  # the join itself reached the database
        self._outage = False  # the last attempt to reach the database failed
        self._hold_until = 0.0  # loop time until which lapsed peers are kept (after an outage)
        self._next_check = float("inf")  # loop time of the next expected lapse or hold end

    def live(self) -> tuple[Node, ...]:
        """The live nodes as last known, this one included, ordered by id."""
        return self.placement.nodes

    async def start(self) -> None:
        """Join the fleet and start heartbeating. An unreachable database is logged, not raised:
        the node starts alone and joins when the database answers."""
        if self._task is not None:
            raise RuntimeError("membership already started")
        # Listen before reading, so that no change between the read and the LISTEN goes unseen.
        await self._listen()
        try:
            await self._tick()
        except BaseException:
            await self._unlisten()
            raise
        if not self._live:  # no database: alone until it answers
            self._publish(self.placement)
        self._task = asyncio.create_task(self._run(), name=f"membership {self.me.id}")

    async def stop(self) -> None:
        """Stop heartbeating and leave the fleet at once (or by timeout if the database is away).
        A tick under way may finish first (up to STOP_WAIT): a heartbeat cancelled inside its
        transaction could hold SQLite's write lock until its connection is collected."""
        if self._task is not None:
            self._stopping = True
            self._wake.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._task), STOP_WAIT)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._unlisten()
        try:
            await self._registry.leave(self.me.id)
        except MetaUnavailable as error:
            log.warning(
                "cannot mark this node as left; the fleet drops it after the heartbeat timeout",
                extra={"node": self.me.id, "error": str(error)},
            )

    # -- the loop

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_beat = loop.time() + self.interval
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(min(next_beat, self._next_check)):
                    await self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            beat = loop.time() >= next_beat
            if beat:
                next_beat = loop.time() + self.interval
            try:
                await self._tick(beat=beat)
                if self._listen_args is not None and self._listener is None and not self._outage:
                    await self._listen()
            except Exception:
                # A bug in one tick must not end the heartbeats: the node would silently lapse.
                log.exception("membership tick failed", extra={"node": self.me.id})

    async def _tick(self, *, beat: bool = False) -> None:
        """Heartbeat (or only read), then take in the live set; on an outage keep the old one."""
        try:
            if not self._joined:
                records = await self._registry.join(self.me, self._figures())
                self._joined = True
            elif beat or self._outage:
                records = await self._registry.beat(self.me, self._figures(), announce=self._outage)
            else:
                records = await self._registry.read()
        except MetaUnavailable as error:
            if not self._outage:
                log.warning(
                    "fleet database unavailable; keeping the last live set",
                    extra={"node": self.me.id, "live": len(self._live), "error": str(error)},
                )
            self._outage = True
            return
        loop = asyncio.get_running_loop()
        if self._outage:
            log.info("fleet database reachable again", extra={"node": self.me.id})
            # The peers' heartbeats failed too: give them time to renew (a beat comes every
            # interval, plus the time a tick takes) before any of them counts as lapsed, or the
            # placement would drop them only to take them back a moment later.
            self._hold_until = loop.time() + min(2 * self.interval, self.timeout)
            self._outage = False
        await self._take(records, loop.time())

    async def _take(self, records: list[NodeRecord], now: float) -> None:
        live = {r.node.id: r.node for r in records if r.live}
        held = now < self._hold_until
        checks = [self._hold_until] if held else []
        for r in records:
            if r.live and r.node.id != self.me.id:
                checks.append(now + self.timeout - r.age + _LAPSE_SLACK)
            elif held and r.state == UP and r.node.id in self._live:
                live[r.node.id] = r.node
        live[self.me.id] = self.me
        self._next_check = min(checks, default=float("inf"))
        if live == self._live:
            return
        lapsed = [
            r.node.id
            for r in records
            if r.state == UP and r.node.id in self._live and r.node.id not in live
        ]
        log.info(
            "fleet changed",
            extra={
                "node": self.me.id,
                "joined": sorted(live.keys() - self._live.keys()),
                "left": sorted(self._live.keys() - live.keys()),
            },
        )
        self._live = live
        # Ranking a large fleet takes a tenth of a second: keep it off the event loop.
        self.placement = await asyncio.to_thread(
            Placement, live.values(), self._partitions, self._max_replicas
        )
        self._publish(self.placement)
        if lapsed:
            # Others would see the lapse at their next poll; this makes it their next moment.
            with contextlib.suppress(MetaUnavailable):  # the next tick reports an outage
                await self._registry.announce_lapse(lapsed)

    def _publish(self, placement: Placement) -> None:
        if self._on_change is None:
            return
        try:
            self._on_change(placement)
        except Exception:
            log.exception("on_change callback failed", extra={"node": self.me.id})

    # -- notifications (PostgreSQL)

    async def _listen(self) -> None:
        """Open the LISTEN connection; without it, polling alone finds changes (and logs say so)."""
        if self._listen_args is None:
            return
        conn = None
        try:
            conn = await asyncpg.connect(**self._listen_args)
            await conn.add_listener(CHANNEL, self._on_notify)
        except Exception as error:
            # asyncpg raises OSError, TimeoutError or one of its own many errors; none of them
            # may stop a node, which still learns of changes by polling.
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close(timeout=1.0)
            log.log(
                logging.DEBUG if self._listen_failed else logging.WARNING,
                "cannot listen for fleet changes; polling only",
                extra={"node": self.me.id, "error": str(error)},
            )
            self._listen_failed = True
            return
        conn.add_termination_listener(self._on_listener_lost)
        self._listener = conn
        self._listen_failed = False
        if self._task is not None:
            # Changes made while nobody listened went unheard: read the table once now.
            self._wake.set()

    async def _unlisten(self) -> None:
        conn, self._listener = self._listener, None
        if conn is not None:
            conn.remove_termination_listener(self._on_listener_lost)
            with contextlib.suppress(Exception):
                await conn.close(timeout=1.0)

    def _on_notify(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        _event, _, node_id = payload.partition(" ")
        if node_id != self.me.id:
            self._wake.set()

    def _on_listener_lost(self, _conn: Any) -> None:
        self._listener = None
        self._wake.set()  # the loop reconnects once the database answers


def _listen_args(engine: AsyncEngine) -> dict[str, Any]:
    """asyncpg.connect() arguments for the engine's database, derived by SQLAlchemy itself, so
    that every URL the MetaStore's engine accepts works for the LISTEN connection too."""
    _, kwargs = engine.dialect.create_connect_args(engine.url)
    # Options of SQLAlchemy's asyncpg adapter, not of asyncpg (the adapter pops them too).
    for name in (
        "async_creator_fn",
        "prepared_statement_cache_size",
        "prepared_statement_name_func",
    ):
        kwargs.pop(name, None)
    return {**kwargs, "timeout": POSTGRES_CONNECT_TIMEOUT_S}
