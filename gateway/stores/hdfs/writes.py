"""Writes of the hdfs:// store. A new object is written (CREATE in two steps) to a hidden temp
file under `<root>/.s3gw-tmp/`, sealed (ETag and attributes in the `user.s3gw.meta` xattr) and
renamed into place with RENAME `renameoptions=OVERWRITE`, one atomic step in the NameNode, so a
failure leaves nothing half-visible. Multipart uploads (`multipart`) end the same way."""

from __future__ import annotations

import base64
import secrets
from collections.abc import AsyncIterator
from typing import Any

import anyio

from gateway.stores.base import (
    ContainerExists,
    ContainerNotEmpty,
    ContainerNotFound,
    IncompleteBody,
    MetadataTooLarge,
    ObjectInfo,
    ObjectNotFound,
    PreconditionFailed,
    StoreError,
    StoreUnavailable,
    UnsupportedKey,
    VersionChanged,
    WriteAttrs,
    WriteConflict,
    one_version,
)
from gateway.stores.etags import bare, new_md5
from gateway.stores.file_meta import XATTR, StoredMeta, encode, is_internal
from gateway.stores.hdfs.client import RemoteFailure, Status
from gateway.stores.hdfs.listing import list_page
from gateway.stores.hdfs.tree import MAX_XATTR, Tree

TMP_DIR = ".s3gw-tmp"


class _Body:
    """A body streamed to a DataNode: counted, hashed, and its last chunk held back until the
    source has ended cleanly with exactly `size` bytes, so a failing body never arrives whole."""

    def __init__(self, source: AsyncIterator[bytes], size: int, md5: Any, key: str) -> None:
        self.source, self.size, self.md5, self.key = source, size, md5, key
        self.error: BaseException | None = None
        self.held, self.total, self.ended = b"", 0, False
        self.started = False  # the DataNode request began: it may have created the file

    async def _next(self) -> bytes | None:
        try:
            chunk = await anext(self.source)
        except StopAsyncIteration:
            if self.total != self.size:
                raise IncompleteBody(
                    f"{self.key}: the body ended after {self.total} bytes of {self.size}"
                ) from None
            return None
        self.total += len(chunk)
        if self.total > self.size:
            raise IncompleteBody(f"{self.key}: the body is longer than {self.size} bytes")
        self.md5.update(chunk)
        return chunk

    async def prime(self) -> None:
        """Take the first chunk before any request, so that a body failing at once (or empty
        when it should not be) fails the write before the DataNode creates anything."""
        try:
            first = await self._next()
        except BaseException as exc:
            self.error = exc
            raise
        self.held, self.ended = first or b"", first is None

    async def stream(self) -> AsyncIterator[bytes]:
        self.started = True
        try:
            while not self.ended:
                chunk = await self._next()
                if chunk is None:
                    break
                if self.held:
                    yield self.held
                self.held = chunk
        except BaseException as exc:
            self.error = exc
            raise
        if self.held:
            yield self.held


