"""Multipart uploads in progress: the client's upload ids, their parts, listing in S3 order;
and the uploads a node opens at an under-store on its own behalf, under a lease.

The under-store holds the parts' bytes; this is what ListMultipartUploads and ListParts read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

import anyio
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.stores.base import UploadJournal

from .models import MetaError
from .tables import database_clock, multipart_parts, multipart_uploads, store_uploads

log = logging.getLogger(__name__)

# Who holds a lease, as the log shows it: this process, on this host.
OWNER = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"

_PART_PK = ("upload_id", "part_number")
_MAX_CODE_POINT = 0x10FFFF
_SURROGATES = range(0xD800, 0xE000)


@dataclass(frozen=True, slots=True)
class UploadRecord:
    """A multipart upload begun and neither completed nor aborted yet."""

    upload_id: str  # ours, as the client sees it
    mount_id: int
    key: str
    store_upload_id: str  # the under-store's own id for the same upload
    attrs: Mapping[str, Any]  # as given at CreateMultipartUpload: content type, metadata, ...
    initiated_at: datetime
    access_key: str | None


@dataclass(frozen=True, slots=True)
class PartRecord:
    """One part of an upload, as last uploaded under its number."""

    part_number: int
    etag: str  # quoted
    size: int
    uploaded_at: datetime


class UploadGone(MetaError):
    """The multipart upload does not exist (any more): completed, aborted or never begun."""


@dataclass(frozen=True, slots=True)
class StoreUploadRecord:
    """An upload a node opened at a store on its own behalf, whose lease ran out."""

    id: int
    mount_id: int
    key: str
    store_upload_id: str
    owner: str  # the holder whose lease ran out


class MultipartUploads:
    """The multipart part of MetaStore, which mixes it in and supplies the two members below."""

    __slots__ = ()

    @property
    def dialect(self) -> str:
        raise NotImplementedError

    def _connect(self) -> AbstractAsyncContextManager[AsyncConnection]:
        raise NotImplementedError

    async def create_upload(
        self,
        upload_id: str,
        mount_id: int,
        key: str,
        store_upload_id: str,
        attrs: Mapping[str, Any],
        access_key: str | None,
    ) -> UploadRecord:
        """Record an upload begun now; for a mount that is gone, raises IntegrityError."""
        record = UploadRecord(
            upload_id=upload_id,
            mount_id=mount_id,
            key=key,
            store_upload_id=store_upload_id,
            attrs=MappingProxyType(dict(attrs)),
            initiated_at=datetime.now(UTC),
            access_key=access_key,
        )
        values = {
            "upload_id": upload_id,
            "mount_id": mount_id,
            "key": key,
            "store_upload_id": store_upload_id,
            "attrs": _dumps(attrs),
            "initiated_at": record.initiated_at,
            "access_key": access_key,
        }
        async with self._connect() as conn:
            await conn.execute(sa.insert(multipart_uploads).values(values))
        return record

    async def get_upload(self, upload_id: str) -> UploadRecord | None:
        query = sa.select(multipart_uploads).where(multipart_uploads.c.upload_id == upload_id)
        async with self._connect() as conn:
            row = (await conn.execute(query)).mappings().first()
        return None if row is None else _upload(row)

    async def put_part(self, upload_id: str, part_number: int, etag: str, size: int) -> None:
        """Record a part; one uploaded again under the same number replaces the old one.

        Raises UploadGone if the upload is not there, also when it is aborted concurrently: the
        foreign key checks the parent in the same statement, so no part can outlive its upload.
        """
        row = {
            "upload_id": upload_id,
            "part_number": part_number,
            "etag": etag,
            "size": size,
            "uploaded_at": datetime.now(UTC),
        }
        insert = postgresql.insert if self.dialect == "postgresql" else sqlite.insert
        statement = insert(multipart_parts).values(row)
        statement = statement.on_conflict_do_update(
            index_elements=[multipart_parts.c.upload_id, multipart_parts.c.part_number],
            set_={name: statement.excluded[name] for name in row if name not in _PART_PK},
        )
        async with self._connect() as conn:
            try:
                await conn.execute(statement)
            except sa_exc.IntegrityError as error:
                if not _foreign_key_violation(error):
                    raise
                raise UploadGone(f"no multipart upload {upload_id!r}") from error

    async def list_parts(
        self, upload_id: str, after: int = 0, limit: int = 1000
    ) -> list[PartRecord]:
        """Parts numbered above `after`, by number; empty for an unknown upload."""
        query = (
            sa.select(multipart_parts)
            .where(
                multipart_parts.c.upload_id == upload_id,
                multipart_parts.c.part_number > after,
            )
            .order_by(multipart_parts.c.part_number)
            .limit(limit)
        )
        async with self._connect() as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [
            PartRecord(row["part_number"], row["etag"], row["size"], row["uploaded_at"])
            for row in rows
        ]

    async def list_uploads(
        self,
        mount_id: int,
        prefix: str = "",
        key_marker: str = "",
        upload_id_marker: str = "",
        limit: int = 1000,
    ) -> list[UploadRecord]:
        """A mount's uploads in S3 order: by key in UTF-8 byte order, then by initiation.

        As S3 defines the markers: with `key_marker` alone, the listing starts after that key;
        with `upload_id_marker` too, it starts after that upload of that key. The marker is
        ignored without a key marker, as S3 does.
        """
        table = multipart_uploads
        query = sa.select(table).where(table.c.mount_id == mount_id)
        if prefix:
            # A range rather than LIKE: SQLite's LIKE ignores case, and a range uses the index.
            query = query.where(table.c.key >= prefix)
            end = _prefix_end(prefix)
            if end is not None:
                query = query.where(table.c.key < end)
        async with self._connect() as conn:
            if key_marker:
                query = query.where(
                    await _after_marker(conn, mount_id, key_marker, upload_id_marker)
                )
            query = query.order_by(table.c.key, table.c.initiated_at, table.c.upload_id)
            rows = (await conn.execute(query.limit(limit))).mappings().all()
        return [_upload(row) for row in rows]

    async def delete_upload(self, upload_id: str) -> bool:
        """Forget an upload and (by cascade) its parts; False if there was none."""
        async with self._connect() as conn:
            result = await conn.execute(self.upload_removal(upload_id))
        return result.rowcount > 0

    @staticmethod
    def upload_removal(upload_id: str) -> sa.Delete:
        """The statement that forgets an upload and (by cascade) its parts, for a transaction
        of the caller's: a completed upload goes with the rows of the object it made."""
        return sa.delete(multipart_uploads).where(multipart_uploads.c.upload_id == upload_id)

    # -- uploads a node opened at a store on its own behalf ---------------------------------

    def _clock(self, ahead: float = 0.0) -> sa.ColumnElement[Any]:
        return database_clock(self.dialect, ahead)

    async def open_store_upload(
        self, mount_id: int, key: str, store_upload_id: str, owner: str, lease: float
    ) -> int:
        """Record an upload `owner` holds for `lease` seconds from now; its record's id."""
        values = {
            "mount_id": mount_id,
            "key": key,
            "store_upload_id": store_upload_id,
            "owner": owner,
            "expires_at": self._clock(lease),
        }
        insert = sa.insert(store_uploads).values(values).returning(store_uploads.c.id)
        async with self._connect() as conn:
            return int((await conn.execute(insert)).scalar_one())

    async def renew_store_upload(self, record_id: int, owner: str, lease: float) -> bool:
        """Hold the lease `lease` seconds more; False if `owner` holds it no longer (another
        node took it over, when it ran out)."""
        table = store_uploads
        query = (
            sa.update(table)
            .where(table.c.id == record_id, table.c.owner == owner)
            .values(expires_at=self._clock(lease))
        )
        async with self._connect() as conn:
            result = await conn.execute(query)
        return result.rowcount > 0

    async def close_store_upload(self, record_id: int) -> None:
        """Forget an upload: completed or aborted by its holder, or by the janitor."""
        async with self._connect() as conn:
            await conn.execute(sa.delete(store_uploads).where(store_uploads.c.id == record_id))

    async def claim_lapsed_store_uploads(
        self, owner: str, lease: float, limit: int = 100
    ) -> list[StoreUploadRecord]:
        """Uploads whose lease ran out, each taken over by `owner` for `lease` seconds (so that
        of several janitors one aborts it, and another retries if that one dies too)."""
        table = store_uploads
        lapsed = table.c.expires_at < self._clock()
        query = (
            sa.select(table.c.id, table.c.mount_id, table.c.key, table.c.store_upload_id,
                      table.c.owner)
            .where(lapsed)
            .order_by(table.c.expires_at)
            .limit(limit)
        )  # fmt: skip
        claimed = []
        async with self._connect() as conn:
            rows = (await conn.execute(query)).all()
            for row in rows:
                take = (
                    sa.update(table)
                    .where(table.c.id == row.id, lapsed)
                    .values(owner=owner, expires_at=self._clock(lease))
                )
                if (await conn.execute(take)).rowcount:
                    claimed.append(StoreUploadRecord(*row))
        return claimed

    async def stale_uploads(self, older_than: datetime, limit: int = 100) -> list[UploadRecord]:
        """Uploads of any mount begun before `older_than`, oldest first: for the reaper."""
        table = multipart_uploads
        query = (
            sa.select(table)
            .where(table.c.initiated_at < older_than)
            .order_by(table.c.initiated_at, table.c.upload_id)
            .limit(limit)
        )
        async with self._connect() as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [_upload(row) for row in rows]


