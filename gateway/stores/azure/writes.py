"""Writes of the Azure store: block blobs (one Put Blob, or Put Block + Put Block List for
large bodies), S3 multipart uploads as uncommitted blocks, copy, delete and the container."""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import struct
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import Any

import httpx
from defusedxml import ElementTree

from gateway.stores.azure.blobs import Blobs
from gateway.stores.azure.metadata import (
    Found,
    attr_headers,
    etag_of,
    metadata_headers,
    multipart_etag,
    read_tags,
    same_etag,
    tags_header,
    tags_xml,
)
from gateway.stores.azure.wire import AzureError
from gateway.stores.base import (
    ContainerExists,
    ContainerNotEmpty,
    ContainerNotFound,
    InvalidPart,
    ObjectInfo,
    ObjectNotFound,
    PartInfo,
    PreconditionFailed,
    StoreUnavailable,
    UnsupportedKey,
    UploadNotFound,
    VersionChanged,
    WriteAttrs,
    WriteConflict,
    one_version,
)
from gateway.stores.bodies import StreamedBody, drain, split
from gateway.stores.etags import check_part_number, check_part_order

# Bodies above this go up as blocks of BLOCK_SIZE: memory holds one block, never the body,
# and a block that fails can be sent again.
PUT_THRESHOLD = 16 << 20
BLOCK_SIZE = 8 << 20
MAX_BLOCKS = 50000
# How long a server-side copy Azure reports pending is waited for.
COPY_WAIT = 600.0

# A block id, the same length for every block we make: upload (16 bytes), part number,
# kind, a nonce telling two uploads of one part apart, and (for records) the part's MD5.
_BLOCK = struct.Struct(">16sHB4s16s")
MARK, DATA, RECORD, GONE = 0, 1, 2, 3  # upload opened, part bytes, part's MD5, aborted
_NO_MD5 = bytes(16)


@dataclass(frozen=True, slots=True)
class Block:
    name: str
    part: int
    kind: int
    nonce: bytes
    md5: bytes
    size: int


def block_id(
    upload: bytes, part: int, kind: int, nonce: bytes = bytes(4), md5: bytes = _NO_MD5
) -> str:
    return base64.b64encode(_BLOCK.pack(upload, part, kind, nonce, md5)).decode()


def _properties(attrs: WriteAttrs) -> tuple[str | None, ...]:
    return (attrs.content_type, attrs.content_encoding, attrs.content_disposition,
            attrs.content_language, attrs.cache_control)  # fmt: skip


async def _hashed(body: AsyncIterator[bytes], md5: Any) -> AsyncGenerator[bytes, None]:
    async for chunk in body:
        md5.update(chunk)
        yield chunk


def _upload(upload_id: str) -> bytes:
    try:
        raw = bytes.fromhex(upload_id)
    except ValueError:
        raw = b""
    if len(raw) != 16:
        raise UploadNotFound(f"{upload_id!r} is no upload of this store")
    return raw


