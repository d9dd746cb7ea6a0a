"""Multipart uploads in progress: the client's upload ids, their parts, listing in S3 order.

The under-store holds the parts' bytes; this is what ListMultipartUploads and ListParts read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from .models import MetaError
from .tables import multipart_parts, multipart_uploads

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
        query = sa.delete(multipart_uploads).where(multipart_uploads.c.upload_id == upload_id)
        async with self._connect() as conn:
            result = await conn.execute(query)
        return result.rowcount > 0

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
