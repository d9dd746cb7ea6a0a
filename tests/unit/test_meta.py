"""The metadata store on SQLite and PostgreSQL: schema, mounts, keys, object metadata, secrets."""

from __future__ import annotations

import asyncio
import re
import stat
import sys
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from subprocess import PIPE

import pytest
import sqlalchemy as sa
from alembic import command

from gateway.meta import (
    SCHEMA_HEAD,
    SECRET_OPTIONS,
    AccessKeyExists,
    InvalidSecretKey,
    MetaStore,
    MetaUnavailable,
    MountExists,
    SecretBox,
    WrongSecretKey,
    default_database_url,
    head_revision,
    normalize_database_url,
    run_migrations,
)
from gateway.meta.migrate import alembic_config
from gateway.meta.tables import UTCDateTime
from gateway.meta.versions import object_versions
from gateway.stores.base import ObjectInfo
from tests.support.net import free_port

pytestmark = pytest.mark.anyio

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
TABLES = {"mounts", "access_keys", "object_versions", "alembic_version"}


@pytest.fixture
def secret_key() -> str:
    return SecretBox.generate_key()


@pytest.fixture
def box(secret_key: str) -> SecretBox:
    return SecretBox([secret_key])


@pytest.fixture
async def store(database_url: str, box: SecretBox) -> AsyncIterator[MetaStore]:
    async with MetaStore(database_url, box) as store:
        await store.migrate()
        yield store


async def table_names(store: MetaStore) -> set[str]:
    async with store.engine.connect() as conn:
        return set(await conn.run_sync(lambda sync: sa.inspect(sync).get_table_names()))


async def raw_rows(store: MetaStore, sql: str) -> list[tuple[object, ...]]:
    async with store.engine.connect() as conn:
        return [tuple(row) for row in await conn.execute(sa.text(sql))]


def object_info(key: str, **overrides: object) -> ObjectInfo:
    fields: dict[str, object] = {
        "key": key,
        "size": 5 * 2**40,  # beyond 32 bits
        "etag": '"9b2cf535f27731c974343645a3985328"',
        "last_modified": datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC),
        "content_type": "text/plain; charset=utf-8",
        "content_encoding": "gzip",
        "cache_control": "max-age=60",
        "metadata": {"owner": "zoë", "purpose": "日本語 ✓"},
        "storage_class": "GLACIER_IR",
    }
    fields.update(overrides)
    return ObjectInfo(**fields)  # type: ignore[arg-type]


# -- schema


async def test_migrate_creates_schema_and_is_idempotent(database_url: str, box: SecretBox) -> None:
    async with MetaStore(database_url, box) as store:
        assert await store.schema_revision() is None
        await store.migrate()
        assert await table_names(store) >= TABLES
        assert await store.schema_revision() == head_revision()
        mount = await store.add_mount("kept", "file:///srv", {})

        await store.migrate()

        assert await store.schema_revision() == head_revision()
        assert await store.get_mount("kept") == mount
        assert await raw_rows(store, "SELECT version_num FROM alembic_version") == [
            (head_revision(),)
        ]


def test_schema_head_names_the_newest_migration() -> None:
    # MetaStore.migrate skips Alembic when the database is at SCHEMA_HEAD: a migration added
    # without moving SCHEMA_HEAD would never run on a database that was at the old head.
    assert head_revision() == SCHEMA_HEAD


async def test_a_database_behind_the_head_is_upgraded(database_url: str, box: SecretBox) -> None:
    config = alembic_config(database_url)
    await asyncio.to_thread(command.upgrade, config, "0006_catalog")
    async with MetaStore(database_url, box) as store:
        assert await store.schema_revision() == "0006_catalog"
        await store.migrate()
        assert await store.schema_revision() == SCHEMA_HEAD
        assert await table_names(store) >= TABLES


