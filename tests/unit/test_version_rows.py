"""The rows of object versions written behind the requests, many changes a transaction, on
SQLite and PostgreSQL: what was recorded is in the database after close, in the order it was
made; one batched lookup answers each key with its row (and whether it is complete)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import sqlalchemy as sa

from gateway.meta import MetaStore, SecretBox
from gateway.service.version_rows import BATCH, Entry, VersionRows
from gateway.stores import ObjectInfo
from tests.unit.test_meta import object_info

pytestmark = pytest.mark.anyio


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[MetaStore]:
    async with MetaStore(database_url, SecretBox([SecretBox.generate_key()])) as store:
        await store.migrate()
        yield store


async def keys(store: MetaStore, mount_id: int) -> dict[str, int]:
    async with store.engine.connect() as conn:
        rows = await conn.execute(
            sa.text("SELECT key, size FROM object_versions WHERE mount_id = :m"), {"m": mount_id}
        )
        return {key: size for key, size in rows}


async def test_record_versions_upserts_and_deletes_in_one_call(store: MetaStore) -> None:
    mount = await store.add_mount("data", "s3://origin", {})
    await store.record_versions([(mount.id, "old", object_info("old", size=1), True)])
    await store.record_versions(
        [
            (mount.id, "a", object_info("a", size=2), True),
            (mount.id, "old", None, True),
            (mount.id, "b", object_info("b", size=3), False),
        ]
    )
    assert await keys(store, mount.id) == {"a": 2, "b": 3}
    got = await store.find_versions([(mount.id, "a"), (mount.id, "b")])
    assert got[(mount.id, "a")][:2] == (object_info("a", size=2), True)
    assert got[(mount.id, "b")][1] is False
    await store.record_versions([(mount.id, "a", object_info("a", size=4), True)])
    assert await keys(store, mount.id) == {"a": 4, "b": 3}


async def test_everything_recorded_is_written_by_close(store: MetaStore) -> None:
    mount = await store.add_mount("data", "s3://origin", {})
    recorder = VersionRows(store)
    count = BATCH * 2 + 17  # more than one transaction's worth
    for i in range(count):
        recorder.record(mount.id, f"k{i}", object_info(f"k{i}", size=i))
    assert recorder.pending == count  # nothing is written while the caller runs
    await recorder.close()
    assert recorder.pending == 0
    assert await keys(store, mount.id) == {f"k{i}": i for i in range(count)}


async def test_a_later_change_to_a_key_wins(store: MetaStore) -> None:
    mount = await store.add_mount("data", "s3://origin", {})
    recorder = VersionRows(store)
    recorder.record(mount.id, "gone", object_info("gone", size=1))  # a miss learnt it...
    recorder.record(mount.id, "kept", object_info("kept", size=1))
    recorder.record(mount.id, "gone", None)  # ...then a DELETE through the gateway
    recorder.record(mount.id, "kept", object_info("kept", size=2))
    await recorder.close()
    assert await keys(store, mount.id) == {"kept": 2}

    # The same while a batch is being written: a change made meanwhile goes after it.
    recorder.record(mount.id, "kept", object_info("kept", size=3))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    recorder.record(mount.id, "kept", None)
    await recorder.close()
    assert await keys(store, mount.id) == {}


async def test_a_removed_mount_does_not_lose_the_others(store: MetaStore) -> None:
    kept = await store.add_mount("kept", "s3://a", {})
    removed = await store.add_mount("removed", "s3://b", {})
    assert await store.remove_mount("removed")
    recorder = VersionRows(store)
    recorder.record(kept.id, "a", object_info("a", size=1))
    recorder.record(removed.id, "b", object_info("b", size=2))  # no such mount any more
    recorder.record(kept.id, "c", object_info("c", size=3))
    await recorder.close()
    assert await keys(store, kept.id) == {"a": 1, "c": 3}
    assert await keys(store, removed.id) == {}


async def test_lookups_at_once_are_answered_each(store: MetaStore) -> None:
    one = await store.add_mount("one", "s3://a", {})
    two = await store.add_mount("two", "s3://b", {})
    await store.record_versions(
        [(one.id, f"k{i}", object_info(f"k{i}", size=i), True) for i in range(0, BATCH + 50, 2)]
        + [(two.id, "k1", object_info("k1", size=99), True)]
    )
    recorder = VersionRows(store)
    wanted = [(one.id, f"k{i}") for i in range(BATCH + 50)] + [(two.id, "k1"), (two.id, "k2")]
    found = await asyncio.gather(*(recorder.lookup(m, k) for m, k in wanted))
    for (mount_id, key), entry in zip(wanted, found, strict=True):
        info = entry.info if entry is not None else None
        i = int(key[1:])
        if mount_id == two.id:
            assert (info.size if info else None) == (99 if key == "k1" else None)
        elif i % 2 == 0:
            assert info == object_info(key, size=i)
        else:
            assert info is None
    await recorder.close()


async def test_a_lookup_sees_a_change_not_yet_written(store: MetaStore) -> None:
    mount = await store.add_mount("data", "s3://origin", {})
    await store.record_versions([(mount.id, "k", object_info("k", size=1), True)])
    recorder = VersionRows(store)
    recorder.record(mount.id, "k", None)
    recorder.record(mount.id, "new", object_info("new", size=2))
    assert await recorder.lookup(mount.id, "k") is None
    assert _known(await recorder.lookup(mount.id, "new")) == (object_info("new", size=2), True)
    await recorder.close()
    assert _known(await recorder.lookup(mount.id, "new")) == (object_info("new", size=2), True)
    assert await recorder.lookup(mount.id, "k") is None


async def test_a_doubted_row_is_kept_and_found_incomplete(store: MetaStore) -> None:
    """A version not found at the store: the row stays listed, no read trusts it."""
    mount = await store.add_mount("data", "s3://origin", {})
    rows = VersionRows(store)
    await rows.record_now(mount.id, "k", object_info("k", size=1))
    await rows.doubt(mount.id, "k")
    assert _known(await rows.lookup(mount.id, "k")) == (object_info("k", size=1), False)
    await rows.close()


async def test_an_unreachable_database_remembers_nothing(database_url: str) -> None:
    """Lookups of a database that cannot be reached answer 'nothing remembered' (the miss
    then asks the store), and queued changes are dropped with a warning, not raised."""
    if not database_url.startswith("postgresql"):
        pytest.skip("an unreachable SQLite file is a configuration error, not an outage")
    from tests.support.net import free_port

    dead = f"postgresql+asyncpg://postgres@127.0.0.1:{free_port()}/nothing"
    async with MetaStore(dead, SecretBox([SecretBox.generate_key()])) as store:
        recorder = VersionRows(store)
        assert await recorder.lookup(1, "k") is None
        recorder.record(1, "k", object_info("k"))
        await recorder.close()
        assert recorder.pending == 0


async def test_changes_made_within_the_delay_share_a_transaction(
    store: MetaStore, database_url: str
) -> None:
    """Misses that end a few turns of the event loop apart are written together."""
    mount = await store.add_mount("data", "s3://origin", {})
    calls: list[int] = []

    class Counted(MetaStore):
        async def record_versions(self, changes, written_at=None, also=(), stamps=None):  # type: ignore[no-untyped-def]
            calls.append(len(changes))
            await super().record_versions(changes, written_at, also, stamps)

    async with Counted(database_url, SecretBox([SecretBox.generate_key()])) as counted:
        recorder = VersionRows(counted, delay=60.0)  # the test ends it with close()
        for i in range(10):
            recorder.record(mount.id, f"k{i}", object_info(f"k{i}", size=i))
            for _ in range(3):
                await asyncio.sleep(0)  # other requests' turns
        assert calls == []  # nothing is written within the delay
        await recorder.close()  # which ends it: the queue is written at once
    assert calls == [10]
    assert await keys(store, mount.id) == {f"k{i}": i for i in range(10)}


def _known(entry: Entry | None) -> tuple[ObjectInfo, bool] | None:
    """What a row says of the version (not when it was written)."""
    return None if entry is None else (entry.info, entry.complete)


async def test_the_rows_after_a_key_are_listed_in_order_and_looked_up_together(
    store: MetaStore,
) -> None:
    mount = await store.add_mount("data", "s3://origin", {})
    other = await store.add_mount("other", "s3://origin", {})
    await store.record_versions(
        [(mount.id, f"k{i:02d}", object_info(f"k{i:02d}", size=i), True) for i in range(10)]
        + [(other.id, "k045", object_info("k045", size=1), True)]
    )
    rows = VersionRows(store)
    assert await rows.keys_after(mount.id, "k03", 4) == ["k04", "k05", "k06", "k07"]
    assert await rows.keys_after(mount.id, "k09", 4) == []
    # A change queued for a key: its row is not yet what was learnt, so it is left out.
    rows.record(mount.id, "k05", object_info("k05", size=99))
    found = await rows.lookup_many(mount.id, ["k04", "k05", "k06", "absent"])
    assert set(found) == {"k04", "k06"}
    assert found["k04"].info == object_info("k04", size=4) and found["k04"].complete
    await rows.close()
