"""Key locks (gateway/meta/key_locks.py) on SQLite and PostgreSQL, taken by two stores over one
database as two processes of a fleet would: one holder of a key at a time, whichever process
asks; a waiter gets the key once it is released, or KeyBusy when its wait runs out; a lock
whose holder died (its lease ran out) is taken over, and that holder's late release does not
free its successor's; other keys and mounts are free meanwhile; pruning removes lapsed rows."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import sqlalchemy as sa

from gateway.meta import KeyBusy, MetaStore, SecretBox
from gateway.meta.key_locks import key_locks

pytestmark = pytest.mark.anyio

LONG = 3600.0
KEY = SecretBox.generate_key()


@pytest.fixture
async def stores(database_url: str) -> AsyncIterator[tuple[MetaStore, MetaStore]]:
    async with (
        MetaStore(database_url, SecretBox([KEY])) as one,
        MetaStore(database_url, SecretBox([KEY])) as two,
    ):
        await one.migrate()
        yield one, two


@pytest.fixture
async def mount_id(stores: tuple[MetaStore, MetaStore]) -> int:
    return (await stores[0].add_mount("data", "s3://origin", {})).id


async def _rows(store: MetaStore) -> list[tuple[str, str]]:
    """(key, owner) of each lock row, by key."""
    query = sa.select(key_locks.c.key, key_locks.c.owner).order_by(key_locks.c.key)
    async with store.engine.connect() as conn:
        return [(key, owner) for key, owner in (await conn.execute(query)).all()]


async def test_a_key_has_one_holder_whichever_process_asks(
    stores: tuple[MetaStore, MetaStore], mount_id: int
) -> None:
    holding: list[int] = []
    most = 0

    async def write(store: MetaStore, n: int) -> None:
        nonlocal most
        for _ in range(5):
            held = await store.key_locks.take(mount_id, "k", LONG, wait=60)
            try:
                holding.append(n)
                most = max(most, len(holding))
                await asyncio.sleep(0)  # others run meanwhile: they must be waiting
                await asyncio.sleep(0)
                holding.remove(n)
            finally:
                await held.release()

    # Three writers a process: each process's queue, and the database between them.
    await asyncio.gather(*(write(stores[n % 2], n) for n in range(6)))
    assert most == 1
    assert await _rows(stores[0]) == []  # every lock released, no row left


async def test_a_waiter_gets_the_key_once_released_or_keybusy_when_its_wait_runs_out(
    stores: tuple[MetaStore, MetaStore], mount_id: int
) -> None:
    one, two = stores
    held = await one.key_locks.take(mount_id, "k", LONG, wait=1)
    with pytest.raises(KeyBusy):
        await two.key_locks.take(mount_id, "k", LONG, wait=0.2)
    with pytest.raises(KeyBusy):  # in the same process too
        await one.key_locks.take(mount_id, "k", LONG, wait=0.2)
    other = await two.key_locks.take(mount_id, "other", LONG, wait=0.2)  # other keys are free
    waiting = asyncio.create_task(two.key_locks.take(mount_id, "k", LONG, wait=60))
    await held.release()
    second = await waiting
    assert await _rows(one) == [("k", second.owner), ("other", other.owner)]
    await second.release()
    await other.release()
    assert await _rows(one) == []


async def test_a_dead_holders_lock_is_taken_over_and_its_late_release_frees_nothing(
    stores: tuple[MetaStore, MetaStore], mount_id: int
) -> None:
    one, two = stores
    dead = await one.key_locks.take(mount_id, "k", -1.0, wait=1)  # a lease that ran out at once
    successor = await two.key_locks.take(mount_id, "k", LONG, wait=5)
    await dead.release()  # late: the holder was taken for dead
    assert await _rows(one) == [("k", successor.owner)]
    with pytest.raises(KeyBusy):
        await one.key_locks.take(mount_id, "k", LONG, wait=0.2)
    await successor.release()


async def test_pruning_removes_only_the_locks_of_holders_that_died(
    stores: tuple[MetaStore, MetaStore], mount_id: int
) -> None:
    one, two = stores
    dead = await one.key_locks.take(mount_id, "dead", -1.0, wait=1)
    live = await two.key_locks.take(mount_id, "live", LONG, wait=1)
    assert await one.key_locks.prune() == 1
    assert await _rows(one) == [("live", live.owner)]
    await dead.release()
    await live.release()