async def test_the_two_tables_of_versions_become_one_keeping_their_rows(
    database_url: str, box: SecretBox
) -> None:
    """0010 merges `objects` (immutable mounts' versions) and `catalog_entries` (catalog rows):
    every row of both is kept; a key in both keeps the row written last; a downgrade gives
    both tables back."""
    config = alembic_config(database_url)
    await asyncio.to_thread(command.upgrade, config, "0009_console_signed_out")
    old, new = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 6, 1, tzinfo=UTC)

    def stamped(sql: str, *names: str) -> sa.TextClause:
        return sa.text(sql).bindparams(*(sa.bindparam(n, type_=UTCDateTime()) for n in names))

    async with MetaStore(database_url, box) as store:
        async with store.engine.begin() as conn:
            await conn.execute(
                stamped(
                    "INSERT INTO mounts (id, bucket, uri, options, created_at, updated_at)"
                    " VALUES (1, 'b', 's3://o', '{\"metadata_ttl\": \"-1\"}', :t, :t)",
                    "t",
                ),
                {"t": old},
            )
            objects = (
                "INSERT INTO objects (mount_id, key, size, etag, last_modified, content_type,"
                " extra, checked_at) VALUES (1, :k, :s, :e, :t, :ct, :x, :c)"
            )
            rows = [  # only here; in both, newer here; in both, older here
                {"k": "o/only", "s": 1, "e": '"a"', "ct": "text/plain", "c": new},
                {"k": "both/new", "s": 2, "e": '"b"', "ct": None, "c": new},
                {"k": "both/old", "s": 3, "e": '"c"', "ct": None, "c": old},
            ]
            for row in rows:
                extra = '{"metadata":{"who":"zoë"}}' if row["k"] == "o/only" else "{}"
                await conn.execute(stamped(objects, "t", "c"), {**row, "t": new, "x": extra})
            catalog = (
                "INSERT INTO catalog_entries (mount_id, key, size, etag, last_modified, attrs,"
                " complete, written_at) VALUES (1, :k, :s, :e, :t, '{}', :complete, :w)"
            )
            for key, size, written in (
                ("c/only", 4, old),
                ("both/new", 5, old),
                ("both/old", 6, new),
            ):
                await conn.execute(
                    stamped(catalog, "t", "w"),
                    {"k": key, "s": size, "e": '"d"', "t": new, "complete": False, "w": written},
                )
        await store.migrate()
        assert await store.schema_revision() == SCHEMA_HEAD
        keys = ["o/only", "both/new", "both/old", "c/only"]
        found = await store.find_versions([(1, k) for k in keys])
        assert {k: (found[(1, k)][0].size, found[(1, k)][1]) for k in keys} == {
            "o/only": (1, True), "both/new": (2, True),
            "both/old": (6, False), "c/only": (4, False),
        }  # fmt: skip
        only = found[(1, "o/only")][0]
        assert (only.content_type, dict(only.metadata)) == ("text/plain", {"who": "zoë"})
        names = await table_names(store)
        assert "objects" not in names and "catalog_entries" not in names
    await asyncio.to_thread(command.downgrade, config, "0009_console_signed_out")
    async with MetaStore(database_url, box) as store:
        assert await raw_rows(store, "SELECT key FROM objects ORDER BY key") == [
            ("both/new",),
            ("o/only",),
        ]  # the complete rows of the immutable mount
        assert len(await raw_rows(store, "SELECT key FROM catalog_entries")) == 4
        await store.migrate()


async def test_concurrent_migrations_make_one_schema(database_url: str, box: SecretBox) -> None:
    # Separate processes, as two nodes (or a CLI and a server) starting at once would be. Each
    # imports first and waits for a go on stdin, so that the upgrades themselves overlap.
    code = (
        "import sys; from gateway.meta import run_migrations; "
        "sys.stdin.readline(); run_migrations(sys.argv[1])"
    )
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, database_url, stdin=PIPE, stderr=PIPE
        )
        for _ in range(6)
    ]
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
    results = await asyncio.gather(*(proc.communicate() for proc in procs))
    for proc, (_, stderr) in zip(procs, results, strict=True):
        assert proc.returncode == 0, stderr.decode()
    async with MetaStore(database_url, box) as store:
        assert await raw_rows(store, "SELECT version_num FROM alembic_version") == [
            (head_revision(),)
        ]
        assert await table_names(store) >= TABLES


async def test_migrations_match_the_tables_module(store: MetaStore) -> None:
    # Autogenerate compares gateway.meta.tables with the migrated database: a column added to
    # one and not the other fails here. (Raises AutogenerateDiffsDetected on a difference.)
    config = alembic_config(store.url)
    await asyncio.to_thread(command.check, config)


