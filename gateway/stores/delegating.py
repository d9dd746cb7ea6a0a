"""A Store whose writes are done by two collaborators: `writes` (put, copy, delete and the
container itself) and `uploads` (multipart uploads). The collaborators take the Store's own
method names and contract (`base.ObjectWrites`, `base.MultipartUploads`), so that a store
class holds only its reads, its listing and how it is built."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from gateway.stores.base import (
    MultipartUploads,
    ObjectInfo,
    ObjectWrites,
    PartInfo,
    Store,
    VersionDeleted,
    WriteAttrs,
)


class Writes(ObjectWrites, Protocol):
    """A store's writes collaborator: ObjectWrites, and the container as `Store` describes it."""

    async def create_container(self) -> None: ...

    async def delete_container(self) -> None: ...


class DelegatingStore(Store):
    """A Store whose writes go to `self.writes` and multipart uploads to `self.uploads`
    (one object may be both); subclasses set them and implement stat, read and list_page."""

    writes: Writes
    uploads: MultipartUploads

    async def put(
        self,
        key: str,
        body: AsyncIterator[bytes],
        size: int,
        attrs: WriteAttrs,
        *,
        if_match: str | None = None,
        if_none_match: bool = False,
    ) -> ObjectInfo:
        return await self.writes.put(
            key, body, size, attrs, if_match=if_match, if_none_match=if_none_match
        )

    async def copy(
        self,
        src_key: str,
        dst_key: str,
        attrs: WriteAttrs | None,
        *,
        if_match: str | None = None,
        version_id: str | None = None,
    ) -> ObjectInfo:
        return await self.writes.copy(
            src_key, dst_key, attrs, if_match=if_match, version_id=version_id
        )

    async def delete(self, key: str) -> VersionDeleted | None:
        return await self.writes.delete(key)

    async def create_container(self) -> None:
        await self.writes.create_container()

    async def delete_container(self) -> None:
        await self.writes.delete_container()

    async def create_multipart(self, key: str, attrs: WriteAttrs) -> str:
        return await self.uploads.create_multipart(key, attrs)

    async def upload_part(
        self, key: str, upload_id: str, part_number: int, body: AsyncIterator[bytes], size: int
    ) -> PartInfo:
        return await self.uploads.upload_part(key, upload_id, part_number, body, size)

    async def complete_multipart(
        self,
        key: str,
        upload_id: str,
        parts: Sequence[PartInfo],
        attrs: WriteAttrs,
        *,
        if_match: str | None = None,
        if_none_match: bool = False,
    ) -> ObjectInfo:
        return await self.uploads.complete_multipart(
            key, upload_id, parts, attrs, if_match=if_match, if_none_match=if_none_match
        )

    async def abort_multipart(self, key: str, upload_id: str) -> None:
        await self.uploads.abort_multipart(key, upload_id)