class Writes:
    """put, copy, delete, multipart uploads and the container of the az:// store, over its
    blob client."""

    def __init__(self, blobs: Blobs) -> None:
        self.blobs = blobs

    # -- put ---------------------------------------------------------------------------------

    async def _conditions(
        self, key: str, if_match: str | None, if_none_match: bool
    ) -> dict[str, str]:
        """Azure's If-Match takes its own ETag: ours is checked on a HEAD, and the write then
        pinned to the Azure ETag that HEAD saw, so a change in between still fails it."""
        cond: dict[str, str] = {}
        if if_match is not None:
            try:
                found = await self.blobs.find(key)
            except ObjectNotFound:
                raise PreconditionFailed(f"{key}: does not exist") from None
            if not same_etag(found.info.etag, if_match):
                raise PreconditionFailed(f"{key}: is {found.info.etag}, not {if_match}")
            cond["if-match"] = found.azure_etag
        if if_none_match:
            # Asked first: a refusal at the write is then a conflict (WriteConflict).
            try:
                await self.blobs.find(key)
            except ObjectNotFound:
                cond["if-none-match"] = "*"
            else:
                raise PreconditionFailed(f"{key}: exists")
        return cond

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
        path = self.blobs.path(key)
        cond = await self._conditions(key, if_match, if_none_match)
        try:
            return await self._put(key, path, body, size, attrs, cond)
        except PreconditionFailed as exc:
            if not cond:
                raise
            # The condition held before the body: another write landed during this one.
            raise WriteConflict(str(exc)) from None

    async def _put(
        self, key: str, path: str, body: AsyncIterator[bytes], size: int, attrs: WriteAttrs,
        cond: dict[str, str],
    ) -> ObjectInfo:  # fmt: skip
        if size > PUT_THRESHOLD:
            return await self._put_blocks(key, path, body, size, attrs, cond)
        stream: StreamedBody | bytes = b""
        if size == 0:
            await drain(body, size, key)
        else:
            # Holds back the last chunk until the body ended cleanly: a body that fails leaves
            # the request short of its Content-Length, and Azure commits nothing.
            stream = StreamedBody(body, size, key)
        headers = {"x-ms-blob-type": "BlockBlob", "content-length": str(size)}
        headers |= attr_headers(attrs) | cond
        try:
            r = await self.blobs.send(key, "PUT", path, (), headers, stream, conditional=bool(cond))
        except Exception:
            if isinstance(stream, StreamedBody) and stream.error is not None:
                raise stream.error from None  # the body's own failure, not the cut it caused
            raise
        # Azure computes the MD5 of a Put Blob's body and keeps it as Content-MD5.
        etag = etag_of({}, r.headers.get("content-md5"), r.headers.get("etag", ""))
        return self.blobs.written(key, size, etag, attrs, r)

    async def _put_blocks(
        self, key: str, path: str, body: AsyncIterator[bytes], size: int, attrs: WriteAttrs,
        cond: dict[str, str],
    ) -> ObjectInfo:  # fmt: skip
        block_size = max(BLOCK_SIZE, -(-size // MAX_BLOCKS))
        upload = os.urandom(16)
        md5 = hashlib.md5()
        ids: list[str] = []
        async with aclosing(split(_hashed(body, md5), size, block_size, key)) as pieces:
            async for data in pieces:
                bid = block_id(upload, len(ids) + 1, DATA)
                try:
                    await self._put_block(key, path, bid, data, len(data))
                finally:
                    data.release()  # the next block is gathered now: one in memory, not two
                ids.append(bid)
        # Uncommitted blocks of a failed put stay invisible, and Azure drops them at the next
        # commit to this blob or after a week; there is no call to drop them sooner.
        # The MD5 is ours, kept as Content-MD5: the object's ETag is the MD5, as for one put.
        headers = {"x-ms-blob-content-md5": base64.b64encode(md5.digest()).decode()}
        r = await self._commit(key, path, ids, headers | attr_headers(attrs) | cond, bool(cond))
        return self.blobs.written(key, size, f'"{md5.hexdigest()}"', attrs, r)

    async def _put_block(self, key: str, path: str, bid: str, content: Any, size: int) -> None:
        query = [("comp", "block"), ("blockid", bid)]
        await self.blobs.send(key, "PUT", path, query, {"content-length": str(size)}, content)

    async def _commit(
        self, key: str, path: str, ids: Sequence[str], headers: dict[str, str], conditional: bool
    ) -> httpx.Response:
        xml = "".join(f"<Uncommitted>{bid}</Uncommitted>" for bid in ids)
        body = f'<?xml version="1.0" encoding="utf-8"?><BlockList>{xml}</BlockList>'.encode()
        headers = headers | {"content-length": str(len(body))}
        query = [("comp", "blocklist")]
        return await self.blobs.send(
            key, "PUT", path, query, headers, body, conditional=conditional
        )

    # -- delete and copy ---------------------------------------------------------------------

    async def delete(self, key: str) -> None:
        try:
            path = self.blobs.path(key)
        except UnsupportedKey:
            return  # no such blob can exist
        try:
            await self.blobs.transport.send(
                "DELETE", path, headers={"x-ms-delete-snapshots": "include"}
            )
        except AzureError as exc:
            if exc.code != "BlobNotFound":
                raise self.blobs.error(exc, key) from None

    async def copy(
        self,
        src_key: str,
        dst_key: str,
        attrs: WriteAttrs | None,
        *,
        if_match: str | None = None,
        version_id: str | None = None,
    ) -> ObjectInfo:
        one_version("az", version_id)
        dst = self.blobs.path(dst_key)
        src = await self.blobs.find(src_key)
        if if_match is not None and not same_etag(src.info.etag, if_match):
            raise VersionChanged(f"{src_key}: is no longer {if_match}")
        if src_key == dst_key and attrs is None:
            return src.info  # nothing would change
        old = WriteAttrs.of(src.info)
        if attrs is None and src.info.tag_count:  # Copy Blob does not copy index tags
            old = replace(old, tags=await self.get_tags(src_key))
        keep = old if attrs is None else replace(attrs, checksums=src.info.checksums)
        if src_key != dst_key and _properties(keep) == _properties(old):
            return await self._copy_blob(
                src_key, dst_key, dst, src, None if attrs is None else keep, keep.tags
            )
        # Copy Blob keeps the source's properties, and setting them after would show the copy
        # with the old ones for a moment: new properties are written with the bytes, streamed.
        body = self.blobs.read(src_key, if_match=src.info.etag)
        async with aclosing(body):
            return await self.put(dst_key, body, src.info.size, keep)

    async def _copy_blob(
        self,
        src_key: str,
        dst_key: str,
        dst: str,
        src: Found,
        attrs: WriteAttrs | None,
        tags: Mapping[str, str],
    ) -> ObjectInfo:
        """Server-side Copy Blob, pinned to the source version; attrs None keeps its metadata."""
        headers = {
            "x-ms-copy-source": self.blobs.transport.url(self.blobs.path(src_key)),
            "x-ms-source-if-match": src.azure_etag,
        }
        if attrs is not None:
            headers |= metadata_headers(attrs, src.info.etag)
        if tags:
            headers["x-ms-tags"] = tags_header(tags)
        try:
            r = await self.blobs.transport.send("PUT", dst, headers=headers)
        except AzureError as exc:
            if exc.status == 412:
                raise VersionChanged(f"{src_key}: changed while being copied") from None
            raise self.blobs.error(exc, dst_key) from None
        # Within one account a copy is done when answered, but Azure may report it pending.
        status = r.headers.get("x-ms-copy-status", "success")
        waited = 0.0
        while status == "pending" and waited < COPY_WAIT:
            await self.blobs.transport.clock.sleep(0.5)
            waited += 0.5
            try:
                status = (await self.blobs.transport.send("HEAD", dst)).headers.get(
                    "x-ms-copy-status", ""
                )
            except AzureError as exc:
                raise self.blobs.error(exc, dst_key) from None
        if status != "success":
            raise StoreUnavailable(f"{dst_key}: the copy of {src_key} is {status or 'lost'}")
        return (await self.blobs.find(dst_key)).info

    # -- tags: the blob's index tags (Set Blob Tags, Get Blob Tags) -------------------------

    async def get_tags(self, key: str, version_id: str | None = None) -> dict[str, str]:
        one_version("az", version_id)
        path = self.blobs.path(key, reading=True)
        r = await self.blobs.send(key, "GET", path, [("comp", "tags")])
        return read_tags(r.content)

    async def put_tags(
        self, key: str, tags: Mapping[str, str], version_id: str | None = None
    ) -> None:
        one_version("az", version_id)
        path = self.blobs.path(key, reading=True)
        body = tags_xml(tags)
        headers = {"content-type": "application/xml", "content-length": str(len(body))}
        await self.blobs.send(key, "PUT", path, [("comp", "tags")], headers, body)

    # -- multipart ---------------------------------------------------------------------------

    async def _blocks(self, key: str, path: str, upload: bytes) -> list[Block]:
        """The uncommitted blocks of an upload; UploadNotFound unless it is open (made here,
        not aborted, not yet completed: a commit drops every uncommitted block of the blob)."""
        query = [("comp", "blocklist"), ("blocklisttype", "uncommitted")]
        try:
            r = await self.blobs.transport.send("GET", path, query)
        except AzureError as exc:
            if exc.code == "BlobNotFound":
                raise UploadNotFound(f"{key}: no such upload") from None
            raise self.blobs.error(exc, key) from None
        blocks: list[Block] = []
        for element in ElementTree.fromstring(r.content).iterfind("UncommittedBlocks/Block"):
            name = element.findtext("Name") or ""
            try:
                raw = base64.b64decode(name, validate=True)
            except binascii.Error:
                continue
            if len(raw) == _BLOCK.size and raw[:16] == upload:
                _, part, kind, nonce, md5 = _BLOCK.unpack(raw)
                blocks.append(
                    Block(name, part, kind, nonce, md5, int(element.findtext("Size") or 0))
                )
        kinds = {b.kind for b in blocks}
        if MARK not in kinds or GONE in kinds:
            raise UploadNotFound(f"{key}: no such upload")
        return blocks

    async def create_multipart(self, key: str, attrs: WriteAttrs) -> str:
        """An upload is a marker block on the blob; attrs come back to complete_multipart."""
        path = self.blobs.path(key)
        upload = os.urandom(16)
        await self._put_block(key, path, block_id(upload, 0, MARK), b"\0", 1)
        return upload.hex()

    async def upload_part(
        self, key: str, upload_id: str, part_number: int, body: AsyncIterator[bytes], size: int
    ) -> PartInfo:
        check_part_number(part_number)
        path = self.blobs.path(key)
        upload = _upload(upload_id)
        await self._blocks(key, path, upload)
        # The id goes out before the bytes, so it cannot hold their MD5: a nonce ties the
        # bytes to a record block, sent after them, whose id holds it.
        nonce = os.urandom(4)
        md5 = hashlib.md5()
        stream: StreamedBody | bytes = b""
        if size == 0:
            await drain(body, size, key)
        else:
            stream = StreamedBody(_hashed(body, md5), size, key)
        try:
            await self._put_block(
                key, path, block_id(upload, part_number, DATA, nonce), stream, size
            )
        except Exception:
            if isinstance(stream, StreamedBody) and stream.error is not None:
                raise stream.error from None
            raise
        record = block_id(upload, part_number, RECORD, nonce, md5.digest())
        await self._put_block(key, path, record, b"\0", 1)
        return PartInfo(part_number, f'"{md5.hexdigest()}"', size)

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
        path = self.blobs.path(key)
        blocks = await self._blocks(key, path, _upload(upload_id))
        check_part_order(parts)
        # Azure's own If-Match / If-None-Match on the commit: atomic at the store.
        cond = await self._conditions(key, if_match, if_none_match)
        data = {(b.part, b.nonce): b for b in blocks if b.kind == DATA}
        records = {(b.part, b.md5): b.nonce for b in blocks if b.kind == RECORD}
        ids: list[str] = []
        md5s: list[bytes] = []
        for part in parts:
            try:
                md5 = bytes.fromhex(part.etag.strip('"'))
            except ValueError:
                md5 = b""
            nonce = records.get((part.part_number, md5))
            block = data.get((part.part_number, nonce)) if nonce is not None else None
            if block is None or block.size != part.size:
                raise InvalidPart(f"part {part.part_number} with ETag {part.etag} was not uploaded")
            ids.append(block.name)
            md5s.append(md5)
        etag = multipart_etag(md5s)
        r = await self._commit(key, path, ids, attr_headers(attrs, etag) | cond, bool(cond))
        return self.blobs.written(key, sum(p.size for p in parts), etag, attrs, r)

    async def abort_multipart(self, key: str, upload_id: str) -> None:
        """Marks the upload aborted. Its blocks cannot be deleted: they stay invisible until
        the next commit to this blob or Azure's one-week expiry of uncommitted blocks."""
        try:
            path = self.blobs.path(key)
            upload = _upload(upload_id)
            await self._blocks(key, path, upload)
        except (UploadNotFound, UnsupportedKey):
            return
        await self._put_block(key, path, block_id(upload, 0, GONE), b"\0", 1)

    # -- the container itself ----------------------------------------------------------------

    def _whole_container(self) -> str:
        account, container = self.blobs.account, self.blobs.container
        if self.blobs.prefix:
            raise ValueError(f"a container URI names no prefix: az://{account}/{container}")
        return f"/{container}"

    async def create_container(self) -> None:
        path = self._whole_container()
        try:
            await self.blobs.transport.send("PUT", path, [("restype", "container")])
        except AzureError as exc:
            if exc.code in ("ContainerAlreadyExists", "ContainerBeingDeleted"):
                raise ContainerExists(f"container {path[1:]!r} exists") from None
            raise self.blobs.error(exc, "") from None

    async def delete_container(self) -> None:
        """Azure deletes a container with all its blobs: we look first, so a blob written
        between the look and the delete goes with it (Azure has no delete-if-empty)."""
        path = self._whole_container()
        query = [("restype", "container"), ("comp", "list"), ("maxresults", "1")]
        try:
            r = await self.blobs.transport.send("GET", path, query)
            if ElementTree.fromstring(r.content).find("Blobs/Blob") is not None:
                raise ContainerNotEmpty(f"container {path[1:]!r} is not empty")
            await self.blobs.transport.send("DELETE", path, [("restype", "container")])
        except AzureError as exc:
            if exc.code in ("ContainerNotFound", "ContainerBeingDeleted"):
                raise ContainerNotFound(f"container {path[1:]!r} does not exist") from None
            raise self.blobs.error(exc, "") from None
