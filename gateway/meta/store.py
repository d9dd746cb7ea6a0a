"""MetaStore: mounts, access keys, object metadata (and uploads) in SQLite or PostgreSQL."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import secrets
import string
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime
from types import MappingProxyType, TracebackType
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from gateway.config import Settings
from gateway.stores.base import ObjectInfo

from .engine import create_engine, normalize_database_url, sqlite_path
from .key_locks import KeyLocks
from .migrate import SCHEMA_HEAD, run_migrations
from .models import SECRET_OPTIONS, AccessKey, AccessKeyExists, MetaUnavailable, Mount, MountExists
from .secrets import SecretBox
from .tables import access_keys, mounts
from .uploads import MultipartUploads
from .users import Tenants, changes_state
from .versions import object_versions, version_info, version_row

ACCESS_KEY_PREFIX = "GK"
ACCESS_KEY_LENGTH = 20
SECRET_KEY_LENGTH = 40
_ACCESS_KEY_ALPHABET = string.ascii_uppercase + string.digits
# Letters and digits only: AWS secrets may hold '/' and '+', which some tools mangle in URLs.
_SECRET_KEY_ALPHABET = string.ascii_letters + string.digits

_ENCRYPTED = "fernet"  # {"fernet": token} marks an encrypted option value in mounts.options


def _now() -> datetime:
    return datetime.now(UTC)


def _dumps(value: Mapping[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def is_unavailable(error: BaseException) -> bool:
    """Whether a database error means "cannot reach or use the database now", not a bug."""
    if isinstance(error, OSError | TimeoutError | sa_exc.InterfaceError):
        return True
    if isinstance(error, sa_exc.DBAPIError) and error.connection_invalidated:
        return True
    if isinstance(error, sa_exc.OperationalError):
        # SQLite reports a missing table as an OperationalError too; that is a schema problem
        # (not migrated), which retrying will not cure.
        return "no such table" not in str(error.orig) and "no such column" not in str(error.orig)
    return False


def open_meta(settings: Settings) -> MetaStore:
    """The node's database, as its settings name it, with the secret box for mount secrets."""
    box = SecretBox.from_config(
        settings.encryption_key, settings.encryption_key_file, settings.data_dir
    )
    return MetaStore(settings.effective_database_url, box, pool=settings.database_pool)