async def _after_marker(
    conn: AsyncConnection, mount_id: int, key_marker: str, upload_id_marker: str
) -> sa.ColumnElement[bool]:
    """The condition for "after (key_marker, upload_id_marker)" in list_uploads' order."""
    table = multipart_uploads
    greater_key = table.c.key > key_marker
    if not upload_id_marker:
        return greater_key
    # Uploads of one key go by initiation time, so "after the marker" needs the marker's time.
    marker_time = (
        await conn.execute(
            sa.select(table.c.initiated_at).where(
                table.c.upload_id == upload_id_marker,
                table.c.mount_id == mount_id,
                table.c.key == key_marker,
            )
        )
    ).scalar_one_or_none()
    same_key = table.c.key == key_marker
    if marker_time is None:
        # The marker upload completed or was aborted between two pages. Its place is unknown, so
        # the key's uploads are listed again from the start: a client cleaning up must not miss
        # one, and seeing one twice is harmless.
        return sa.or_(greater_key, same_key)
    later = sa.or_(
        table.c.initiated_at > marker_time,
        sa.and_(table.c.initiated_at == marker_time, table.c.upload_id > upload_id_marker),
    )
    return sa.or_(greater_key, sa.and_(same_key, later))


def _prefix_end(prefix: str) -> str | None:
    """The least string above every string that starts with `prefix` (None: there is none).

    Code point order is UTF-8 byte order, so bumping the last code point that can be bumped
    gives the bound. Surrogates are skipped: they cannot be stored, nor compared as UTF-8.
    """
    chars = list(prefix)
    while chars:
        bumped = ord(chars.pop()) + 1
        if bumped in _SURROGATES:
            bumped = _SURROGATES.stop
        if bumped <= _MAX_CODE_POINT:
            return "".join(chars) + chr(bumped)
    return None


