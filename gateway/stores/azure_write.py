"""Writes of the Azure store: block blobs (one Put Blob, or Put Block + Put Block List for
large bodies), S3 multipart uploads as uncommitted blocks, copy and delete."""

from __future__ import annotations

import abc
import base64
import binascii
import hashlib
import os
import struct
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote

import anyio
import httpx
from defusedxml import ElementTree

from gateway.stores.azure_auth import (
    AzureError,
    Found,
    Transport,
    attr_headers,
    etag_of,
    metadata_headers,
    multipart_etag,
    same_etag,
)
from gateway.stores.base import (
    InvalidPart,
    ObjectInfo,
    ObjectNotFound,
    PartInfo,
    PreconditionFailed,
    Store,
    StoreError,
    StoreUnavailable,
    UnsupportedKey,
    UploadNotFound,
    VersionChanged,
    WriteAttrs,
)
from gateway.stores.s3_body import StreamedBody, drain, split

# Bodies above this go up as blocks of BLOCK_SIZE: memory holds one block, never the body,
# and a block that fails can be sent again.
PUT_THRESHOLD = 16 << 20
BLOCK_SIZE = 8 << 20
MAX_BLOCKS = 50000
MAX_PART_NUMBER = 10000
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


class AzureWrites(Store):
    """put, copy, delete and multipart; AzureStore gives reads, errors and containers."""

    account: str
    container: str
    prefix: str
    http: Transport

    @abc.abstractmethod
    async def _find(self, key: str) -> Found: ...

    @abc.abstractmethod
    def _error(self, exc: AzureError, key: str) -> StoreError: ...

    def _path(self, key: str, *, reading: bool = False) -> str:
        """The blob's encoded path. Keys with '.' or '..' segments would be resolved by URL
        normalization and Azure turns '\\' into '/': either could leave the mount's prefix."""
        segments = key.split("/")
        if not key or "\\" in key or "." in segments or ".." in segments:
            raise ObjectNotFound(key) if reading else UnsupportedKey(f"{key!r}: not a blob name")
        try:
            return f"/{self.container}/" + quote(self.prefix + key, safe="/~")
        except UnicodeEncodeError:
            raise (
                ObjectNotFound(key) if reading else UnsupportedKey(f"{key!r}: not UTF-8")
            ) from None

    async def _send(
        self, key: str, method: str, path: str, query: Sequence[tuple[str, str]] = (),
        headers: Mapping[str, str] | None = None, content: Any = None, *, conditional: bool = False,
    ) -> httpx.Response:  # fmt: skip
        try:
            return await self.http.send(method, path, query, headers, content)
        except AzureError as exc:
            if exc.status == 412 or (
                conditional and exc.code in ("BlobNotFound", "BlobAlreadyExists")
            ):
                raise PreconditionFailed(f"{key}: {exc.code}") from None
            if exc.code in ("InvalidBlockList", "InvalidBlockId"):
                raise InvalidPart(f"{key}: {exc.code}") from None
            raise self._error(exc, key) from None

    def _written(
        self, key: str, size: int, etag: str, attrs: WriteAttrs, response: httpx.Response
    ) -> ObjectInfo:
        try:
            when = parsedate_to_datetime(response.headers["last-modified"]).astimezone(UTC)
        except (KeyError, TypeError, ValueError):
            when = datetime.now(UTC)
        return ObjectInfo(
            key=key,
            size=size,
            etag=etag,
            last_modified=when,
            content_type=attrs.content_type,
            content_encoding=attrs.content_encoding,
            content_disposition=attrs.content_disposition,
            content_language=attrs.content_language,
            cache_control=attrs.cache_control,
            expires=attrs.expires,
            metadata={k.lower(): v for k, v in attrs.metadata.items()},
            checksums=dict(attrs.checksums),  # a trailer's are complete only now
        )

    # -- put ---------------------------------------------------------------------------------

    async def _conditions(
        self, key: str, if_match: str | None, if_none_match: bool
    ) -> dict[str, str]:
        """Azure's If-Match takes its own ETag: ours is checked on a HEAD, and the write then
        pinned to the Azure ETag that HEAD saw, so a change in between still fails it."""
        cond: dict[str, str] = {}
        if if_match is not None:
            try:
                found = await self._find(key)
            except ObjectNotFound:
                raise PreconditionFailed(f"{key}: does not exist") from None
            if not same_etag(found.info.etag, if_match):
                raise PreconditionFailed(f"{key}: is {found.info.etag}, not {if_match}")
            cond["if-match"] = found.azure_etag
        if if_none_match:
            cond["if-none-match"] = "*"
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
        path = self._path(key)
        cond = await self._conditions(key, if_match, if_none_match)
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
            r = await self._send(key, "PUT", path, (), headers, stream, conditional=bool(cond))
        except Exception:
            if isinstance(stream, StreamedBody) and stream.error is not None:
                raise stream.error from None  # the body's own failure, not the cut it caused
            raise
        # Azure computes the MD5 of a Put Blob's body and keeps it as Content-MD5.
        etag = etag_of({}, r.headers.get("content-md5"), r.headers.get("etag", ""))
        return self._written(key, size, etag, attrs, r)

    async def _put_blocks(
        self, key: str, path: str, body: AsyncIterator[bytes], size: int, attrs: WriteAttrs,
        cond: dict[str, str],
    ) -> ObjectInfo:  # fmt: skip
        if "if-none-match" in cond:
            # Before the blocks, not only at the commit: a doomed body is not sent.
            try:
                await self._find(key)
            except ObjectNotFound:
                pass
            else:
                raise PreconditionFailed(f"{key}: exists")
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
        return self._written(key, size, f'"{md5.hexdigest()}"', attrs, r)

    async def _put_block(self, key: str, path: str, bid: str, content: Any, size: int) -> None:
        query = [("comp", "block"), ("blockid", bid)]
        await self._send(key, "PUT", path, query, {"content-length": str(size)}, content)

    async def _commit(
        self, key: str, path: str, ids: Sequence[str], headers: dict[str, str], conditional: bool
    ) -> httpx.Response:
        xml = "".join(f"<Uncommitted>{bid}</Uncommitted>" for bid in ids)
        body = f'<?xml version="1.0" encoding="utf-8"?><BlockList>{xml}</BlockList>'.encode()
        headers = headers | {"content-length": str(len(body))}
        query = [("comp", "blocklist")]
        return await self._send(key, "PUT", path, query, headers, body, conditional=conditional)

    # -- delete and copy ---------------------------------------------------------------------

    async def delete(self, key: str) -> None:
        try:
            path = self._path(key)
        except UnsupportedKey:
            return  # no such blob can exist
        try:
            await self.http.send("DELETE", path, headers={"x-ms-delete-snapshots": "include"})
        except AzureError as exc:
            if exc.code != "BlobNotFound":
                raise self._error(exc, key) from None

    async def copy(
        self, src_key: str, dst_key: str, attrs: WriteAttrs | None, *, if_match: str | None = None
    ) -> ObjectInfo:
        dst = self._path(dst_key)
        src = await self._find(src_key)
        if if_match is not None and not same_etag(src.info.etag, if_match):
            raise VersionChanged(f"{src_key}: is no longer {if_match}")
        if src_key == dst_key and attrs is None:
            return src.info  # nothing would change
        old = WriteAttrs.of(src.info)
        keep = old if attrs is None else replace(attrs, checksums=src.info.checksums)
        if src_key != dst_key and _properties(keep) == _properties(old):
            return await self._copy_blob(
                src_key, dst_key, dst, src, None if attrs is None else keep
            )
        # Copy Blob keeps the source's properties, and setting them after would show the copy
        # with the old ones for a moment: new properties are written with the bytes, streamed.
        body = self.read(src_key, if_match=src.info.etag)
        async with aclosing(body):
            return await self.put(dst_key, body, src.info.size, keep)

    async def _copy_blob(
        self, src_key: str, dst_key: str, dst: str, src: Found, attrs: WriteAttrs | None
    ) -> ObjectInfo:
        """Server-side Copy Blob, pinned to the source version; attrs None keeps its metadata."""
        headers = {
            "x-ms-copy-source": self.http.url(self._path(src_key)),
            "x-ms-source-if-match": src.azure_etag,
        }
        if attrs is not None:
            headers |= metadata_headers(attrs, src.info.etag)
        try:
            r = await self.http.send("PUT", dst, headers=headers)
        except AzureError as exc:
            if exc.status == 412:
                raise VersionChanged(f"{src_key}: changed while being copied") from None
            raise self._error(exc, dst_key) from None
        # Within one account a copy is done when answered, but Azure may report it pending.
        status = r.headers.get("x-ms-copy-status", "success")
        waited = 0.0
        while status == "pending" and waited < COPY_WAIT:
            await anyio.sleep(0.5)
            waited += 0.5
            try:
                status = (await self.http.send("HEAD", dst)).headers.get("x-ms-copy-status", "")
            except AzureError as exc:
                raise self._error(exc, dst_key) from None
        if status != "success":
            raise StoreUnavailable(f"{dst_key}: the copy of {src_key} is {status or 'lost'}")
        return (await self._find(dst_key)).info

    # -- multipart ---------------------------------------------------------------------------

    async def _blocks(self, key: str, path: str, upload: bytes) -> list[Block]:
        """The uncommitted blocks of an upload; UploadNotFound unless it is open (made here,
        not aborted, not yet completed: a commit drops every uncommitted block of the blob)."""
        query = [("comp", "blocklist"), ("blocklisttype", "uncommitted")]
        try:
            r = await self.http.send("GET", path, query)
        except AzureError as exc:
            if exc.code == "BlobNotFound":
                raise UploadNotFound(f"{key}: no such upload") from None
            raise self._error(exc, key) from None
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
        path = self._path(key)
        upload = os.urandom(16)
        await self._put_block(key, path, block_id(upload, 0, MARK), b"\0", 1)
        return upload.hex()

    async def upload_part(
        self, key: str, upload_id: str, part_number: int, body: AsyncIterator[bytes], size: int
    ) -> PartInfo:
        if not 1 <= part_number <= MAX_PART_NUMBER:
            raise ValueError(f"part number {part_number} is not in 1..{MAX_PART_NUMBER}")
        path = self._path(key)
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
        self, key: str, upload_id: str, parts: Sequence[PartInfo], attrs: WriteAttrs
    ) -> ObjectInfo:
        path = self._path(key)
        blocks = await self._blocks(key, path, _upload(upload_id))
        numbers = [p.part_number for p in parts]
        if not parts or numbers != sorted(set(numbers)):
            raise InvalidPart("parts must be given in ascending order, each once")
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
        r = await self._commit(key, path, ids, attr_headers(attrs, etag), False)
        return self._written(key, sum(p.size for p in parts), etag, attrs, r)

    async def abort_multipart(self, key: str, upload_id: str) -> None:
        """Marks the upload aborted. Its blocks cannot be deleted: they stay invisible until
        the next commit to this blob or Azure's one-week expiry of uncommitted blocks."""
        try:
            path = self._path(key)
            upload = _upload(upload_id)
            await self._blocks(key, path, upload)
        except (UploadNotFound, UnsupportedKey):
            return
        await self._put_block(key, path, block_id(upload, 0, GONE), b"\0", 1)