async def test_run_migrations_works_inside_a_running_event_loop(
    database_url: str, box: SecretBox
) -> None:
    run_migrations(database_url)  # blocking on purpose: the CLI may call it from a coroutine
    async with MetaStore(database_url, box) as store:
        assert await store.schema_revision() == head_revision()


async def test_database_unreachable_raises_meta_unavailable(
    backend: str, tmp_path: Path, box: SecretBox
) -> None:
    if backend == "sqlite":
        (tmp_path / "not-a-dir").write_text("")
        url = f"sqlite:///{tmp_path / 'not-a-dir' / 'gateway.db'}"
    else:
        url = f"postgresql://postgres@127.0.0.1:{free_port()}/gateway"
    async with MetaStore(url, box) as store:
        with pytest.raises(MetaUnavailable):
            await store.migrate()
        with pytest.raises(MetaUnavailable):
            await store.get_mount("any")
        with pytest.raises(MetaUnavailable):
            await store.create_key()


# -- mounts


async def test_mount_add_get_list_remove(store: MetaStore) -> None:
    added = await store.add_mount("data", "s3://origin/prefix", {"region": "eu-west-1"})
    other = await store.add_mount("Archive", "gs://cold", {})

    assert added.bucket == "data"
    assert added.uri == "s3://origin/prefix"
    assert dict(added.options) == {"region": "eu-west-1"}
    assert await store.get_mount("data") == added
    assert await store.get_mount("missing") is None
    assert [m.bucket for m in await store.list_mounts()] == ["Archive", "data"]
    assert added.id != other.id

    assert await store.remove_mount("data") is True
    assert await store.remove_mount("data") is False
    assert await store.get_mount("data") is None
    assert await store.list_mounts() == [other]


async def test_duplicate_bucket_raises_mount_exists(store: MetaStore) -> None:
    await store.add_mount("data", "s3://one", {})
    with pytest.raises(MountExists):
        await store.add_mount("data", "s3://two", {})
    mount = await store.get_mount("data")
    assert mount is not None
    assert mount.uri == "s3://one"


async def test_secret_options_are_encrypted_at_rest(store: MetaStore) -> None:
    options = {"access_key": "AKIAEXAMPLE", "secret_key": SECRET, "sas_token": "sv=2024&sig=x"}
    await store.add_mount("data", "s3://origin", options)

    [(raw,)] = await raw_rows(store, "SELECT options FROM mounts")
    assert SECRET not in str(raw)
    assert "sv=2024" not in str(raw)
    assert "AKIAEXAMPLE" in str(raw)  # not a secret: stays readable for operators
    mount = await store.get_mount("data")
    assert mount is not None
    assert dict(mount.options) == options


async def test_wrong_encryption_key_fails_clearly(database_url: str, store: MetaStore) -> None:
    await store.add_mount("data", "s3://origin", {"secret_key": SECRET})
    await store.create_key("GKTESTKEY", SECRET)
    old_key = SecretBox.generate_key()  # unrelated to the store's key
    async with MetaStore(database_url, SecretBox([old_key])) as wrong:
        with pytest.raises(WrongSecretKey, match="not configured"):
            await wrong.get_mount("data")
        with pytest.raises(WrongSecretKey):
            await wrong.get_key("GKTESTKEY")


async def test_rotated_key_list_still_decrypts_old_secrets(
    database_url: str, store: MetaStore, secret_key: str
) -> None:
    await store.add_mount("data", "s3://origin", {"secret_key": SECRET})
    rotated_box = SecretBox([SecretBox.generate_key(), secret_key])

    async with MetaStore(database_url, rotated_box) as rotated:
        mount = await rotated.get_mount("data")
        assert mount is not None
        assert mount.options["secret_key"] == SECRET
        await rotated.add_mount("new", "s3://origin", {"secret_key": SECRET})
    # Written under the new (first) key: the old key alone cannot read it.
    with pytest.raises(WrongSecretKey):
        await store.get_mount("new")


async def test_public_options_mask_secrets(store: MetaStore) -> None:
    options = {name: f"value-of-{name}" for name in SECRET_OPTIONS} | {"region": "eu"}
    mount = await store.add_mount("data", "s3://origin", options)

    public = mount.public_options()
    assert public["region"] == "eu"
    assert {public[name] for name in SECRET_OPTIONS} == {"***"}
    assert "value-of-" not in repr(mount)


