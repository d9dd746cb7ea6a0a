"""Multipart uploads of the hdfs:// store: parts wait in `<root>/.s3gw-uploads/<id>/`, beside an
empty file that names the upload's key, and are joined there with CONCAT, then renamed into
place as a put's temp file is."""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator, Sequence

from gateway.stores.base import (
    InvalidPart,
    ObjectInfo,
    PartInfo,
    UnsupportedKey,
    UploadNotFound,
    WriteAttrs,
)
from gateway.stores.etags import bare, check_part_number, check_part_order, multipart_etag, new_md5
from gateway.stores.file_meta import UPLOADS_DIR, new_upload_id, upload_id_checked
from gateway.stores.hdfs.client import RemoteFailure
from gateway.stores.hdfs.tree import Tree
from gateway.stores.hdfs.writes import Writes

_MD5 = re.compile(r"[0-9a-f]{32}\Z")


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""


class Uploads:
    """Multipart uploads of the hdfs:// store, by the Store's method names (attrs are taken at
    completion, when the object appears); parts are written, and the joined object placed, as
    `Writes` writes and places a put's temp file."""

    def __init__(self, tree: Tree, writes: Writes) -> None:
        self.tree, self.writes = tree, writes

    def _upload_folder(self, upload_id: str) -> str:
        return f"{self.tree.root}/{UPLOADS_DIR}/{upload_id_checked(upload_id)}"

    @staticmethod
    def _owner_mark(key: str) -> str:
        # The key's digest names an empty file in the upload's folder: one GETFILESTATUS tells
        # whether an upload id belongs to a key, whatever the key's length.
        return "key-" + hashlib.sha256(key.encode("utf-8")).hexdigest()

    async def _staging(self, key: str, upload_id: str) -> str:
        folder = self._upload_folder(upload_id)
        try:
            await self.tree.status(f"{folder}/{self._owner_mark(key)}")
        except RemoteFailure as exc:
            if exc.exception == "FileNotFoundException":
                raise UploadNotFound(f"{upload_id} is no upload of {key!r}") from None
            raise self.tree.error(exc, key) from None
        return folder

    async def create_multipart(self, key: str, attrs: WriteAttrs) -> str:
        dest = self.tree.target(key)
        await self.tree.require_root(key)
        try:  # fail now, not after all the parts
            if (await self.tree.status(dest)).is_dir:
                raise UnsupportedKey(f"{key!r}: a folder of that name exists")
        except RemoteFailure as exc:
            if exc.exception != "FileNotFoundException":
                raise self.tree.write_error(exc, key) from None
        upload_id = new_upload_id()
        mark = f"{self._upload_folder(upload_id)}/{self._owner_mark(key)}"
        await self.writes.upload(key, mark, _nothing(), 0, new_md5())
        return upload_id

    async def upload_part(
        self, key: str, upload_id: str, part_number: int, body: AsyncIterator[bytes], size: int
    ) -> PartInfo:
        check_part_number(part_number)
        folder = await self._staging(key, upload_id)
        md5 = new_md5()
        temp = await self.writes.temp(key, body, size, md5)
        # Named by number and MD5: the complete finds exactly the part the client means, and a
        # part uploaded again is a new file beside the old one, never a torn one.
        part = f"{folder}/{part_number:05d}.{md5.hexdigest()}"
        try:
            await self.tree.http.call(
                "PUT", temp, "RENAME", idempotent=False, destination=part, renameoptions="OVERWRITE"
            )
        except RemoteFailure as exc:
            await self.writes.discard(temp)
            if exc.exception == "FileNotFoundException":
                raise UploadNotFound(f"{upload_id} was aborted") from None
            raise self.tree.error(exc, key) from None
        except BaseException:
            await self.writes.discard(temp)
            raise
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
        folder = await self._staging(key, upload_id)
        check_part_order(parts)
        dest = self.tree.target(key)
        # As put: checked before the join and, for if_match, again before the rename, which
        # is exclusive (the NameNode's rename without overwrite) for if_none_match.
        await self.writes.check(key, if_match, if_none_match)
        if any(not _MD5.match(bare(p.etag).lower()) for p in parts):
            raise InvalidPart("a part's ETag is no MD5")
        etag = multipart_etag([p.etag for p in parts])
        # A completion that failed after joining left the joined file under this name: a retry
        # with the same parts goes on from there.
        joined = f"{folder}/joined-{bare(etag)}"
        try:
            held = {s.name: s for s in await self.tree.children(folder)}
        except RemoteFailure as exc:
            raise self.tree.error(exc, key) from None
        if joined.rsplit("/", 1)[1] not in held:
            files = []
            for p in parts:
                name = f"{p.part_number:05d}.{bare(p.etag).lower()}"
                if name not in held:
                    raise InvalidPart(f"part {p.part_number} with ETag {p.etag} was not uploaded")
                files.append(f"{folder}/{name}")
            await self._join(key, [f for f in files if held[f.rsplit("/", 1)[1]].length], joined)
        info = await self.writes.seal(key, joined, etag, attrs, tuple(p.size for p in parts))
        if if_match is not None:
            await self.writes.check(key, if_match, False)
        await self.writes.place(key, joined, dest, exclusive=if_none_match)
        # After the rename: a crash in between leaves only hidden staging files behind.
        await self.writes.discard(folder, recursive=True)
        return info

    async def _join(self, key: str, files: list[str], joined: str) -> None:
        """CONCAT the non-empty parts into the first (HDFS takes no empty sources), renamed."""
        try:
            if not files:
                await self.writes.upload(key, joined, _nothing(), 0, new_md5())
                return
            if len(files) > 1:
                await self.tree.http.call(
                    "POST", files[0], "CONCAT", idempotent=False, sources=",".join(files[1:])
                )
            await self.tree.http.call(
                "PUT",
                files[0],
                "RENAME",
                idempotent=False,
                destination=joined,
                renameoptions="OVERWRITE",
            )
        except RemoteFailure as exc:
            raise self.tree.error(exc, key) from None

    async def abort_multipart(self, key: str, upload_id: str) -> None:
        try:
            folder = await self._staging(key, upload_id)
        except UploadNotFound:
            return
        await self.writes.discard(folder, recursive=True)
