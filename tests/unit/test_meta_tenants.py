"""The tenancy tables on SQLite and PostgreSQL: migration 0007 moves every key and mount to
the admin user; users, policies, owners and bucket policies round-trip; keys are disabled and
enabled again (migration 0008's access_keys.disabled)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import sqlalchemy as sa
from alembic import command

from gateway.meta import (
    InUse,
    MetaStore,
    NoSuchPolicy,
    NoSuchUser,
    PolicyExists,
    SecretBox,
    UserExists,
)
from gateway.meta.migrate import alembic_config
from gateway.service.authz import build_authorizer
from gateway.service.namespace import Namespace

pytestmark = pytest.mark.anyio

POLICY = '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"}]}'  # noqa: E501


@pytest.fixture
def box() -> SecretBox:
    return SecretBox([SecretBox.generate_key()])


@pytest.fixture
async def store(database_url: str, box: SecretBox) -> AsyncIterator[MetaStore]:
    async with MetaStore(database_url, box) as store:
        await store.migrate()
        yield store


async def test_upgrade_to_0007_gives_every_key_and_mount_to_the_admin_user(
    database_url: str, box: SecretBox
) -> None:
    config = alembic_config(database_url)
    await asyncio.to_thread(command.upgrade, config, "0006_catalog")
    async with MetaStore(database_url, box) as store:
        await store.add_mount("old", "file:///srv/old", {})
        await store.create_key("GKOLDKEY", "old-secret", "from before", admin=True)
        await store.create_key("GKPLAIN", "plain-secret")

        await store.migrate()

        rows = await store.read_tenancy()
        assert rows.admin_id is not None
        assert rows.users == {rows.admin_id: ("admin", ("admin",))}
        assert rows.key_users == {"GKOLDKEY": rows.admin_id, "GKPLAIN": rows.admin_id}
        assert rows.owners == {"old": rows.admin_id}
        auth = build_authorizer(rows, [])
        assert auth.allowed("GKPLAIN", "s3:DeleteBucket", "old", None, None)
        assert auth.allowed("GKOLDKEY", "s3:PutObject", "old", "k", None)
        # Down and up again: the columns and tables go, and come back.
        await asyncio.to_thread(command.downgrade, config, "0006_catalog")
        async with store.engine.connect() as conn:
            tables = set(await conn.run_sync(lambda s: sa.inspect(s).get_table_names()))
        assert {"users", "policies", "user_policies", "bucket_policies"}.isdisjoint(tables)
        await store.migrate()
        assert (await store.read_tenancy()).owners == {"old": (await store.read_tenancy()).admin_id}


async def test_users_policies_keys_and_owners(store: MetaStore) -> None:
    alice = await store.create_user("alice", ["own"])
    with pytest.raises(UserExists):
        await store.create_user("alice", [])
    key = await store.create_key(user="alice")
    assert key.user_id == alice.id
    with pytest.raises(NoSuchUser):
        await store.create_key(user="nobody")
    await store.add_mount("alice-data", "file:///srv/a", {}, owner="alice")
    await store.add_mount("admins", "file:///srv/b", {})
    await store.create_policy("reads", POLICY)
    with pytest.raises(PolicyExists):
        await store.create_policy("reads", POLICY)
    assert await store.attach_policy("alice", "reads")
    assert not await store.attach_policy("alice", "reads")
    [admin, a] = await store.list_users()
    assert (a.name, a.policies, a.keys, a.buckets) == (
        "alice",
        ("own", "reads"),
        (key.access_key,),
        ("alice-data",),
    )
    assert admin.name == "admin" and admin.buckets == ("admins",)
    with pytest.raises(InUse, match="attached to alice"):
        await store.delete_policy("reads")
    assert await store.detach_policy("alice", "reads")
    assert not await store.detach_policy("alice", "reads")
    await store.delete_policy("reads")
    with pytest.raises(NoSuchPolicy):
        await store.delete_policy("reads")
    with pytest.raises(InUse, match="owns buckets alice-data"):
        await store.delete_user("alice")
    with pytest.raises(InUse):
        await store.delete_user("admin")
    await store.remove_mount("alice-data")
    await store.delete_user("alice")
    assert await store.get_key(key.access_key) is None
    assert [u.name for u in await store.list_users()] == ["admin"]


async def test_bucket_policies_go_with_their_mount(store: MetaStore) -> None:
    assert not await store.set_bucket_policy("none", POLICY)
    await store.add_mount("b", "file:///srv/b", {})
    assert await store.get_bucket_policy("b") is None
    assert await store.set_bucket_policy("b", POLICY)
    assert await store.set_bucket_policy("b", POLICY + " ")  # replaced
    assert await store.get_bucket_policy("b") == POLICY + " "
    assert (await store.read_tenancy()).bucket_policies == {"b": POLICY + " "}
    assert await store.set_bucket_policy("b", None)
    assert not await store.set_bucket_policy("b", None)
    await store.set_bucket_policy("b", POLICY)
    await store.remove_mount("b")
    await store.add_mount("b", "file:///srv/b", {})
    assert await store.get_bucket_policy("b") is None


async def test_keys_disabled_and_enabled_again(database_url: str, box: SecretBox) -> None:
    """Migration 0008 adds access_keys.disabled (false for the keys there are); a disabled key
    keeps its secret in the database and is left out of the namespace's secrets."""
    config = alembic_config(database_url)
    await asyncio.to_thread(command.upgrade, config, "0007_tenants")
    async with MetaStore(database_url, box) as store:
        await store.create_key("GKOLDKEY", "old-secret", admin=True)
        await store.migrate()
        old = await store.get_key("GKOLDKEY")
        assert old is not None and not old.disabled
        made = await store.create_key("GKNEWKEY", "new-secret")
        assert not made.disabled

        assert await store.set_key_disabled("GKNEWKEY", True)
        assert not await store.set_key_disabled("GKNOSUCHKEY", True)
        listed = {k.access_key: k for k in await store.list_keys()}
        assert listed["GKNEWKEY"].disabled and listed["GKNEWKEY"].secret_key == "new-secret"
        assert not listed["GKOLDKEY"].disabled
        assert await store.set_key_disabled("GKNEWKEY", True)  # already: still found

        namespace = Namespace(store, default_ttl=60)
        try:
            await namespace.refresh_keys()
            assert namespace.secret_for("GKNEWKEY") is None
            assert await namespace.lookup_unknown_key("GKNEWKEY") is None
            assert namespace.secret_for("GKOLDKEY") == "old-secret"
            assert await store.set_key_disabled("GKNEWKEY", False)
            assert await namespace.lookup_unknown_key("GKNEWKEY") == "new-secret"
        finally:
            await namespace.close()

        # Down to 0007 and up again: the column goes, and comes back false for every key.
        await store.set_key_disabled("GKNEWKEY", True)
        await asyncio.to_thread(command.downgrade, config, "0007_tenants")
        async with store.engine.connect() as conn:
            columns = await conn.run_sync(
                lambda s: {c["name"] for c in sa.inspect(s).get_columns("access_keys")}
            )
        assert "disabled" not in columns and "user_id" in columns
        await store.migrate()
        await store.engine.dispose()  # PostgreSQL's prepared statements name the old columns
        assert not any(k.disabled for k in await store.list_keys())