async def test_generated_key_is_stable_across_restarts(database_url: str, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    async with MetaStore(database_url, SecretBox.from_config(None, None, data_dir)) as store:
        await store.migrate()
        await store.add_mount("data", "s3://origin", {"secret_key": SECRET})
    key_file = data_dir / "secret.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600

    async with MetaStore(database_url, SecretBox.from_config(None, None, data_dir)) as restarted:
        mount = await restarted.get_mount("data")
        assert mount is not None
        assert mount.options["secret_key"] == SECRET


# -- access keys


async def test_create_key_generates_aws_shaped_pair(store: MetaStore) -> None:
    key = await store.create_key(description="ci runner")

    assert re.fullmatch(r"GK[A-Z0-9]{18}", key.access_key)
    assert re.fullmatch(r"[A-Za-z0-9]{40}", key.secret_key)
    assert key.secret_key not in repr(key)
    assert await store.get_key(key.access_key) == key
    [(raw,)] = await raw_rows(store, "SELECT secret_enc FROM access_keys")
    assert key.secret_key not in str(raw)
    assert (await store.create_key()).access_key != key.access_key


async def test_create_key_with_given_values_and_list(store: MetaStore) -> None:
    first = await store.create_key("GKFIRST", SECRET, "given")
    second = await store.create_key("GKSECOND")

    assert (first.access_key, first.secret_key, first.description) == ("GKFIRST", SECRET, "given")
    assert len(second.secret_key) == 40
    assert await store.list_keys() == [first, second]


async def test_duplicate_access_key_raises(store: MetaStore) -> None:
    await store.create_key("GKDUPLICATE", SECRET)
    with pytest.raises(AccessKeyExists):
        await store.create_key("GKDUPLICATE", "another-secret")
    key = await store.get_key("GKDUPLICATE")
    assert key is not None
    assert key.secret_key == SECRET


async def test_delete_key(store: MetaStore) -> None:
    key = await store.create_key()
    assert await store.delete_key(key.access_key) is True
    assert await store.delete_key(key.access_key) is False
    assert await store.get_key(key.access_key) is None
    assert await store.list_keys() == []


# -- object versions


async def put(
    store: MetaStore, mount_id: int, info: ObjectInfo, at: datetime | None = None
) -> None:
    await store.record_versions([(mount_id, info.key, info, True)], at)


async def get(store: MetaStore, mount_id: int, key: str) -> ObjectInfo | None:
    found = await store.find_versions([(mount_id, key)])
    return found[(mount_id, key)][0] if (mount_id, key) in found else None


async def test_object_version_upsert_find_remove(store: MetaStore) -> None:
    mount = await store.add_mount("data", "s3://origin", {})
    key = "données/日本/emoji 🎉/" + "long-" * 150 + ".bin"
    info = object_info(key, checksums={"crc32c": "AAAAAA=="})

    await put(store, mount.id, info)
    assert await get(store, mount.id, key) == info

    changed = object_info(key, size=1, etag='"new"', metadata={}, storage_class="STANDARD")
    await put(store, mount.id, changed)
    assert await get(store, mount.id, key) == changed
    assert await raw_rows(store, "SELECT count(*) FROM object_versions") == [(1,)]

    # A crawl's row (complete False) is found as such: a read does not trust it.
    await store.record_versions([(mount.id, "listed", object_info("listed"), False)])
    found = await store.find_versions([(mount.id, key), (mount.id, "listed"), (mount.id, "x")])
    assert {item: row[:2] for item, row in found.items()} == {
        (mount.id, key): (changed, True),
        (mount.id, "listed"): (found[(mount.id, "listed")][0], False),
    }
    assert await get(store, mount.id, key + "x") is None
    await store.record_versions([(mount.id, key, None, True)])
    assert await get(store, mount.id, key) is None


async def test_object_versions_are_per_mount_and_go_with_their_mount(store: MetaStore) -> None:
    one = await store.add_mount("one", "s3://a", {})
    two = await store.add_mount("two", "s3://b", {})
    await put(store, one.id, object_info("k", size=1))
    await put(store, two.id, object_info("k", size=2))

    assert await store.remove_mount("one")

    assert await get(store, one.id, "k") is None
    kept = await get(store, two.id, "k")
    assert kept is not None
    assert kept.size == 2
    assert await raw_rows(store, "SELECT mount_id FROM object_versions") == [(two.id,)]


async def test_datetimes_come_back_timezone_aware_utc(store: MetaStore) -> None:
    plus_two = timezone(timedelta(hours=2))
    modified = datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=plus_two)
    checked = datetime(2025, 6, 7, 8, 9, 10, tzinfo=plus_two)
    mount = await store.add_mount("data", "s3://origin", {})

    await put(store, mount.id, object_info("k", last_modified=modified), checked)
    info = await get(store, mount.id, "k")
    key = await store.create_key()

    assert info is not None
    assert info.last_modified == modified
    assert info.last_modified.utcoffset() == timedelta(0)
    v = object_versions
    async with store.engine.connect() as conn:
        written_at = (await conn.execute(sa.select(v.c.written_at))).scalar_one()
    assert written_at == checked
    assert written_at.utcoffset() == timedelta(0)
    stored_mount = await store.get_mount("data")
    stored_key = await store.get_key(key.access_key)
    assert stored_mount is not None
    assert stored_key is not None
    for stamp in (stored_mount.created_at, stored_key.created_at):
        assert stamp.utcoffset() == timedelta(0)
        assert abs(datetime.now(UTC) - stamp) < timedelta(minutes=1)


