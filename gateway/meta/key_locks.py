"""Locks on keys, held in the database so that every node of the fleet and every worker of a
node sees them: a writer that checks a condition at the store and then writes (a conditional
PUT, a multipart complete) holds its key's lock from the check to the store's answer, so that
two such writers of one key are never both past their check before either has written.

A holder renews its lease while it holds; one that died stops renewing, and its lock is taken
over once the lease has run out, by the database's clock. Waiters in one process queue on a
lock of the process's own first: only one of them asks the database at a time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import secrets
import socket
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import anyio
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from .models import MetaError
from .tables import UTCDateTime, database_clock, metadata, object_key_type

log = logging.getLogger(__name__)

# A lock a key; the row is there only while someone holds it (or held it and died).
key_locks = sa.Table(
    "key_locks",
    metadata,
    sa.Column(
        "mount_id",
        sa.Integer,
        sa.ForeignKey("mounts.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("key", object_key_type(), primary_key=True),
    sa.Column("owner", sa.Text, nullable=False),  # host:pid:token of this holding, for the log
    sa.Column("expires_at", UTCDateTime, nullable=False),
)

# How often a waiter asks again: from the first to the last, doubling (each with jitter, so
# that waiters of several processes do not ask in step).
_FIRST_POLL, _LAST_POLL = 0.005, 0.1
_HOST = socket.gethostname()

Connect = Callable[[], AbstractAsyncContextManager[AsyncConnection]]


class KeyBusy(MetaError):
    """The key's lock was held by another all the while one waited for it."""


class HeldKey:
    """A key's lock, held until `release`; its lease renewed meanwhile."""

    def __init__(self, locks: KeyLocks, at: tuple[int, str], owner: str, lease: float) -> None:
        self._locks = locks
        self._at = at
        self.owner = owner
        self._renewing = asyncio.create_task(self._renew(lease))

    async def _renew(self, lease: float) -> None:
        while True:
            await asyncio.sleep(max(lease / 3, 0.05))
            try:
                if not await self._locks._renew(self._at, self.owner, lease):
                    log.warning("lock of key %r taken over: its lease ran out", self._at[1])
                    return
            except MetaError as exc:
                log.warning("lock of key %r not renewed: %s", self._at[1], exc)

    async def release(self) -> None:
        """Let the next writer of the key in; shielded, so that a cancelled writer's lock goes
        too (else it would stand until its lease ran out)."""
        self._renewing.cancel()
        with anyio.CancelScope(shield=True):
            try:
                await self._locks._release(self._at, self.owner)
            except MetaError as exc:
                log.warning("lock of key %r not released (it lapses): %s", self._at[1], exc)
            finally:
                self._locks._leave(self._at, locked=True)


class KeyLocks:
    """The key locks of the database `connect` opens transactions on (of `dialect`)."""

    def __init__(self, connect: Connect, dialect: str) -> None:
        self._connect = connect
        self._dialect = dialect
        # The process's own queue a key: (lock, how many hold or wait for it).
        self._queues: dict[tuple[int, str], tuple[asyncio.Lock, list[int]]] = {}

    async def take(self, mount_id: int, key: str, lease: float, wait: float) -> HeldKey:
        """The key's lock, held for `lease` seconds at a time (renewed until released);
        KeyBusy when it was not had within `wait` seconds. MetaUnavailable (nothing held)
        when the database cannot be asked."""
        at = (mount_id, key)
        lock, users = self._queues.setdefault(at, (asyncio.Lock(), [0]))
        users[0] += 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        try:
            async with asyncio.timeout(wait):
                await lock.acquire()
        except TimeoutError:
            self._leave(at, locked=False)
            raise KeyBusy(f"key {key!r} is held by another writer") from None
        except BaseException:
            self._leave(at, locked=False)
            raise
        owner = f"{_HOST}:{os.getpid()}:{secrets.token_hex(6)}"
        try:
            poll = _FIRST_POLL
            while not await self._try(at, owner, lease):
                left = deadline - loop.time()
                if left <= 0:
                    raise KeyBusy(f"key {key!r} is held by another writer")
                await asyncio.sleep(min(left, poll * random.uniform(0.5, 1.5)))
                poll = min(poll * 2, _LAST_POLL)
        except BaseException:
            self._leave(at, locked=True)
            raise
        return HeldKey(self, at, owner, lease)

    def _leave(self, at: tuple[int, str], locked: bool) -> None:
        """This holder or waiter gone from the process's queue of the key."""
        lock, users = self._queues[at]
        if locked:
            lock.release()
        users[0] -= 1
        if not users[0]:
            del self._queues[at]

    async def _try(self, at: tuple[int, str], owner: str, lease: float) -> bool:
        """One statement: the row made, or taken over once its holder's lease ran out."""
        insert = postgresql.insert if self._dialect == "postgresql" else sqlite.insert
        statement = insert(key_locks).values(
            mount_id=at[0], key=at[1], owner=owner,
            expires_at=database_clock(self._dialect, lease),
        )  # fmt: skip
        statement = statement.on_conflict_do_update(
            index_elements=[key_locks.c.mount_id, key_locks.c.key],
            set_={"owner": statement.excluded.owner, "expires_at": statement.excluded.expires_at},
            where=key_locks.c.expires_at < database_clock(self._dialect),
        )
        try:
            async with self._connect() as conn:
                return (await conn.execute(statement)).rowcount > 0
        except sa_exc.IntegrityError as error:  # the mount removed meanwhile
            raise MetaError(f"no mount {at[0]} to lock a key of: {error}") from None

    async def _renew(self, at: tuple[int, str], owner: str, lease: float) -> bool:
        query = (
            sa.update(key_locks)
            .where(key_locks.c.mount_id == at[0], key_locks.c.key == at[1])
            .where(key_locks.c.owner == owner)
            .values(expires_at=database_clock(self._dialect, lease))
        )
        async with self._connect() as conn:
            return (await conn.execute(query)).rowcount > 0

    async def _release(self, at: tuple[int, str], owner: str) -> None:
        query = sa.delete(key_locks).where(
            key_locks.c.mount_id == at[0], key_locks.c.key == at[1], key_locks.c.owner == owner
        )
        async with self._connect() as conn:
            await conn.execute(query)

    async def prune(self) -> int:
        """Remove the locks of holders that died (their leases ran out); how many."""
        query = sa.delete(key_locks).where(key_locks.c.expires_at < database_clock(self._dialect))
        async with self._connect() as conn:
            return int((await conn.execute(query)).rowcount)
