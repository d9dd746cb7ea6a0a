"""A write's database bookkeeping is one transaction, committed before the write returns, on
SQLite and PostgreSQL: the service over a real file store and a real database, with
faults made by the database itself (a trigger that refuses a row), no mocks.

- On a catalog=on mount (and a TTL -1 one) the version's row of a PUT, copy, delete or
  multipart complete is there when the call returns, or, when its transaction fails, the old
  one stays (and the client still has its success).
- A multipart complete removes its upload's rows in that same transaction.
- A queued older change of the key is never written after the newer one.
- A write costs one transaction (counted with SQLAlchemy's events)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from gateway.meta import MetaStore, SecretBox
from gateway.meta.engine import sqlite_path
from gateway.service import S3Service
from gateway.service.conditions import Conditions
from gateway.service.inputs import CopySource, DeleteEntry
from gateway.service.shared import Shared
from gateway.service.version_rows import Entry, VersionRows
from gateway.service.writes import WriteConditions
from gateway.stores import ObjectInfo, WriteAttrs
from tests.support.net import eventually_async
from tests.support.postgres import database_outage
from tests.support.service import worker
from tests.unit.test_meta import object_info

pytestmark = pytest.mark.anyio

IMMUTABLE = "imm"  # catalog=on, metadata_ttl=-1
TIMED = "timed"  # catalog=on, metadata_ttl=60
PLAIN = "plain"  # metadata_ttl=-1, no catalog


@dataclass
class Node:
    meta: MetaStore
    shared: Shared
    service: S3Service
    mounts: dict[str, int]


@pytest.fixture
async def node(database_url: str, tmp_path: Path) -> AsyncIterator[Node]:
    async with MetaStore(database_url, SecretBox([SecretBox.generate_key()])) as meta:
        await meta.migrate()
        mounts = {}
        for bucket, options in (
            (IMMUTABLE, {"catalog": "on", "metadata_ttl": "-1"}),
            (TIMED, {"catalog": "on", "metadata_ttl": "60"}),
            (PLAIN, {"metadata_ttl": "-1"}),
        ):
            origin = tmp_path / "origin" / bucket
            origin.mkdir(parents=True)
            mounts[bucket] = (await meta.add_mount(bucket, f"file://{origin}", options)).id
        async with worker(meta, tmp_path / "cache") as shared:
            yield Node(meta, shared, S3Service(shared), mounts)


async def _body(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def put(node: Node, bucket: str, key: str, data: bytes) -> str:
    info = await node.service.put_object(
        bucket, key, _body(data), len(data), WriteAttrs(), WriteConditions()
    )
    return info.etag


async def rows(node: Node, bucket: str = IMMUTABLE) -> dict[str, str]:
    """key -> ETag of a mount's rows of object versions, read at once."""
    query = "SELECT key, etag FROM object_versions WHERE mount_id = :m"
    async with node.meta.engine.connect() as conn:
        found = await conn.execute(sa.text(query), {"m": node.mounts[bucket]})
        return dict(found.all())


async def etag_of(node: Node, key: str) -> str:
    return (await node.service.head_object(IMMUTABLE, key, None, Conditions())).info.etag


async def refuse(node: Node, table: str, prefix: str) -> None:
    """A trigger that makes the database refuse rows of `table` whose key starts with
    `prefix`: a real fault, inside the write's transaction."""
    async with node.meta.engine.begin() as conn:
        if node.meta.dialect == "sqlite":
            await conn.execute(
                sa.text(
                    f"CREATE TRIGGER refuse_{table} BEFORE INSERT ON {table} "
                    f"WHEN substr(NEW.key, 1, {len(prefix)}) = '{prefix}' "
                    "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
                )
            )
            return
        await conn.execute(
            sa.text(
                f"CREATE FUNCTION refuse_{table}() RETURNS trigger AS $$ BEGIN "
                f"IF left(NEW.key, {len(prefix)}) = '{prefix}' THEN "
                "RAISE EXCEPTION 'refused by the test'; END IF; RETURN NEW; END $$ "
                "LANGUAGE plpgsql"
            )
        )
        await conn.execute(
            sa.text(
                f"CREATE TRIGGER refuse_{table} BEFORE INSERT ON {table} "
                f"FOR EACH ROW EXECUTE FUNCTION refuse_{table}()"
            )
        )


@contextmanager
def transactions(node: Node) -> Iterator[list[int]]:
    """Counts the transactions begun on the node's engine while the block runs."""
    count = [0]

    def began(_conn: Any) -> None:
        count[0] += 1

    event.listen(node.meta.engine.sync_engine, "begin", began)
    try:
        yield count
    finally:
        event.remove(node.meta.engine.sync_engine, "begin", began)


