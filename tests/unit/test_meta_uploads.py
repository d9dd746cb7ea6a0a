"""Multipart upload state in the metadata store, on SQLite and PostgreSQL: uploads, parts,
listing in S3 order, cascades, the reaper's query, and the 0002 migration."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Iterator
from datetime import UTC, datetime, timedelta
from types import MappingProxyType

import pytest
import sqlalchemy as sa
from alembic import command

from gateway.meta import (
    MetaStore,
    PartRecord,
    SecretBox,
    UploadGone,
    UploadRecord,
    head_revision,
)
from gateway.meta.migrate import alembic_config
from gateway.meta.tables import multipart_uploads
from tests.support.postgres import temp_database

pytestmark = pytest.mark.anyio

ATTRS = {
    "content_type": "text/plain; charset=utf-8",
    "metadata": {"owner": "zoë", "purpose": "日本語 ✓"},
}
BIG = 5 * 2**30  # a part's largest size: beyond 32 bits
EPOCH = datetime(2025, 1, 1, tzinfo=UTC)


@pytest.fixture
def box() -> SecretBox:
    return SecretBox([SecretBox.generate_key()])


@pytest.fixture
async def store(database_url: str, box: SecretBox) -> AsyncIterator[MetaStore]:
    async with MetaStore(database_url, box) as store:
        await store.migrate()
        yield store


@pytest.fixture
async def mount_id(store: MetaStore) -> int:
    return (await store.add_mount("data", "s3://origin", {})).id


async def raw_rows(store: MetaStore, sql: str) -> list[tuple[object, ...]]:
    async with store.engine.connect() as conn:
        return [tuple(row) for row in await conn.execute(sa.text(sql))]


async def set_initiated(store: MetaStore, upload_id: str, when: datetime) -> None:
    """Backdate an upload: the store stamps `now`, tests need chosen times."""
    query = (
        sa.update(multipart_uploads)
        .where(multipart_uploads.c.upload_id == upload_id)
        .values(initiated_at=when)
    )
    async with store.engine.begin() as conn:
        await conn.execute(query)


async def create(store: MetaStore, mount_id: int, key: str, upload_id: str) -> UploadRecord:
    return await store.create_upload(upload_id, mount_id, key, f"store-{upload_id}", {}, None)


def ids(uploads: list[UploadRecord]) -> list[str]:
    return [u.upload_id for u in uploads]


# -- uploads and parts


async def test_create_upload_and_get_it_back(store: MetaStore, mount_id: int) -> None:
    created = await store.create_upload("up-1", mount_id, "dir/ünï 🎉", "store-1", ATTRS, "GKKEY")
    anonymous = await store.create_upload("up-2", mount_id, "k", "store-2", {}, None)

    assert created == UploadRecord(
        "up-1", mount_id, "dir/ünï 🎉", "store-1", ATTRS, created.initiated_at, "GKKEY"
    )
    assert created.initiated_at.utcoffset() == timedelta(0)
    assert abs(datetime.now(UTC) - created.initiated_at) < timedelta(minutes=1)
    assert await store.get_upload("up-1") == created
    assert await store.get_upload("up-2") == anonymous
    assert anonymous.access_key is None
    assert dict(anonymous.attrs) == {}
    assert await store.get_upload("up-3") is None


async def test_upload_attrs_may_be_read_only_mappings(store: MetaStore, mount_id: int) -> None:
    # The service hands back a record's own attrs (a mapping proxy) and proxies of metadata.
    given = MappingProxyType({"metadata": MappingProxyType({"k": "v"}), "expires": None})
    first = await store.create_upload("up-1", mount_id, "k", "s-1", given, None)
    again = await store.create_upload("up-2", mount_id, "k", "s-2", first.attrs, None)

    stored = await store.get_upload("up-2")
    assert stored is not None
    assert stored.attrs == again.attrs == {"metadata": {"k": "v"}, "expires": None}


async def test_put_part_again_replaces_the_old_part(store: MetaStore, mount_id: int) -> None:
    await create(store, mount_id, "k", "up")
    await store.put_part("up", 1, '"old"', 10)
    [old] = await store.list_parts("up")

    await store.put_part("up", 1, '"new"', BIG)

    [new] = await store.list_parts("up")
    assert (new.part_number, new.etag, new.size) == (1, '"new"', BIG)
    assert new.uploaded_at >= old.uploaded_at
    assert new.uploaded_at.utcoffset() == timedelta(0)
    assert await raw_rows(store, "SELECT count(*) FROM multipart_parts") == [(1,)]


async def test_list_parts_pages_in_part_number_order(store: MetaStore, mount_id: int) -> None:
    await create(store, mount_id, "k", "up")
    await create(store, mount_id, "k", "other")
    for number in (3, 10000, 1, 5, 2):
        await store.put_part("up", number, f'"etag-{number}"', BIG + number)
    await store.put_part("other", 4, '"not mine"', 1)

    def numbers(parts: list[PartRecord]) -> list[int]:
        return [p.part_number for p in parts]

    assert numbers(await store.list_parts("up")) == [1, 2, 3, 5, 10000]
    assert numbers(await store.list_parts("up", limit=2)) == [1, 2]
    assert numbers(await store.list_parts("up", after=2, limit=2)) == [3, 5]
    assert numbers(await store.list_parts("up", after=4)) == [5, 10000]
    assert await store.list_parts("up", after=10000) == []
    assert await store.list_parts("missing") == []
    [part] = await store.list_parts("up", after=9999)
    assert (part.etag, part.size) == ('"etag-10000"', BIG + 10000)


async def test_delete_upload_removes_its_parts(store: MetaStore, mount_id: int) -> None:
    await create(store, mount_id, "k", "gone")
    await create(store, mount_id, "k", "kept")
    for number in (1, 2, 3):
        await store.put_part("gone", number, '"e"', 1)
    await store.put_part("kept", 1, '"e"', 1)

    assert await store.delete_upload("gone") is True
    assert await store.delete_upload("gone") is False

    assert await store.get_upload("gone") is None
    assert await store.list_parts("gone") == []
    assert await raw_rows(store, "SELECT upload_id FROM multipart_parts") == [("kept",)]


async def test_put_part_of_a_missing_upload_raises_upload_gone(
    store: MetaStore, mount_id: int
) -> None:
    await create(store, mount_id, "k", "up")
    await store.put_part("up", 1, '"e"', 1)
    await store.delete_upload("up")

    with pytest.raises(UploadGone):
        await store.put_part("up", 2, '"e"', 1)
    with pytest.raises(UploadGone):
        await store.put_part("up", 1, '"e"', 1)  # the upsert path too
    with pytest.raises(UploadGone):
        await store.put_part("never-created", 1, '"e"', 1)
    assert await raw_rows(store, "SELECT count(*) FROM multipart_parts") == [(0,)]


async def test_parts_racing_an_abort_never_outlive_it(store: MetaStore, mount_id: int) -> None:
    await create(store, mount_id, "k", "up")

    operations: list[Awaitable[object]] = [
        store.put_part("up", number, '"e"', 1) for number in range(1, 21)
    ]
    operations.insert(10, store.delete_upload("up"))
    results = await asyncio.gather(*operations, return_exceptions=True)

    for result in results:
        assert result is None or result is True or isinstance(result, UploadGone), result
    assert await store.get_upload("up") is None
    assert await raw_rows(store, "SELECT count(*) FROM multipart_parts") == [(0,)]


# -- listing uploads


async def test_list_uploads_orders_by_utf8_bytes_then_initiation(
    store: MetaStore, mount_id: int
) -> None:
    # Code point (= UTF-8 byte) order differs from case-folding collations ("B" < "a") and from
    # UTF-16 order (U+FF61 < U+1F600).
    keys = ["a", "B", "é", "z", "日本", "😀", "\uff61", "a/b", "ab", "a b"]
    for n, key in enumerate(keys):
        await create(store, mount_id, key, f"id-{n:02}")
    # Three uploads of one key, begun in the reverse order of their ids.
    for n, upload_id in enumerate(["u-c", "u-b", "u-a"]):
        await create(store, mount_id, "same", upload_id)
        await set_initiated(store, upload_id, EPOCH + timedelta(seconds=n))
    other = await store.add_mount("other", "s3://elsewhere", {})
    await create(store, other.id, "a", "foreign")

    listed = await store.list_uploads(mount_id)

    expected_keys = sorted([*keys, "same", "same", "same"], key=lambda k: k.encode())
    assert [u.key for u in listed] == expected_keys
    same = [u.upload_id for u in listed if u.key == "same"]
    assert same == ["u-c", "u-b", "u-a"]
    assert "foreign" not in ids(listed)
    assert ids(await store.list_uploads(mount_id, limit=3)) == ids(listed)[:3]


async def test_list_uploads_after_key_marker_skips_that_key(
    store: MetaStore, mount_id: int
) -> None:
    for upload_id, key in [("1", "a"), ("2", "b"), ("3", "b"), ("4", "bb"), ("5", "c")]:
        await create(store, mount_id, key, upload_id)

    assert ids(await store.list_uploads(mount_id, key_marker="b")) == ["4", "5"]
    assert ids(await store.list_uploads(mount_id, key_marker="a0")) == ["2", "3", "4", "5"]
    assert ids(await store.list_uploads(mount_id, key_marker="c")) == []
    # Without a key marker the upload id marker means nothing, as in S3.
    assert ids(await store.list_uploads(mount_id, upload_id_marker="3")) == ids(
        await store.list_uploads(mount_id)
    )


async def test_list_uploads_after_key_and_upload_id_marker(store: MetaStore, mount_id: int) -> None:
    await create(store, mount_id, "a", "a-1")
    # Begun in the reverse order of their ids: "after the marker" follows initiation time.
    for n, upload_id in enumerate(["k-9", "k-5", "k-1"]):
        await create(store, mount_id, "k", upload_id)
        await set_initiated(store, upload_id, EPOCH + timedelta(seconds=n))
    await create(store, mount_id, "z", "z-1")

    after_first = await store.list_uploads(mount_id, key_marker="k", upload_id_marker="k-9")
    after_last = await store.list_uploads(mount_id, key_marker="k", upload_id_marker="k-1")

    assert ids(after_first) == ["k-5", "k-1", "z-1"]
    assert ids(after_last) == ["z-1"]


async def test_list_uploads_pages_with_markers_cover_everything_once(
    store: MetaStore, mount_id: int
) -> None:
    for n in range(11):
        await create(store, mount_id, ["x", "y", "ÿ", "ÿ/é"][n % 4], f"id-{n:02}")
    for n in range(4):  # uploads of one key begun at the same instant: upload id breaks the tie
        await create(store, mount_id, "y", f"tie-{n}")
        await set_initiated(store, f"tie-{n}", EPOCH)
    everything = await store.list_uploads(mount_id)

    pages: list[UploadRecord] = []
    key_marker = upload_id_marker = ""
    while page := await store.list_uploads(
        mount_id, key_marker=key_marker, upload_id_marker=upload_id_marker, limit=2
    ):
        pages += page
        key_marker, upload_id_marker = page[-1].key, page[-1].upload_id

    assert len(everything) == 15
    assert pages == everything


async def test_list_uploads_relists_a_key_whose_marker_upload_vanished(
    store: MetaStore, mount_id: int
) -> None:
    for n, upload_id in enumerate(["k-1", "k-2", "k-3"]):
        await create(store, mount_id, "k", upload_id)
        await set_initiated(store, upload_id, EPOCH + timedelta(seconds=n))
    await create(store, mount_id, "z", "z-1")
    await store.delete_upload("k-2")  # aborted between two pages: the next marker is gone

    listed = await store.list_uploads(mount_id, key_marker="k", upload_id_marker="k-2")

    # Its place is unknown: the key starts over rather than risk skipping an upload.
    assert ids(listed) == ["k-1", "k-3", "z-1"]


async def test_list_uploads_prefix_is_a_byte_prefix(store: MetaStore, mount_id: int) -> None:
    keys = [
        "photos",
        "photos/",
        "photos/a.jpg",
        "photos/é/b.jpg",
        "photos/\U0010ffff",
        "photos0",  # "0" follows "/" in ASCII: the first key past the range
        "photos.",
        "Photos/c.jpg",  # SQLite's LIKE would match this one
        "x\U0010ffff\U0010ffff",
        "x\U0010ffffa",
        "y",
        "\ud7ffa",
        "\ue000",
    ]
    for n, key in enumerate(keys):
        await create(store, mount_id, key, f"id-{n:02}")

    async def keys_with(prefix: str, key_marker: str = "") -> list[str]:
        listed = await store.list_uploads(mount_id, prefix=prefix, key_marker=key_marker)
        return [u.key for u in listed]

    assert await keys_with("photos/") == [
        "photos/",
        "photos/a.jpg",
        "photos/é/b.jpg",
        "photos/\U0010ffff",
    ]
    assert await keys_with("photos/", key_marker="photos/a.jpg") == [
        "photos/é/b.jpg",
        "photos/\U0010ffff",
    ]
    assert await keys_with("Photos") == ["Photos/c.jpg"]
    # Prefixes whose last code point cannot simply be bumped.
    assert await keys_with("x\U0010ffff") == ["x\U0010ffffa", "x\U0010ffff\U0010ffff"]
    assert await keys_with("\U0010ffff") == []
    assert await keys_with("\ud7ff") == ["\ud7ffa"]
    assert await keys_with("nothing") == []


# -- the reaper, cascades


async def test_stale_uploads_are_the_oldest_across_mounts(store: MetaStore, mount_id: int) -> None:
    other = await store.add_mount("other", "s3://elsewhere", {})
    now = datetime.now(UTC)
    ages = {"fresh": timedelta(hours=1), "day": timedelta(days=1, hours=1)}
    ages |= {"week": timedelta(days=7), "month": timedelta(days=30)}
    for upload_id, age in ages.items():
        await create(store, other.id if upload_id == "week" else mount_id, "k", upload_id)
        await set_initiated(store, upload_id, now - age)

    day_ago = now - timedelta(days=1)
    assert ids(await store.stale_uploads(day_ago)) == ["month", "week", "day"]
    assert ids(await store.stale_uploads(day_ago, limit=2)) == ["month", "week"]
    assert ids(await store.stale_uploads(now - timedelta(days=30))) == []
    assert ids(await store.stale_uploads(now)) == ["month", "week", "day", "fresh"]


async def test_removing_a_mount_removes_its_uploads_and_parts(store: MetaStore) -> None:
    gone = await store.add_mount("gone", "s3://a", {})
    kept = await store.add_mount("kept", "s3://b", {})
    await create(store, gone.id, "k", "gone-up")
    await create(store, kept.id, "k", "kept-up")
    await store.put_part("gone-up", 1, '"e"', 1)
    await store.put_part("kept-up", 1, '"e"', 1)

    assert await store.remove_mount("gone")

    assert await store.get_upload("gone-up") is None
    assert ids(await store.list_uploads(kept.id)) == ["kept-up"]
    assert await raw_rows(store, "SELECT upload_id FROM multipart_uploads") == [("kept-up",)]
    assert await raw_rows(store, "SELECT upload_id FROM multipart_parts") == [("kept-up",)]


# -- the migration


async def test_upgrade_from_0001_keeps_data_and_is_idempotent(
    database_url: str, box: SecretBox
) -> None:
    config = alembic_config(database_url)
    await asyncio.to_thread(command.upgrade, config, "0001")
    async with MetaStore(database_url, box) as store:
        mount = await store.add_mount("old", "s3://origin", {})

        await store.migrate()
        await create(store, mount.id, "k", "up")
        await store.migrate()

        assert await store.schema_revision() == head_revision() >= "0002"
        assert await store.get_mount("old") == mount
        assert ids(await store.list_uploads(mount.id)) == ["up"]


async def test_downgrade_to_0001_drops_the_upload_tables(store: MetaStore) -> None:
    config = alembic_config(store.url)
    await asyncio.to_thread(command.downgrade, config, "0001")

    async with store.engine.connect() as conn:
        tables = set(await conn.run_sync(lambda sync: sa.inspect(sync).get_table_names()))
    assert {"multipart_uploads", "multipart_parts"}.isdisjoint(tables)
    assert {"mounts", "objects"} <= tables

    await store.migrate()
    mount = await store.add_mount("again", "s3://origin", {})
    await create(store, mount.id, "k", "up")  # the tables are back and usable


@pytest.fixture
def postgres_url() -> Iterator[str]:
    with temp_database() as url:
        yield url


async def test_upload_keys_collate_as_bytes_on_postgresql(
    postgres_url: str, box: SecretBox
) -> None:
    # The test server's default collation may sort by code point already, which would hide a
    # missing "C" on the column from the ordering tests; so the column itself is checked.
    # (SQLite has no collation to set: it compares text as bytes.)
    async with MetaStore(postgres_url, box) as store:
        await store.migrate()
        rows = await raw_rows(
            store,
            "SELECT collation_name FROM information_schema.columns "
            "WHERE table_name = 'multipart_uploads' AND column_name = 'key'",
        )
    assert rows == [("C",)]