class Writes:
    """put, copy, delete and buckets of the hdfs:// store, and the steps every write takes (a
    temp file, sealed, renamed into place), which its multipart uploads take too."""

    def __init__(self, tree: Tree) -> None:
        self.tree = tree

    # -- the steps of every write --------------------------------------------------------------

    async def upload(
        self, key: str, path: str, body: AsyncIterator[bytes], size: int, md5: Any
    ) -> None:
        """CREATE: ask the NameNode where, then stream the bytes to that DataNode."""
        await self._send_body(key, path, _Body(body, size, md5, key))

    async def _send_body(self, key: str, path: str, wrapped: _Body) -> None:
        await wrapped.prime()
        try:
            location = await self.tree.http.redirect("PUT", path, "CREATE", overwrite="false")
            size = wrapped.size
            headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
            await self.tree.http.send(
                "PUT", location, None, idempotent=False, content=wrapped.stream(), headers=headers
            )
        except RemoteFailure as exc:
            raise self.tree.write_error(exc, key) from None
        except Exception:
            if wrapped.error is not None:
                raise wrapped.error from None  # the body's own failure, not the cut it caused
            raise

    async def temp(self, key: str, body: AsyncIterator[bytes], size: int, md5: Any) -> str:
        temp = f"{self.tree.root}/{TMP_DIR}/.s3gw-{secrets.token_urlsafe(12)}"
        wrapped = _Body(body, size, md5, key)
        try:
            await self._send_body(key, temp, wrapped)
        except BaseException:
            if wrapped.started:
                await self.discard(temp, late=True)
            raise
        return temp

    async def discard(self, path: str, recursive: bool = False, late: bool = False) -> None:
        """Remove a temp file or folder; shielded, so a cancelled write still cleans up.

        `late`: a DataNode may create the file only after our upload broke off (it creates it
        when the headers arrive, and closes it with what came when the connection drops), so a
        DELETE that found nothing is tried again shortly. Without a server the file stays,
        hidden under .s3gw-tmp."""
        with anyio.move_on_after(5, shield=True):
            for wait in (0.0, 0.1, 0.4) if late else (0.0,):
                await anyio.sleep(wait)
                try:
                    gone = await self.tree.http.call(
                        "DELETE", path, "DELETE", once=True, recursive=str(recursive).lower()
                    )
                except (StoreError, RemoteFailure):
                    return
                if (gone or {}).get("boolean"):
                    return

    async def seal(
        self, key: str, temp: str, etag: str, attrs: WriteAttrs, parts: tuple[int, ...] = ()
    ) -> ObjectInfo:
        """Record ETag and attributes (and the sizes of the parts it was joined from) on the
        finished file, for the length and mtime it has."""
        status = await self._call_status(temp, key)
        if sum(parts) != status.length:
            parts = ()
        meta = StoredMeta(etag, status.length, status.mtime_ms * 10**6, attrs, parts)
        await self.save_meta(temp, key, meta)
        return self.tree.info(key, status, meta if self.tree.xattrs else None)

    async def save_meta(self, path: str, key: str, meta: StoredMeta) -> None:
        """Record `meta` in the file's xattr (unless the server keeps none)."""
        if self.tree.xattrs:
            raw = encode(meta)
            # HDFS counts the name without its namespace, and the value's bytes.
            size = len(XATTR.removeprefix("user.")) + len(raw)
            if size > MAX_XATTR:
                raise MetadataTooLarge(
                    f"as stored they take {size} bytes, and HDFS keeps at most {MAX_XATTR} in an"
                    " extended attribute (dfs.namenode.fs-limits.max-xattr-size)"
                )
            value = "0s" + base64.b64encode(raw).decode("ascii")
            try:
                xattr = {"xattr.name": XATTR, "xattr.value": value, "flag": "CREATE,REPLACE"}
                await self.tree.http.call("PUT", path, "SETXATTR", query=xattr)
            except RemoteFailure as exc:
                self.tree.xattrs_refused(exc)
                if self.tree.xattrs:  # refused for this value (too large): losing it would lie
                    raise StoreError(f"{key}: attributes not kept: {exc.message}") from None

    async def _call_status(self, path: str, key: str) -> Status:
        try:
            return await self.tree.status(path)
        except RemoteFailure as exc:
            raise self.tree.write_error(exc, key) from None

    async def place(self, key: str, temp: str, dest: str, *, exclusive: bool) -> None:
        """Rename into place: replacing any previous version in one step, or (exclusive) only
        if nothing is there, which the NameNode decides atomically."""
        for attempt in range(3):
            try:
                await self.tree.http.call("PUT", dest.rsplit("/", 1)[0] or "/", "MKDIRS")
                done = await self.tree.http.call(
                    "PUT",
                    temp,
                    "RENAME",
                    idempotent=False,
                    destination=dest,
                    renameoptions="NONE" if exclusive else "OVERWRITE",
                )
            except RemoteFailure as exc:
                if "destination parent" in exc.message and attempt < 2:
                    continue  # a delete pruned the folder between MKDIRS and RENAME
                raise self.tree.write_error(exc, key, exclusive=exclusive) from None
            if done is not None:  # a server that ignores renameoptions answered a plain rename
                await self._old_rename(key, temp, dest, bool(done.get("boolean")), exclusive)
            return

    async def _old_rename(
        self, key: str, temp: str, dest: str, renamed: bool, exclusive: bool
    ) -> None:
        """Servers without rename options: plain RENAME refuses to replace, so an overwrite is
        DELETE then RENAME, and readers may miss the key for that one round trip."""
        if renamed:
            if not (await self._call_status(dest, key)).is_file:
                # Renamed *into* a folder of that name: take the hidden temp back out.
                await self.discard(f"{dest}/{temp.rsplit('/', 1)[1]}")
                raise UnsupportedKey(f"{key!r}: a folder of that name exists")
            return
        if exclusive:
            raise PreconditionFailed(f"{key} exists")
        try:
            await self.tree.http.call("DELETE", dest, "DELETE", recursive="false")
            again = await self.tree.http.call(
                "PUT", temp, "RENAME", idempotent=False, destination=dest
            )
        except RemoteFailure as exc:
            raise self.tree.write_error(exc, key) from None
        if not (again or {}).get("boolean"):
            raise StoreUnavailable(f"{key}: another writer took the name during the overwrite")

    async def check(self, key: str, if_match: str | None, if_none_match: bool) -> None:
        if if_match is None and not if_none_match:
            return
        try:
            current: str | None = (await self.tree.stat_path(key))[1].etag
        except ObjectNotFound:
            current = None
        if if_none_match and current is not None:
            raise PreconditionFailed(f"{key} exists")
        if if_match is not None and (current is None or bare(current) != bare(if_match)):
            raise PreconditionFailed(f"{key} is {current or 'missing'}, not {if_match}")

    # -- put, copy, delete ---------------------------------------------------------------------

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
        dest = self.tree.target(key)
        await self.tree.require_root(key)
        # Checked before the body is read, so a doomed write fails before its upload, and again
        # before the rename. if_none_match is atomic (rename without overwrite); if_match keeps
        # a window of one round trip against other writers.
        await self.check(key, if_match, if_none_match)
        md5 = new_md5()
        temp = await self.temp(key, body, size, md5)
        try:
            return await self.finish(
                key, temp, dest, f'"{md5.hexdigest()}"', attrs, if_match=if_match,
                exclusive=if_none_match,
            )  # fmt: skip
        except PreconditionFailed as exc:
            # The condition held before the body: another write landed during this one.
            raise WriteConflict(str(exc)) from None

    async def finish(
        self,
        key: str,
        temp: str,
        dest: str,
        etag: str,
        attrs: WriteAttrs,
        *,
        if_match: str | None = None,
        exclusive: bool = False,
    ) -> ObjectInfo:
        placed = False
        try:
            info = await self.seal(key, temp, etag, attrs)
            await self.check(key, if_match, False)
            await self.place(key, temp, dest, exclusive=exclusive)
            placed = True
            return info
        finally:
            if not placed:
                await self.discard(temp)

    async def copy(
        self,
        src_key: str,
        dst_key: str,
        attrs: WriteAttrs | None,
        *,
        if_match: str | None = None,
        version_id: str | None = None,
    ) -> ObjectInfo:
        one_version("hdfs", version_id)
        dest = self.tree.target(dst_key)
        status, info, known = await self.tree.stat_path(src_key)
        if if_match is not None and if_match != "*" and bare(if_match) != bare(info.etag):
            raise VersionChanged(f"{src_key}: is now {info.etag}, not {if_match}")
        # WebHDFS has no server-side copy: the bytes go DataNode -> gateway -> DataNode.
        response = await self.tree.open(src_key, 0, None) if status.length else None
        md5 = new_md5()

        async def source() -> AsyncIterator[bytes]:
            if response is not None:
                try:
                    async for chunk in response.aiter_bytes(1 << 20):
                        yield chunk
                except Exception as exc:  # httpx's read errors: the source broke off
                    raise StoreUnavailable(f"{src_key}: read broke off: {exc!r}") from None

        try:
            temp = await self.temp(dst_key, source(), status.length, md5)
        except IncompleteBody:
            raise VersionChanged(f"{src_key}: changed while being copied") from None
        finally:
            if response is not None:
                await response.aclose()
        # The copy is of one version: a source replaced or appended to meanwhile fails it.
        after = await self._call_status(self.tree.path(src_key), src_key)
        if after.version != status.version:
            await self.discard(temp)
            raise VersionChanged(f"{src_key}: changed while being copied")
        etag = info.etag if known else f'"{md5.hexdigest()}"'
        keep = attrs if attrs is not None else WriteAttrs.of(info)
        return await self.finish(dst_key, temp, dest, etag, keep)

    async def delete(self, key: str) -> None:
        try:
            path = self.tree.path(key)
        except ObjectNotFound:
            return  # no file can have this key, so none is there
        try:
            if not (await self.tree.status(path)).is_file:
                return  # a folder is no object
            await self.tree.http.call("DELETE", path, "DELETE", recursive="false")
        except RemoteFailure as exc:
            if exc.exception in ("FileNotFoundException", "ParentNotDirectoryException"):
                return
            raise self.tree.error(exc, key) from None
        # S3 has no folders: remove the ones this delete left empty, up to the first in use.
        folder = path.rsplit("/", 1)[0]
        while len(folder) > len(self.tree.root):
            try:
                gone = await self.tree.http.call("DELETE", folder, "DELETE", recursive="false")
            except (RemoteFailure, StoreError):
                return  # not empty, or a put is about to fill it
            if not (gone or {}).get("boolean"):
                return
            folder = folder.rsplit("/", 1)[0]

    # -- folders as buckets ----------------------------------------------------------------------

    async def create_container(self) -> None:
        if not self.tree.root:
            raise ValueError("the HDFS root is no bucket")
        try:
            await self.tree.status(self.tree.root)
            raise ContainerExists(f"{self.tree!r} exists")
        except RemoteFailure as exc:
            if exc.exception != "FileNotFoundException":
                raise self.tree.write_error(exc, "") from None
        try:
            await self.tree.http.call("PUT", self.tree.root, "MKDIRS")
        except RemoteFailure as exc:
            raise self.tree.write_error(exc, "") from None

    async def delete_container(self) -> None:
        if not self.tree.root:
            raise ValueError("the HDFS root is no bucket")
        try:
            if not (await self.tree.status(self.tree.root)).is_dir:
                raise ContainerNotFound(f"{self.tree!r} is no folder")
        except RemoteFailure as exc:
            if exc.exception == "FileNotFoundException":
                raise ContainerNotFound(f"{self.tree!r} does not exist") from None
            raise self.tree.error(exc, "") from None
        if (await list_page(self.tree, "", None, "", 1)).objects:
            raise ContainerNotEmpty(f"{self.tree!r} holds objects")
        try:
            await self._remove_empty(self.tree.root)
        except RemoteFailure as exc:
            if exc.exception == "PathIsNotEmptyDirectoryException":
                raise ContainerNotEmpty(
                    f"{self.tree!r} gained objects while being deleted"
                ) from None
            raise self.tree.error(exc, "") from None

    async def _remove_empty(self, path: str) -> None:
        """Bottom-up, and only internals and folders: an object put since the check stops it."""
        for s in await self.tree.children(path):
            child = f"{path}/{s.name}"
            if is_internal(s.name):
                await self.tree.http.call("DELETE", child, "DELETE", recursive="true")
            elif s.is_dir:
                await self._remove_empty(child)
            else:
                raise ContainerNotEmpty(f"{self.tree!r} gained objects while being deleted")
        await self.tree.http.call("DELETE", path, "DELETE", recursive="false")