# -- no database involved: key configuration, URLs


def test_secret_box_from_config_prefers_key_then_key_file_then_data_dir(tmp_path: Path) -> None:
    given, in_file, other = (SecretBox.generate_key() for _ in range(3))
    key_file = tmp_path / "keys"
    key_file.write_text(f"# newest first\n{in_file}\n{other}\n")
    token_given = SecretBox([given]).encrypt("x")
    token_other = SecretBox([other]).encrypt("x")

    assert SecretBox.from_config(f"{given},{other}", key_file, tmp_path).decrypt(token_given)
    from_file = SecretBox.from_config(None, key_file, tmp_path)
    assert from_file.decrypt(token_other) == "x"  # the second key of the file decrypts too
    with pytest.raises(WrongSecretKey):
        from_file.decrypt(token_given)
    assert not (tmp_path / "secret.key").exists()
    with pytest.raises(InvalidSecretKey):
        SecretBox.from_config("not-a-fernet-key", None, tmp_path)


def test_secret_key_file_is_created_once_under_concurrency(tmp_path: Path) -> None:
    token = SecretBox.from_config(None, None, tmp_path / "a").encrypt("x")
    with ThreadPoolExecutor(max_workers=8) as pool:
        boxes = list(
            pool.map(lambda _: SecretBox.from_config(None, None, tmp_path / "b"), range(8))
        )
    tokens = [box.encrypt("y") for box in boxes]

    assert all(box.decrypt(t) == "y" for box in boxes for t in tokens)  # all hold one key
    assert [p.name for p in (tmp_path / "b").iterdir()] == ["secret.key"]
    with pytest.raises(WrongSecretKey):
        boxes[0].decrypt(token)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("postgresql://u:p%40ss@db:5432/gw", "postgresql+asyncpg://u:p%40ss@db:5432/gw"),
        ("postgres://db/gw", "postgresql+asyncpg://db/gw"),
        ("postgresql+psycopg2://db/gw", "postgresql+asyncpg://db/gw"),
        ("postgresql+asyncpg://db/gw", "postgresql+asyncpg://db/gw"),
        ("sqlite:///rel/gw.db", "sqlite+aiosqlite:///rel/gw.db"),
        ("sqlite:////abs/gw.db", "sqlite+aiosqlite:////abs/gw.db"),
        ("sqlite+aiosqlite:///gw.db", "sqlite+aiosqlite:///gw.db"),
    ],
)
def test_normalize_database_url(given: str, expected: str) -> None:
    assert normalize_database_url(given) == expected


def test_normalize_database_url_rejects_other_databases() -> None:
    with pytest.raises(ValueError, match="unsupported"):
        normalize_database_url("mysql://db/gw")


def test_default_database_url_is_sqlite_in_data_dir(tmp_path: Path) -> None:
    assert default_database_url(tmp_path) == f"sqlite+aiosqlite:///{tmp_path}/gateway.db"
