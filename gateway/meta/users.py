"""Users, their policies and keys, buckets' owners and bucket policies (docs/tenants.md).

A mixin of MetaStore, like the uploads. Policy documents are stored as given: the service
parses and compiles them (gateway.iam) before they are stored and whenever they are read.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine, Iterable
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from typing import Any, Concatenate, ParamSpec, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection

from .models import (
    ADMIN_USER,
    InUse,
    NoSuchPolicy,
    NoSuchUser,
    PolicyExists,
    TenancyRows,
    User,
    UserExists,
)
from .tables import access_keys, bucket_policies, mounts, policies, user_policies, users


def _now() -> datetime:
    return datetime.now(UTC)


P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S", bound="Tenants")


def changes_state(
    method: Callable[Concatenate[S, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, R]]:
    """A query that changes what every request depends on (mounts, owners, users, policies,
    keys): once it has committed, `on_change` tells the node's workers to re-read
    (gateway/generations.py), before the caller acknowledges the change."""

    @functools.wraps(method)
    async def changed(self: S, *args: P.args, **kwargs: P.kwargs) -> R:
        result = await method(self, *args, **kwargs)
        if self.on_change is not None:
            self.on_change()
        return result

    return changed


class Tenants:
    """The tenancy queries of MetaStore (which provides `_connect`)."""

    on_change: Callable[[], None] | None = None

    def _connect(self) -> AbstractAsyncContextManager[AsyncConnection]:
        raise NotImplementedError

    # -- users

    @changes_state
    async def create_user(self, name: str, policy_names: Iterable[str]) -> User:
        """The policies must exist (built-in names, `builtin`, are the caller's to know)."""
        names = tuple(dict.fromkeys(policy_names))
        now = _now()
        async with self._connect() as conn:
            try:
                result = await conn.execute(
                    sa.insert(users).values(name=name, created_at=now).returning(users.c.id)
                )
            except sa_exc.IntegrityError as error:
                raise UserExists(f"user {name!r} exists already") from error
            user_id = result.scalar_one()
            if names:
                await conn.execute(
                    sa.insert(user_policies), [{"user_id": user_id, "policy": p} for p in names]
                )
        return User(user_id, name, now, names)

    async def user_id(self, conn: AsyncConnection, name: str | None) -> int | None:
        """The id of user `name` (None: the admin user, NULL in the tables)."""
        if name is None:
            return None
        found = await conn.execute(sa.select(users.c.id).where(users.c.name == name))
        user_id = found.scalar()
        if user_id is None:
            raise NoSuchUser(f"no user {name!r}")
        return int(user_id)

    async def list_users(self) -> list[User]:
        rows = await self.read_tenancy()
        async with self._connect() as conn:
            found = await conn.execute(sa.select(users.c.id, users.c.created_at))
            created: dict[int, datetime] = {uid: at for uid, at in found.tuples()}
        keys: dict[int | None, list[str]] = {}
        for key, uid in rows.key_users.items():
            keys.setdefault(uid if uid is not None else rows.admin_id, []).append(key)
        owned: dict[int | None, list[str]] = {}
        for bucket, uid in rows.owners.items():
            owned.setdefault(uid if uid is not None else rows.admin_id, []).append(bucket)
        return sorted(
            (
                User(uid, name, created[uid], pols, tuple(sorted(keys.get(uid, ()))),
                     tuple(sorted(owned.get(uid, ()))))
                for uid, (name, pols) in rows.users.items()
            ),
            key=lambda u: u.name,
        )  # fmt: skip

    @changes_state
    async def delete_user(self, name: str) -> None:
        """Delete the user and its keys; InUse while it owns buckets (the admin user: always)."""
        if name == ADMIN_USER:
            raise InUse("the admin user cannot be deleted: mounts made by the CLI are its")
        async with self._connect() as conn:
            user_id = await self.user_id(conn, name)
            owned = (
                await conn.execute(sa.select(mounts.c.bucket).where(mounts.c.owner_id == user_id))
            ).scalars().all()  # fmt: skip
            if owned:
                raise InUse(f"user {name!r} owns buckets {', '.join(sorted(owned))}: delete them")
            await conn.execute(sa.delete(access_keys).where(access_keys.c.user_id == user_id))
            await conn.execute(sa.delete(user_policies).where(user_policies.c.user_id == user_id))
            await conn.execute(sa.delete(users).where(users.c.id == user_id))

    # -- policies

    @changes_state
    async def create_policy(self, name: str, document: str) -> None:
        async with self._connect() as conn:
            try:
                await conn.execute(
                    sa.insert(policies).values(name=name, document=document, created_at=_now())
                )
            except sa_exc.IntegrityError as error:
                raise PolicyExists(f"policy {name!r} exists already") from error

    @changes_state
    async def delete_policy(self, name: str) -> None:
        async with self._connect() as conn:
            holders = (
                await conn.execute(
                    sa.select(users.c.name)
                    .join(user_policies, user_policies.c.user_id == users.c.id)
                    .where(user_policies.c.policy == name)
                )
            ).scalars().all()  # fmt: skip
            if holders:
                raise InUse(f"policy {name!r} is attached to {', '.join(sorted(holders))}")
            result = await conn.execute(sa.delete(policies).where(policies.c.name == name))
            if result.rowcount == 0:
                raise NoSuchPolicy(f"no policy {name!r}")

    async def custom_policies(self) -> dict[str, str]:
        async with self._connect() as conn:
            rows = await conn.execute(sa.select(policies.c.name, policies.c.document))
            return dict(rows.tuples().all())

    @changes_state
    async def attach_policy(self, user: str, policy: str) -> bool:
        """False when the user holds it already."""
        async with self._connect() as conn:
            user_id = await self.user_id(conn, user)
            try:
                async with conn.begin_nested():
                    await conn.execute(
                        sa.insert(user_policies).values(user_id=user_id, policy=policy)
                    )
            except sa_exc.IntegrityError:
                return False
        return True

    @changes_state
    async def detach_policy(self, user: str, policy: str) -> bool:
        async with self._connect() as conn:
            user_id = await self.user_id(conn, user)
            result = await conn.execute(
                sa.delete(user_policies).where(
                    user_policies.c.user_id == user_id, user_policies.c.policy == policy
                )
            )
        return result.rowcount > 0

    # -- buckets

    @changes_state
    async def set_bucket_policy(self, bucket: str, document: str | None) -> bool:
        """Store (None: remove) the bucket's policy; False when the bucket is not mounted, or
        (removing) has none."""
        async with self._connect() as conn:
            found = await conn.execute(sa.select(mounts.c.id).where(mounts.c.bucket == bucket))
            mount_id = found.scalar()
            if mount_id is None:
                return False
            result = await conn.execute(
                sa.delete(bucket_policies).where(bucket_policies.c.mount_id == mount_id)
            )
            if document is None:
                return result.rowcount > 0
            await conn.execute(
                sa.insert(bucket_policies).values(
                    mount_id=mount_id, document=document, updated_at=_now()
                )
            )
        return True

    async def get_bucket_policy(self, bucket: str) -> str | None:
        query = (
            sa.select(bucket_policies.c.document)
            .join(mounts, mounts.c.id == bucket_policies.c.mount_id)
            .where(mounts.c.bucket == bucket)
        )
        async with self._connect() as conn:
            return (await conn.execute(query)).scalar()

    # -- what the request path compiles

    async def read_tenancy(self) -> TenancyRows:
        async with self._connect() as conn:
            user_rows = (
                await conn.execute(sa.select(users.c.id, users.c.name, users.c.created_at))
            ).all()
            held: dict[int, list[str]] = {}
            for uid, policy in await conn.execute(
                sa.select(user_policies.c.user_id, user_policies.c.policy).order_by(
                    user_policies.c.user_id, user_policies.c.policy
                )
            ):
                held.setdefault(uid, []).append(policy)
            key_rows = await conn.execute(
                sa.select(access_keys.c.access_key, access_keys.c.user_id)
            )
            key_users = dict(key_rows.tuples().all())
            docs = await conn.execute(sa.select(policies.c.name, policies.c.document))
            custom = dict(docs.tuples().all())
            owners = dict(
                (await conn.execute(sa.select(mounts.c.bucket, mounts.c.owner_id))).tuples().all()
            )
            bucket_docs = await conn.execute(
                sa.select(
                    mounts.c.bucket, bucket_policies.c.document, bucket_policies.c.updated_at
                ).join(bucket_policies, bucket_policies.c.mount_id == mounts.c.id)
            )
            stored = bucket_docs.tuples().all()
        by_bucket = {bucket: document for bucket, document, _ in stored}
        names = {uid: name for uid, name, _ in user_rows}
        admin_id = next((uid for uid, name in names.items() if name == ADMIN_USER), None)
        return TenancyRows(
            admin_id=admin_id,
            users={uid: (name, tuple(held.get(uid, ()))) for uid, name in names.items()},
            key_users=key_users,
            policies=custom,
            owners=owners,
            bucket_policies=by_bucket,
            user_created={uid: at for uid, _, at in user_rows},
            policy_stored={bucket: at for bucket, _, at in stored},
        )