# -- one transaction, one row -----------------------------------------------------------------


async def test_every_write_has_its_row_when_it_returns(node: Node) -> None:
    etag = await put(node, IMMUTABLE, "a", b"first")
    assert node.shared.versions.rows.pending == 0  # not queued: written at once
    assert await rows(node) == {"a": etag}

    source = CopySource(IMMUTABLE, "a", Conditions())
    _, copied = await node.service.copy_object(source, IMMUTABLE, "b", None)
    assert await rows(node) == {"a": etag, "b": copied.etag}

    await node.service.delete_object(IMMUTABLE, "a")
    assert await rows(node) == {"b": copied.etag}

    etag_c = await put(node, IMMUTABLE, "c", b"third")
    entries = [DeleteEntry("b"), DeleteEntry("c"), DeleteEntry("never")]
    outcome = await node.service.delete_objects(IMMUTABLE, entries, None)
    assert [d.error for d in outcome] == [None, None, None]
    assert etag_c and await rows(node) == {}


async def test_a_failed_transaction_keeps_the_old_row_and_the_write_still_succeeds(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    old = await put(node, IMMUTABLE, "cat/x", b"old")
    await refuse(node, "object_versions", "cat/")
    # The row refused: the old version's row stays.
    new = await put(node, IMMUTABLE, "cat/x", b"new bytes")
    assert new != old
    assert await rows(node) == {"cat/x": old}
    assert "bookkeeping of the change of cat/x not recorded" in caplog.text
    await put(node, IMMUTABLE, "obj/y", b"y")  # another key is written
    assert await rows(node) == {"cat/x": old, "obj/y": await etag_of(node, "obj/y")}
    # A mount with a TTL, refused alike.
    await put(node, TIMED, "cat/z", b"z")
    assert "bookkeeping of the change of cat/z not recorded" in caplog.text
    assert await rows(node, TIMED) == {}
    # Either way the store has the write, and the node serves it.
    got = await node.service.head_object(IMMUTABLE, "cat/x", None, Conditions())
    assert got.info.etag == new
    assert (await node.service.head_object(IMMUTABLE, "obj/y", None, Conditions())).info.size == 1


@pytest.mark.parametrize("backend", ["postgresql"])  # a database server that goes away
async def test_with_the_database_away_a_write_succeeds_and_says_what_it_left_out(
    node: Node, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    old = await put(node, IMMUTABLE, "o", b"old")
    outage = database_outage(database_url)
    await asyncio.to_thread(outage.__enter__)  # it runs an event loop of its own
    try:
        new = await put(node, IMMUTABLE, "o", b"new bytes")
    finally:
        await asyncio.to_thread(outage.__exit__, None, None, None)
    assert new != old
    assert "bookkeeping of the change of o not recorded" in caplog.text
    assert await rows(node) == {"o": old}  # for the next crawl to correct


# -- multipart complete -----------------------------------------------------------------------


async def _upload(node: Node, bucket: str, key: str) -> tuple[str, list[tuple[int, str]]]:
    upload = await node.service.create_multipart_upload(bucket, key, WriteAttrs(), None)
    part = await node.service.upload_part(bucket, key, upload, 1, _body(b"part one"), 8)
    return upload, [(1, part.etag)]


async def upload_rows(node: Node) -> tuple[int, int]:
    async with node.meta.engine.connect() as conn:
        uploads = (await conn.execute(sa.text("SELECT count(*) FROM multipart_uploads"))).scalar()
        parts = (await conn.execute(sa.text("SELECT count(*) FROM multipart_parts"))).scalar()
    return int(uploads or 0), int(parts or 0)


async def test_a_multipart_complete_removes_its_upload_with_the_rows_of_the_object(
    node: Node,
) -> None:
    for bucket in (IMMUTABLE, TIMED, PLAIN):
        upload, parts = await _upload(node, bucket, "mp")
        assert await upload_rows(node) == (1, 1)
        with transactions(node) as count:
            info = await node.service.complete_multipart_upload(bucket, "mp", upload, parts)
        assert await upload_rows(node) == (0, 0)
        assert await rows(node, bucket) == {"mp": info.etag}
        # Two reads (the upload, its parts), the key's lock taken and released (one write
        # each: completes of a key go one at a time in the fleet), and one write of all the
        # bookkeeping.
        assert count[0] == 5, bucket


async def test_a_failed_complete_keeps_the_upload_rows_and_writes_no_catalog_row(
    node: Node,
) -> None:
    await refuse(node, "object_versions", "mp")
    upload, parts = await _upload(node, IMMUTABLE, "mp")
    info = await node.service.complete_multipart_upload(IMMUTABLE, "mp", upload, parts)
    assert info.size == 8  # the client has its object
    assert await upload_rows(node) == (1, 1)  # left for the janitor, with no row of the object
    assert await rows(node) == {}
    # A retry (its answer lost) gets the same answer, not a second complete at the store.
    again = await node.service.complete_multipart_upload(IMMUTABLE, "mp", upload, parts)
    assert again == info


# -- transactions a write costs ---------------------------------------------------------------


async def test_a_write_costs_one_transaction(node: Node) -> None:
    for bucket in (IMMUTABLE, TIMED):
        with transactions(node) as count:
            await put(node, bucket, "k", b"data")
        assert count[0] == 1, bucket
        with transactions(node) as count:
            await node.service.copy_object(
                CopySource(bucket, "k", Conditions()), bucket, "k2", None
            )
        assert count[0] == 1, bucket
        with transactions(node) as count:
            await node.service.delete_object(bucket, "k")
        assert count[0] == 1, bucket
    await node.shared.versions.rows.close()  # nothing left queued to write later
    assert node.shared.versions.rows.pending == 0


# -- per-key order of the rows------------------------------------------------------------


async def objects(meta: MetaStore, mount_id: int) -> dict[str, int]:
    async with meta.engine.connect() as conn:
        found = await conn.execute(
            sa.text("SELECT key, size FROM object_versions WHERE mount_id = :m"), {"m": mount_id}
        )
        return dict(found.all())


async def test_a_queued_older_change_is_never_written_after_the_newer(node: Node) -> None:
    meta, mount_id = node.meta, node.mounts[PLAIN]
    recorder = VersionRows(meta, delay=3600.0)  # the batch waits until close
    recorder.record(mount_id, "k", object_info("k", size=1))  # a miss learnt it
    recorder.record(mount_id, "other", object_info("other", size=1))
    await recorder.record_now(mount_id, "k", object_info("k", size=2))  # then a write
    assert await objects(meta, mount_id) == {"k": 2}
    assert _known(await recorder.lookup(mount_id, "other")) == (object_info("other", size=1), True)
    await recorder.close()  # the batch: the other key, and not the older change of k
    assert await objects(meta, mount_id) == {"k": 2, "other": 1}

    # A delete after a queued miss: the row is gone, and stays gone.
    recorder = VersionRows(meta, delay=3600.0)
    recorder.record(mount_id, "k", object_info("k", size=3))
    await recorder.record_now(mount_id, "k", None)
    await recorder.close()
    assert await objects(meta, mount_id) == {"other": 1}


@asynccontextmanager
async def held(node: Node) -> AsyncIterator[None]:
    """Writers of `object_versions` wait while the block runs: SQLite's write lock, or PostgreSQL's
    lock on the table, taken on a connection of the test's own."""
    if node.meta.dialect == "sqlite":
        path = sqlite_path(node.meta.url)
        assert path is not None
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            conn.execute("ROLLBACK")
            conn.close()
        return
    async with node.meta.engine.connect() as pg, pg.begin():
        await pg.execute(sa.text("LOCK TABLE object_versions IN EXCLUSIVE MODE"))
        yield


async def test_a_write_waits_for_the_older_batch_of_its_key_in_flight(node: Node) -> None:
    meta, mount_id = node.meta, node.mounts[PLAIN]
    recorder = VersionRows(meta, delay=0.0)
    async with held(node):
        with transactions(node) as count:
            recorder.record(mount_id, "k", object_info("k", size=1))
            await eventually_async(lambda: count[0] == 1)  # the batch is being written
            assert _known(await recorder.lookup(mount_id, "k")) == (object_info("k", size=1), True)
            change = recorder.record_now(mount_id, "k", object_info("k", size=2))
            newer = asyncio.create_task(change)

            async def the_newer_known() -> bool:
                found = _known(await recorder.lookup(mount_id, "k"))
                return found == (object_info("k", size=2), True)

            await eventually_async(the_newer_known)  # the newer change has begun...
            assert not newer.done() and count[0] == 1  # ...and waits for the batch to end
    await newer
    assert await objects(meta, mount_id) == {"k": 2}
    await recorder.close()
    assert await objects(meta, mount_id) == {"k": 2}


def _known(entry: Entry | None) -> tuple[ObjectInfo, bool] | None:
    """What a row says of the version (not when it was written)."""
    return None if entry is None else (entry.info, entry.complete)
