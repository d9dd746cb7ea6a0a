"""The leases on uploads a node opens at a store on its own behalf, on SQLite and PostgreSQL:
only a lapsed one is taken over, by one janitor of several, and its holder then knows it.
Leases run by the database's clock; a lease of a negative length has lapsed already."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gateway.meta import MetaStore, SecretBox, UploadLeases

pytestmark = pytest.mark.anyio

LONG = 3600.0


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[MetaStore]:
    async with MetaStore(database_url, SecretBox([SecretBox.generate_key()])) as store:
        await store.migrate()
        yield store


@pytest.fixture
async def mount_id(store: MetaStore) -> int:
    return (await store.add_mount("data", "s3://origin", {})).id


async def test_only_lapsed_leases_are_taken_over(store: MetaStore, mount_id: int) -> None:
    live = await store.open_store_upload(mount_id, "live", "u-live", "writer-1", LONG)
    dead = await store.open_store_upload(mount_id, "dead", "u-dead", "writer-2", -1.0)
    claimed = await store.claim_lapsed_store_uploads("janitor", LONG)
    assert [(c.id, c.key, c.store_upload_id, c.owner) for c in claimed] == [
        (dead, "dead", "u-dead", "writer-2")
    ]
    # Taken over: its old holder learns it when it renews, the live one renews as before.
    assert not await store.renew_store_upload(dead, "writer-2", LONG)
    assert await store.renew_store_upload(live, "writer-1", LONG)
    assert await store.claim_lapsed_store_uploads("janitor", LONG) == []


async def test_of_several_janitors_one_takes_each_lapsed_lease(
    store: MetaStore, mount_id: int
) -> None:
    for n in range(5):
        await store.open_store_upload(mount_id, f"k{n}", f"u{n}", "dead-writer", -1.0)
    rounds = await asyncio.gather(
        *(store.claim_lapsed_store_uploads(f"janitor-{j}", LONG) for j in range(4))
    )
    taken = sorted(c.store_upload_id for claimed in rounds for c in claimed)
    assert taken == [f"u{n}" for n in range(5)]


async def test_a_janitor_that_dies_too_leaves_the_lease_to_another(
    store: MetaStore, mount_id: int
) -> None:
    record = await store.open_store_upload(mount_id, "k", "u", "dead-writer", -1.0)
    assert [c.id for c in await store.claim_lapsed_store_uploads("janitor-1", -1.0)] == [record]
    assert [c.owner for c in await store.claim_lapsed_store_uploads("janitor-2", LONG)] == [
        "janitor-1"
    ]


async def test_a_held_upload_is_recorded_while_held_and_forgotten_after(
    store: MetaStore, mount_id: int
) -> None:
    leases = UploadLeases(store, mount_id, -1.0)  # lapses at once: a janitor sees it
    async with leases.holding("k", "u-held"):
        claimed = await store.claim_lapsed_store_uploads("janitor", LONG)
        assert [c.store_upload_id for c in claimed] == ["u-held"]
        await store.close_store_upload(claimed[0].id)
    with pytest.raises(RuntimeError):
        async with UploadLeases(store, mount_id, LONG).holding("k", "u-failed"):
            raise RuntimeError("the write failed")
    # Both forgotten: the one the janitor closed, the one whose writer left the context.
    assert await store.claim_lapsed_store_uploads("janitor", -1.0) == []


async def test_removing_the_mount_forgets_its_uploads(store: MetaStore, mount_id: int) -> None:
    await store.open_store_upload(mount_id, "k", "u", "dead-writer", -1.0)
    await store.remove_mount("data")
    assert await store.claim_lapsed_store_uploads("janitor", LONG) == []