class MetaStore(MultipartUploads, Tenants):
    """The gateway's database. Create, `await migrate()` once, use, `await close()`.

    Multipart upload state comes from the MultipartUploads mixin (uploads.py), users,
    policies and owners from the Tenants mixin (users.py).
    """

    def __init__(self, url: str, box: SecretBox, pool: int | None = None) -> None:
        self.url = normalize_database_url(url)
        self._box = box
        self._engine = create_engine(self.url, pool_size=pool)
        # A writer's hold on a key against the fleet's other writers of it (key_locks.py).
        self.key_locks = KeyLocks(self._connect, self._engine.dialect.name)

    def derive_key(self, purpose: str) -> bytes:
        """A key for `purpose` derived from the secrets' key (SecretBox.derive): the console
        signs its sessions with it, so that every node of the fleet accepts them."""
        return self._box.derive(purpose)

    @property
    def engine(self) -> AsyncEngine:
        """For other parts of gateway.meta that bring their own tables (jobs, nodes)."""
        return self._engine

    @property
    def dialect(self) -> str:
        return self._engine.dialect.name

    async def __aenter__(self) -> MetaStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def migrate(self) -> None:
        """Upgrade the schema to the newest revision (a no-op when it is there: one query, and
        no Alembic, for every command line and node start but the first)."""
        try:
            if await self.schema_revision() == SCHEMA_HEAD:
                return
            await asyncio.to_thread(run_migrations, self.url)
        except Exception as error:
            if is_unavailable(error):
                raise MetaUnavailable(f"cannot migrate {self._safe_url()}: {error}") from error
            raise

    async def schema_revision(self) -> str | None:
        """The Alembic revision the database is at; None before the first migration."""
        path = sqlite_path(self.url)
        if path is not None and not path.exists():
            return None  # and connecting would create the file (or fail for a missing folder)
        try:
            async with self._connect() as conn:
                query = sa.text("SELECT version_num FROM alembic_version")
                return (await conn.execute(query)).scalar_one_or_none()
        except (sa_exc.ProgrammingError, sa_exc.OperationalError):
            return None  # no alembic_version table: never migrated (outages: MetaUnavailable)

    async def close(self) -> None:
        await self._engine.dispose()

    # -- mounts

    @changes_state
    async def add_mount(
        self, bucket: str, uri: str, options: Mapping[str, str], owner: str | None = None
    ) -> Mount:
        """owner: the owning user's name; None: the admin user (NoSuchUser for no user)."""
        for name, value in options.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise TypeError(f"mount option {name!r} must map a string to a string")
        now = _now()
        values = {
            "bucket": bucket,
            "uri": uri,
            "options": self._seal_options(options),
            "created_at": now,
            "updated_at": now,
        }
        async with self._connect() as conn:
            if owner is not None:  # NULL: the admin user (and a schema before 0007 works)
                values["owner_id"] = await self.user_id(conn, owner)
            try:
                result = await conn.execute(sa.insert(mounts).values(values).returning(mounts.c.id))
            except sa_exc.IntegrityError as error:
                raise MountExists(f"a mount for bucket {bucket!r} exists already") from error
            mount_id = result.scalar_one()
        return Mount(mount_id, bucket, uri, MappingProxyType(dict(options)), now)

    @changes_state
    async def remove_mount(self, bucket: str) -> bool:
        """Remove the mount and (by cascade) its object metadata and uploads; False if none."""
        async with self._connect() as conn:
            result = await conn.execute(sa.delete(mounts).where(mounts.c.bucket == bucket))
        return result.rowcount > 0

    async def get_mount(self, bucket: str) -> Mount | None:
        async with self._connect() as conn:
            result = await conn.execute(sa.select(mounts).where(mounts.c.bucket == bucket))
            row = result.mappings().first()
        return None if row is None else self._mount(row)

    async def list_mounts(self) -> list[Mount]:
        async with self._connect() as conn:
            result = await conn.execute(sa.select(mounts).order_by(mounts.c.bucket))
            rows = result.mappings().all()
        return [self._mount(row) for row in rows]

    def _seal_options(self, options: Mapping[str, str]) -> str:
        return _dumps(
            {
                name: {_ENCRYPTED: self._box.encrypt(value)} if name in SECRET_OPTIONS else value
                for name, value in options.items()
            }
        )

    def _mount(self, row: sa.RowMapping) -> Mount:
        # Any value stored as {"fernet": ...} is decrypted, whatever its name: a row written
        # before an option joined SECRET_OPTIONS stays readable, and vice versa.
        options = {
            name: self._box.decrypt(value[_ENCRYPTED]) if isinstance(value, dict) else value
            for name, value in json.loads(row["options"]).items()
        }
        return Mount(
            id=row["id"],
            bucket=row["bucket"],
            uri=row["uri"],
            options=MappingProxyType(options),
            created_at=row["created_at"],
        )

    # -- access keys

    @changes_state
    async def create_key(
        self,
        access_key: str | None = None,
        secret_key: str | None = None,
        description: str = "",
        admin: bool = False,
        user: str | None = None,
    ) -> AccessKey:
        """Store a key pair; missing parts are generated (AWS-shaped, from `secrets`). It
        belongs to `user` (NoSuchUser if there is none), or, None, to the admin user."""
        if access_key is None:
            tail = ACCESS_KEY_LENGTH - len(ACCESS_KEY_PREFIX)
            access_key = ACCESS_KEY_PREFIX + "".join(
                secrets.choice(_ACCESS_KEY_ALPHABET) for _ in range(tail)
            )
        if secret_key is None:
            secret_key = "".join(
                secrets.choice(_SECRET_KEY_ALPHABET) for _ in range(SECRET_KEY_LENGTH)
            )
        if not access_key or not secret_key:
            raise ValueError("access key and secret key must not be empty")
        key = AccessKey(access_key, secret_key, _now(), description, admin)
        values: dict[str, Any] = {
            "access_key": key.access_key,
            "secret_enc": self._box.encrypt(key.secret_key),
            "description": key.description,
            "created_at": key.created_at,
            "admin": admin,
        }
        async with self._connect() as conn:
            if user is not None:  # NULL: the admin user (and a schema before 0007 works)
                values["user_id"] = await self.user_id(conn, user)
                key = dataclasses.replace(key, user_id=values["user_id"])
            try:
                await conn.execute(sa.insert(access_keys).values(values))
            except sa_exc.IntegrityError as error:
                raise AccessKeyExists(f"access key {access_key!r} exists already") from error
        return key

    async def get_key(self, access_key: str) -> AccessKey | None:
        query = sa.select(access_keys).where(access_keys.c.access_key == access_key)
        async with self._connect() as conn:
            row = (await conn.execute(query)).mappings().first()
        return None if row is None else self._access_key(row)

    async def list_keys(self) -> list[AccessKey]:
        query = sa.select(access_keys).order_by(access_keys.c.created_at, access_keys.c.access_key)
        async with self._connect() as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [self._access_key(row) for row in rows]

    @changes_state
    async def delete_key(self, access_key: str) -> bool:
        query = sa.delete(access_keys).where(access_keys.c.access_key == access_key)
        async with self._connect() as conn:
            result = await conn.execute(query)
        return result.rowcount > 0

    @changes_state
    async def set_key_disabled(self, access_key: str, disabled: bool) -> bool:
        """Disable a key (it authenticates nowhere: S3, the jobs API, the console) or enable it
        again; False if there is no such key. Nodes see it at their next refresh of the keys."""
        query = (
            sa.update(access_keys)
            .where(access_keys.c.access_key == access_key)
            .values(disabled=disabled)
        )
        async with self._connect() as conn:
            result = await conn.execute(query)
        return result.rowcount > 0

    def _access_key(self, row: sa.RowMapping) -> AccessKey:
        return AccessKey(
            access_key=row["access_key"],
            secret_key=self._box.decrypt(row["secret_enc"]),
            created_at=row["created_at"],
            description=row["description"],
            admin=bool(row["admin"]),
            user_id=row.get("user_id"),
            disabled=bool(row.get("disabled", False)),
        )

    # -- object versions (gateway.meta.versions; gateway.service.versions orders the writes)

    async def record_versions(
        self,
        changes: Sequence[tuple[int, str, ObjectInfo | None, bool]],
        written_at: datetime | None = None,
        also: Sequence[sa.Executable] = (),
        stamps: Mapping[tuple[int, str], datetime] | None = None,
    ) -> None:
        """Many (mount_id, key, info, complete) in one transaction: an info replaces the key's
        row, None removes it. Each key at most once. `also`: statements of the same change
        made elsewhere (a completed upload's removal), run in the same transaction: all of it
        is committed, or none. A row's `written_at` (from when a read trusts it for the
        mount's TTL) is its key's in `stamps`, when the store was asked, else `written_at`,
        else now."""
        written_at = written_at or _now()
        stamps = stamps or {}
        rows = [
            version_row(m, i, c, stamps.get((m, key), written_at))
            for m, key, i, c in changes
            if i is not None
        ]
        gone = [{"mount_id": m, "key": key} for m, key, info, _ in changes if info is None]
        async with self._connect() as conn:
            if rows:
                await conn.execute(self._version_upsert, rows)
            if gone:
                await conn.execute(self._version_delete, gone)
            for statement in also:
                await conn.execute(statement)

    @functools.cached_property
    def _version_upsert(self) -> sa.TextClause:
        """The upsert of a version row, as SQL text both dialects read alike. SQLAlchemy
        cannot cache the compiled form of an ON CONFLICT construct: building and compiling it
        per call was a quarter of a cold miss's CPU on TTL -1 mounts."""
        quote = self._engine.dialect.identifier_preparer.quote
        columns = [c.name for c in object_versions.columns]
        keys = [c.name for c in object_versions.primary_key]
        updates = ", ".join(
            f"{quote(name)} = excluded.{quote(name)}" for name in columns if name not in keys
        )
        sql = (
            f"INSERT INTO object_versions ({', '.join(quote(name) for name in columns)}) "
            f"VALUES ({', '.join(':' + name for name in columns)}) "
            f"ON CONFLICT ({', '.join(quote(name) for name in keys)}) DO UPDATE SET {updates}"
        )
        params = [sa.bindparam(name, type_=object_versions.c[name].type) for name in columns]
        return sa.text(sql).bindparams(*params)

    @functools.cached_property
    def _version_delete(self) -> sa.Delete:
        v = object_versions
        return sa.delete(v).where(
            v.c.mount_id == sa.bindparam("mount_id"), v.c.key == sa.bindparam("key")
        )

    async def find_versions(
        self, wanted: Sequence[tuple[int, str]]
    ) -> dict[tuple[int, str], tuple[ObjectInfo, bool, datetime]]:
        """The rows of many (mount_id, key) in one transaction, as (info, complete, when the
        row was written); absent ones left out. The one lookup of object versions by key."""
        by_mount: dict[int, list[str]] = {}
        for mount_id, key in wanted:
            by_mount.setdefault(mount_id, []).append(key)
        found: dict[tuple[int, str], tuple[ObjectInfo, bool, datetime]] = {}
        async with self._connect() as conn:
            for mount_id, keys in by_mount.items():
                rows = await conn.execute(self._versions_in, {"mount_id": mount_id, "keys": keys})
                for row in rows.mappings():
                    found[(mount_id, row["key"])] = (
                        version_info(row),
                        bool(row["complete"]),
                        row["written_at"],
                    )
        return found

    @functools.cached_property
    def _versions_in(self) -> sa.Select[Any]:
        v = object_versions
        return sa.select(v).where(
            v.c.mount_id == sa.bindparam("mount_id"),
            v.c.key.in_(sa.bindparam("keys", expanding=True)),
        )

    async def version_keys_after(self, mount_id: int, key: str, limit: int) -> list[str]:
        """Up to `limit` keys of the mount that have a row, the first after `key` in key order:
        neighbours whose rows a node looks up together (Versions' neighbours)."""
        async with self._connect() as conn:
            rows = await conn.execute(
                self._keys_after, {"mount_id": mount_id, "key": key, "limit": limit}
            )
            return [row[0] for row in rows]

    @functools.cached_property
    def _keys_after(self) -> sa.Select[Any]:
        v = object_versions
        return (
            sa.select(v.c.key)
            .where(v.c.mount_id == sa.bindparam("mount_id"), v.c.key > sa.bindparam("key"))
            .order_by(v.c.key)
            .limit(sa.bindparam("limit"))
        )

    # -- plumbing

    def _connect(self) -> AbstractAsyncContextManager[AsyncConnection]:
        return transaction(self._engine)

    def _safe_url(self) -> str:
        return self._engine.url.render_as_string(hide_password=True)

    @changes_state
    async def set_mount_option(self, bucket: str, name: str, value: str | None) -> bool:
        """Set one option of a mount (None removes it), the others as they are, in one
        transaction; False if there is no such mount. Nodes see it at their next refresh."""
        async with self._connect() as conn:
            row = (
                await conn.execute(
                    sa.select(mounts.c.options).where(mounts.c.bucket == bucket).with_for_update()
                )
            ).first()
            if row is None:
                return False
            options = json.loads(row[0])
            if value is None:
                options.pop(name, None)
            elif name in SECRET_OPTIONS:
                options[name] = {_ENCRYPTED: self._box.encrypt(value)}
            else:
                options[name] = value
            await conn.execute(
                sa.update(mounts)
                .where(mounts.c.bucket == bucket)
                .values(options=_dumps(options), updated_at=_now())
            )
        return True


@asynccontextmanager
async def transaction(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection in a transaction, committed on success; outages become MetaUnavailable."""
    url = engine.url.render_as_string(hide_password=True)
    conn = engine.connect()
    try:
        await conn.start()
    except Exception as error:
        # Whatever stops us from getting a connection at all (refused, not accepting
        # connections, too many clients, shutting down) is an outage, not a bug.
        raise MetaUnavailable(f"database {url}: {error}") from error
    try:
        async with conn.begin():
            yield conn
    except Exception as error:
        if is_unavailable(error):
            raise MetaUnavailable(f"database {url}: {error}") from error
        raise
    finally:
        await conn.close()
