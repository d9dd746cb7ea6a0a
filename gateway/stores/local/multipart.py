"""Multipart uploads of the file store: parts staged under `<root>/.s3gw-uploads/<id>/`, joined
into a temp file beside the object and renamed into place in one step."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Sequence

import anyio.to_thread

from gateway.stores.base import (
    InvalidPart,
    ObjectInfo,
    PartInfo,
    UnsupportedKey,
    UploadNotFound,
    WriteAttrs,
)
from gateway.stores.etags import bare, check_part_number, check_part_order, multipart_etag, new_md5
from gateway.stores.file_meta import UPLOADS_DIR, load, new_upload_id, temp_name, upload_id_checked
from gateway.stores.local.files import Temp, copy_step, discard, new_temp, place, receive, seal
from gateway.stores.local.tree import Tree
from gateway.stores.local.writes import Writes

_KEY_FILE = "key"


def _part_name(number: int) -> str:
    return f"{number:05d}"


class Uploads:
    """Multipart uploads of the file store, by the Store's method names (attrs are taken at
    completion, when the object appears); the object a completion makes is placed as `Writes`
    places a put's."""

    def __init__(self, tree: Tree, writes: Writes) -> None:
        self.tree, self.writes = tree, writes

    def _uploads(self) -> str:
        return os.path.join(self.tree.root, UPLOADS_DIR)

    def _staging(self, key: str, upload_id: str) -> str:
        """The staging folder of an upload of `key`; UploadNotFound for any other id."""
        folder = os.path.join(self._uploads(), upload_id_checked(upload_id))
        try:
            with open(os.path.join(folder, _KEY_FILE), "rb") as f:
                owner = f.read()
        except (FileNotFoundError, NotADirectoryError):
            raise UploadNotFound(upload_id) from None
        except OSError as exc:
            raise self.tree.os_error(exc, key) from None
        if owner != key.encode("utf-8", "surrogatepass"):
            raise UploadNotFound(f"{upload_id} is no upload of {key!r}")
        return folder

    async def create_multipart(self, key: str, attrs: WriteAttrs) -> str:
        return await anyio.to_thread.run_sync(self._create_sync, key)

    def _create_sync(self, key: str) -> str:
        self._room_for(key, self.tree.target(key))  # fail now, not after all the parts
        upload_id = new_upload_id()
        folder = os.path.join(self._uploads(), upload_id)
        try:
            os.makedirs(self._uploads(), exist_ok=True)
            os.mkdir(folder)
            fd = os.open(
                os.path.join(folder, _KEY_FILE), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666
            )
            try:
                os.write(fd, key.encode("utf-8"))
            finally:
                os.close(fd)
        except OSError as exc:
            raise self.tree.os_error(exc, key) from None
        return upload_id

    @staticmethod
    def _room_for(key: str, dest: str) -> None:
        """UnsupportedKey if a folder stands at `dest` (a file where a folder is needed is
        moved into it when the upload completes: tree.make_folder)."""
        if os.path.isdir(dest):
            raise UnsupportedKey(f"{key!r}: a folder of that name exists")

    # -- parts -------------------------------------------------------------------------------

    async def upload_part(
        self, key: str, upload_id: str, part_number: int, body: AsyncIterator[bytes], size: int
    ) -> PartInfo:
        check_part_number(part_number)
        folder = await anyio.to_thread.run_sync(self._staging, key, upload_id)
        dest = os.path.join(folder, _part_name(part_number))
        temp = await anyio.to_thread.run_sync(self._part_temp, folder, dest, upload_id)
        try:
            assert temp.fd is not None
            md5 = new_md5()
            await receive(temp.fd, body, size, md5, key)
            etag = f'"{md5.hexdigest()}"'
            await anyio.to_thread.run_sync(self._place_part, upload_id, temp, dest, etag)
            return PartInfo(part_number, etag, size)
        finally:
            await discard(temp)

    def _part_temp(self, folder: str, dest: str, upload_id: str) -> Temp:
        path = os.path.join(folder, temp_name(os.path.basename(dest)))
        try:
            return new_temp(self.tree.root, path)
        except FileNotFoundError:
            raise UploadNotFound(f"{upload_id} was aborted") from None
        except OSError as exc:
            raise self.tree.os_error(exc, upload_id) from None

    @staticmethod
    def _place_part(upload_id: str, temp: Temp, dest: str, etag: str) -> None:
        seal(temp, "", etag, WriteAttrs())
        try:
            place(temp, dest)  # a part uploaded again replaces the old one at once
        except FileNotFoundError:
            raise UploadNotFound(f"{upload_id} was aborted") from None

    # -- complete and abort ------------------------------------------------------------------

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
        folder = await anyio.to_thread.run_sync(self._staging, key, upload_id)
        check_part_order(parts)
        dest = await anyio.to_thread.run_sync(self.tree.target, key)
        # As put: checked before the parts are joined and again at the rename, which is
        # exclusive (link) for if_none_match.
        await anyio.to_thread.run_sync(self.writes.check, key, dest, if_match, if_none_match)
        temp = await anyio.to_thread.run_sync(self.writes.make_temp, key, dest)
        try:
            offset = 0
            sizes = []
            for part in parts:
                sizes.append(await self._append_part(folder, part, temp, offset))
                offset += sizes[-1]
            etag = multipart_etag([p.etag for p in parts])
            info = await anyio.to_thread.run_sync(
                self._finish, key, temp, dest, etag, attrs, tuple(sizes), if_match, if_none_match
            )
        finally:
            await discard(temp)
        # After the rename: a crash in between leaves only staging files behind, never a
        # visible half object.
        await anyio.to_thread.run_sync(shutil.rmtree, folder, True)
        return info

    async def _append_part(self, folder: str, part: PartInfo, temp: Temp, offset: int) -> int:
        """Copy one part to the end of `temp`, checking it is the part the client means."""
        assert temp.fd is not None
        path = os.path.join(folder, _part_name(part.part_number))
        try:
            fd = await anyio.to_thread.run_sync(os.open, path, os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, ValueError):
            raise InvalidPart(f"part {part.part_number} was not uploaded") from None
        try:
            s = os.fstat(fd)
            meta = load(fd, s)
            if meta is not None and bare(meta.etag) != bare(part.etag):
                raise InvalidPart(f"part {part.part_number} has ETag {meta.etag}, not {part.etag}")
            # Without xattrs, the part's MD5 is taken again while it is copied.
            md5 = None if meta is not None else new_md5()
            done = 0
            while done < s.st_size:
                step = await anyio.to_thread.run_sync(
                    copy_step, fd, temp.fd, done, offset + done, s.st_size - done, md5
                )
                if step == 0:
                    raise InvalidPart(f"part {part.part_number} shrank while being joined")
                done += step
            if md5 is not None and md5.hexdigest() != bare(part.etag):
                raise InvalidPart(f"part {part.part_number} does not have ETag {part.etag}")
            return done
        finally:
            os.close(fd)  # inline: an await here could be cancelled and leak the fd

    def _finish(
        self,
        key: str,
        temp: Temp,
        dest: str,
        etag: str,
        attrs: WriteAttrs,
        sizes: tuple[int, ...],
        if_match: str | None,
        if_none_match: bool,
    ) -> ObjectInfo:
        info = seal(temp, key, etag, attrs, sizes)
        self.writes.check(key, dest, if_match, False)
        self.writes.place(key, temp, dest, exclusive=if_none_match)
        return info

    async def abort_multipart(self, key: str, upload_id: str) -> None:
        try:
            folder = await anyio.to_thread.run_sync(self._staging, key, upload_id)
        except UploadNotFound:
            return
        await anyio.to_thread.run_sync(shutil.rmtree, folder, True)