def _foreign_key_violation(error: sa_exc.IntegrityError) -> bool:
    if getattr(error.orig, "sqlstate", None) == "23503":  # PostgreSQL, via SQLAlchemy's asyncpg
        return True
    return "FOREIGN KEY constraint failed" in str(error.orig)  # SQLite has only the message


def _upload(row: sa.RowMapping) -> UploadRecord:
    return UploadRecord(
        upload_id=row["upload_id"],
        mount_id=row["mount_id"],
        key=row["key"],
        store_upload_id=row["store_upload_id"],
        attrs=MappingProxyType(json.loads(row["attrs"])),
        initiated_at=row["initiated_at"],
        access_key=row["access_key"],
    )


def _dumps(value: Mapping[str, Any]) -> str:
    # As store.py writes JSON columns (not imported from there: store.py imports this module).
    return json.dumps(
        value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=_plain
    )


def _plain(value: object) -> object:
    # Attributes often arrive as read-only mappings (a record's own attrs, user metadata), which
    # json does not take as objects.
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} in upload attributes is not JSON")


class UploadLeases(UploadJournal):
    """A mount's uploads of its own, recorded under a lease renewed while they are held.

    A holder that dies stops renewing: once the lease has run out, a janitor of any node
    (service.multipart) aborts the upload. A database that cannot be reached does not fail
    the write: its upload then goes unrecorded, and is said so in the log.
    """

    def __init__(self, meta: MultipartUploads, mount_id: int, lease: float) -> None:
        self._meta = meta
        self._mount_id = mount_id
        self._lease = lease

    @contextlib.asynccontextmanager
    async def holding(self, key: str, upload_id: str) -> AsyncIterator[None]:
        try:
            record = await self._meta.open_store_upload(
                self._mount_id, key, upload_id, OWNER, self._lease
            )
        except MetaError as exc:
            log.warning("upload %s of %r not recorded, kept only while held: %s",
                        upload_id, key, exc)  # fmt: skip
            yield
            return
        renewing = asyncio.create_task(self._renew(record, key))
        try:
            yield
        finally:
            renewing.cancel()
            # Shielded: a cancelled write's record must still go (else a janitor aborts an
            # upload that is finished, which does nothing, once the lease runs out).
            with anyio.CancelScope(shield=True):
                try:
                    await self._meta.close_store_upload(record)
                except MetaError as exc:
                    log.warning("upload %s of %r not forgotten: %s", upload_id, key, exc)

    async def _renew(self, record: int, key: str) -> None:
        while True:
            await asyncio.sleep(max(self._lease / 3, 0.05))
            try:
                if not await self._meta.renew_store_upload(record, OWNER, self._lease):
                    log.warning("lease of the upload of %r taken over: it may be aborted", key)
                    return
            except MetaError as exc:
                log.warning("lease of the upload of %r not renewed: %s", key, exc)
