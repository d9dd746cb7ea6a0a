"""Multipart uploads of the hdfs:// store: parts wait in `<root>/.s3gw-uploads/<id>/`, beside an
empty file that names the upload's key, and are joined there with CONCAT, then renamed into
place as a put's temp file is."""

from __future__ import annotations

import abc
import hashlib
import re
import secrets
from collections.abc import AsyncIterator, Sequence
from typing import Any

from gateway.stores.base import (
    InvalidPart,
    ObjectInfo,
    PartInfo,
    StoreError,
    UnsupportedKey,
    UploadNotFound,
    WriteAttrs,
)
from gateway.stores.hdfs import HdfsReads
from gateway.stores.hdfs_client import RemoteFailure
from gateway.stores.local_files import new_md5
from gateway.stores.local_meta import UPLOADS_DIR, bare
from gateway.stores.local_multipart import MAX_PART_NUMBER, multipart_etag

# Ids are ours (token_urlsafe); anything else could name a path outside the uploads folder.
_UPLOAD_ID = re.compile(r"[A-Za-z0-9_-]{16,64}\Z")
_MD5 = re.compile(r"[0-9a-f]{32}\Z")


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""


class HdfsMultipart(HdfsReads):
    """create/upload_part/complete/abort of the hdfs:// store; `HdfsStore` provides the steps
    every write takes."""

    @abc.abstractmethod
    def _target(self, key: str) -> str:
        """The HDFS path of `key`; UnsupportedKey for keys no HDFS file can have."""

    @abc.abstractmethod
    def _write_error(
        self, exc: RemoteFailure, key: str, *, exclusive: bool = False
    ) -> StoreError: ...

    @abc.abstractmethod
    async def _upload(
        self, key: str, path: str, body: AsyncIterator[bytes], size: int, md5: Any
    ) -> None:
        """CREATE `path` with the body, in place."""

    @abc.abstractmethod
    async def _temp(self, key: str, body: AsyncIterator[bytes], size: int, md5: Any) -> str:
        """The body written to a new hidden temp file; its path."""

    @abc.abstractmethod
    async def _discard(self, path: str, recursive: bool = False, late: bool = False) -> None: ...

    @abc.abstractmethod
    async def _seal(self, key: str, temp: str, etag: str, attrs: WriteAttrs) -> ObjectInfo:
        """Record ETag and attributes on the finished file."""

    @abc.abstractmethod
    async def _place(self, key: str, temp: str, dest: str, *, exclusive: bool) -> None:
        """Rename the finished file into place."""

    def _upload_folder(self, upload_id: str) -> str:
        if not _UPLOAD_ID.match(upload_id):
            raise UploadNotFound(upload_id)
        return f"{self.root}/{UPLOADS_DIR}/{upload_id}"

    @staticmethod
    def _owner_mark(key: str) -> str:
        # The key's digest names an empty file in the upload's folder: one GETFILESTATUS tells
        # whether an upload id belongs to a key, whatever the key's length.
        return "key-" + hashlib.sha256(key.encode("utf-8")).hexdigest()

    async def _staging(self, key: str, upload_id: str) -> str:
        folder = self._upload_folder(upload_id)
        try:
            await self._status(f"{folder}/{self._owner_mark(key)}")
        except RemoteFailure as exc:
            if exc.exception == "FileNotFoundException":
                raise UploadNotFound(f"{upload_id} is no upload of {key!r}") from None
            raise self._error(exc, key) from None
        return folder

    async def create_multipart(self, key: str, attrs: WriteAttrs) -> str:
        dest = self._target(key)
        await self._require_root(key)
        try:  # fail now, not after all the parts
            if (await self._status(dest)).is_dir:
                raise UnsupportedKey(f"{key!r}: a folder of that name exists")
        except RemoteFailure as exc:
            if exc.exception != "FileNotFoundException":
                raise self._write_error(exc, key) from None
        upload_id = secrets.token_urlsafe(24)
        mark = f"{self._upload_folder(upload_id)}/{self._owner_mark(key)}"
        await self._upload(key, mark, _nothing(), 0, new_md5())
        return upload_id

    async def upload_part(
        self, key: str, upload_id: str, part_number: int, body: AsyncIterator[bytes], size: int
    ) -> PartInfo:
        if not 1 <= part_number <= MAX_PART_NUMBER:
            raise ValueError(f"part number {part_number} is not in 1..{MAX_PART_NUMBER}")
        folder = await self._staging(key, upload_id)
        md5 = new_md5()
        temp = await self._temp(key, body, size, md5)
        # Named by number and MD5: the complete finds exactly the part the client means, and a
        # part uploaded again is a new file beside the old one, never a torn one.
        part = f"{folder}/{part_number:05d}.{md5.hexdigest()}"
        try:
            await self._http.call("PUT", temp, "RENAME", idempotent=False, destination=part,
                                  renameoptions="OVERWRITE")  # fmt: skip
        except RemoteFailure as exc:
            await self._discard(temp)
            if exc.exception == "FileNotFoundException":
                raise UploadNotFound(f"{upload_id} was aborted") from None
            raise self._error(exc, key) from None
        except BaseException:
            await self._discard(temp)
            raise
        return PartInfo(part_number, f'"{md5.hexdigest()}"', size)

    async def complete_multipart(
        self, key: str, upload_id: str, parts: Sequence[PartInfo], attrs: WriteAttrs
    ) -> ObjectInfo:
        folder = await self._staging(key, upload_id)
        numbers = [p.part_number for p in parts]
        if not parts or numbers != sorted(set(numbers)):
            raise InvalidPart("parts must be given in ascending order, each once")
        dest = self._target(key)
        if any(not _MD5.match(bare(p.etag).lower()) for p in parts):
            raise InvalidPart("a part's ETag is no MD5")
        etag = multipart_etag([p.etag for p in parts])
        # A completion that failed after joining left the joined file under this name: a retry
        # with the same parts goes on from there.
        joined = f"{folder}/joined-{bare(etag)}"
        try:
            held = {s.name: s for s in await self._children(folder)}
        except RemoteFailure as exc:
            raise self._error(exc, key) from None
        if joined.rsplit("/", 1)[1] not in held:
            files = []
            for p in parts:
                name = f"{p.part_number:05d}.{bare(p.etag).lower()}"
                if name not in held:
                    raise InvalidPart(f"part {p.part_number} with ETag {p.etag} was not uploaded")
                files.append(f"{folder}/{name}")
            await self._join(key, [f for f in files if held[f.rsplit("/", 1)[1]].length], joined)
        info = await self._seal(key, joined, etag, attrs)
        await self._place(key, joined, dest, exclusive=False)
        # After the rename: a crash in between leaves only hidden staging files behind.
        await self._discard(folder, recursive=True)
        return info

    async def _join(self, key: str, files: list[str], joined: str) -> None:
        """CONCAT the non-empty parts into the first (HDFS takes no empty sources), renamed."""
        try:
            if not files:
                await self._upload(key, joined, _nothing(), 0, new_md5())
                return
            if len(files) > 1:
                await self._http.call("POST", files[0], "CONCAT", idempotent=False,
                                      sources=",".join(files[1:]))  # fmt: skip
            await self._http.call("PUT", files[0], "RENAME", idempotent=False, destination=joined,
                                  renameoptions="OVERWRITE")  # fmt: skip
        except RemoteFailure as exc:
            raise self._error(exc, key) from None

    async def abort_multipart(self, key: str, upload_id: str) -> None:
        try:
            folder = await self._staging(key, upload_id)
        except UploadNotFound:
            return
        await self._discard(folder, recursive=True)
