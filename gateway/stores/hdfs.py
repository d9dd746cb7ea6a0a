"""The `hdfs://namenode:http-port/path` under-store over WebHDFS: a folder tree of an HDFS seen as
a bucket, as file:// sees a local one. The read half (stat, read, list, the metadata kept in
xattrs) lives here; the WebHDFS client in `hdfs_client`; the writes, and so the whole store, in
`hdfs_write` (multipart in `hdfs_multipart`)."""

from __future__ import annotations

import base64
import logging
import re
from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from datetime import UTC, datetime
from urllib.parse import SplitResult, unquote

import anyio
import httpx

from gateway.stores.base import (
    ListPage,
    ObjectInfo,
    ObjectNotFound,
    Store,
    StoreError,
    StoreUnavailable,
    VersionChanged,
    decode_token,
    encode_token,
)
from gateway.stores.hdfs_client import BACKOFF_BASE, BACKOFF_CAP, RemoteFailure, Status, WebHdfs
from gateway.stores.local_meta import XATTR, StoredMeta, bare, decode, guess_type, is_internal

# The client's names, importable from here as before it had a module of its own.
__all__ = ["BACKOFF_BASE", "BACKOFF_CAP", "CHUNK_SIZE", "DEFAULT_PORTS", "OPTIONS", "HdfsReads",
           "RemoteFailure", "Status", "WebHdfs", "open_hdfs"]  # fmt: skip

log = logging.getLogger("gateway.stores.hdfs")

CHUNK_SIZE = 512 * 1024
OPTIONS = frozenset(
    {"user", "delegation_token", "https", "max_attempts", "connect_timeout", "read_timeout",
     "retry_deadline"}
)  # fmt: skip
DEFAULT_PORTS = {"http": 9870, "https": 9871}  # dfs.namenode.http(s)-address
_XATTRS_OFF = re.compile(r"xattrs\.enabled|GETXATTRS|SETXATTR")


class HdfsReads(Store):
    """stat, read and list of the hdfs:// store (`hdfs_write.HdfsStore` adds the writes).

    Objects are the files under `root` (an absolute HDFS path, "" for '/'); directories are
    common prefixes, empty ones invisible; the store's own `.s3gw…` names are never keys."""

    scheme = "hdfs"

    def __init__(self, base: str, root: str, options: Mapping[str, str]) -> None:
        unknown = set(options) - OPTIONS
        if unknown:
            raise ValueError(f"unknown hdfs store options: {', '.join(sorted(unknown))}")
        self.root = root.rstrip("/")
        self._http = WebHdfs(base, options)
        self._xattrs = True  # until the server says it keeps none
        self._root_seen = False

    def __repr__(self) -> str:
        return f"HdfsStore({self._http.base}{self.root or '/'})"

    async def close(self) -> None:
        await self._http.close()

    # -- keys, errors, metadata --------------------------------------------------------------

    def _path(self, key: str) -> str:
        """The HDFS path of `key`; ObjectNotFound for keys no HDFS file can have."""
        parts = key.split("/")
        # DFSUtil.isValidName: no '.', '..', ':' or empty components.
        if not key or "\0" in key or any(p in ("", ".", "..") or ":" in p or is_internal(p)
                                         for p in parts):  # fmt: skip
            raise ObjectNotFound(key)
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:
            raise ObjectNotFound(key) from None
        return f"{self.root}/{key}"

    def _error(self, exc: RemoteFailure, key: str) -> StoreError:
        return exc.store_error(key, f"{self!r} {key!r}")

    async def _missing(self, key: str) -> StoreError:
        """A miss is the key's, unless the mount's folder itself is gone (asked once)."""
        if not self._root_seen:
            try:
                root = await self._status(self.root or "/")
            except RemoteFailure as exc:
                if exc.exception != "FileNotFoundException":
                    return self._error(exc, key)
                return StoreUnavailable(f"{self!r}: the mount folder does not exist")
            if not root.is_dir:
                return StoreUnavailable(f"{self!r}: the mount path is no directory")
            self._root_seen = True
        return ObjectNotFound(key)

    async def _require_root(self, key: str) -> None:
        """StoreUnavailable unless the mount folder exists (a write would create it)."""
        error = await self._missing(key)
        if not isinstance(error, ObjectNotFound):
            raise error

    async def _status(self, path: str) -> Status:
        return Status.of((await self._http.call("GET", path, "GETFILESTATUS"))["FileStatus"])

    async def _meta(self, path: str) -> StoredMeta | None:
        """The ETag and attributes the gateway recorded in the file's xattr, if any."""
        if not self._xattrs:
            return None
        try:
            doc = await self._http.call("GET", path, "GETXATTRS", encoding="base64")
        except RemoteFailure as exc:
            self._xattrs_refused(exc)
            return None
        except StoreError:
            return None
        for xattr in (doc or {}).get("XAttrs", []):
            value = str(xattr.get("value") or "")
            if xattr.get("name") == XATTR and value.startswith("0s"):
                return decode(base64.b64decode(value[2:]))
        return None

    def _xattrs_refused(self, exc: RemoteFailure) -> None:
        # Disabled (dfs.namenode.xattrs.enabled=false) or an op this server does not know.
        if exc.status == 400 or _XATTRS_OFF.search(exc.message):
            if self._xattrs:
                log.warning("%r keeps no xattrs (%s): ETags are synthetic", self, exc.message)
            self._xattrs = False

    def _info(self, key: str, status: Status, meta: StoredMeta | None) -> ObjectInfo:
        # A recorded meta describes these bytes only while length and mtime are unchanged.
        if meta is not None and (meta.size, meta.mtime_ns) != (
            status.length,
            status.mtime_ms * 10**6,
        ):
            meta = None
        modified = datetime.fromtimestamp(status.mtime_ms / 1000, UTC)
        if meta is None:
            return ObjectInfo(
                key, status.length, status.synthetic_etag(), modified, guess_type(key)
            )
        a = meta.attrs
        return ObjectInfo(
            key, status.length, meta.etag, modified, a.content_type, a.content_encoding,
            a.content_disposition, a.content_language, a.cache_control, a.expires,
            dict(a.metadata), checksums=dict(a.checksums),
        )  # fmt: skip

    async def _stat_path(self, key: str) -> tuple[Status, ObjectInfo, bool]:
        """Status and info of `key`'s file, and whether its ETag was recorded (an MD5)."""
        path = self._path(key)
        metas: list[StoredMeta | None] = []

        async def fetch_meta() -> None:
            metas.append(await self._meta(path))

        failure: Exception | None = None
        # Both asked at once: a stat costs one round trip, not two. Failures are kept out of
        # the task group, which would wrap them in an ExceptionGroup.
        async with anyio.create_task_group() as tg:
            tg.start_soon(fetch_meta)
            try:
                status = await self._status(path)
            except (RemoteFailure, StoreError) as exc:
                failure = exc
        if isinstance(failure, RemoteFailure):
            if failure.exception == "FileNotFoundException":
                raise await self._missing(key)
            raise self._error(failure, key)
        if failure is not None:
            raise failure
        if not status.is_file:
            raise ObjectNotFound(key)
        info = self._info(key, status, metas[0] if metas else None)
        return status, info, info.etag != status.synthetic_etag()

    async def stat(self, key: str) -> ObjectInfo:
        return (await self._stat_path(key))[1]

    # -- reads -------------------------------------------------------------------------------

    async def _open(self, key: str, start: int, end: int | None) -> httpx.Response | None:
        """OPEN with offset/length, the redirect followed to the DataNode; None if the range
        starts at or past the end of the file."""
        params = {"offset": str(start)} if start > 0 else {}
        if end is not None:
            params["length"] = str(end - start)
        try:
            location = await self._http.redirect("GET", self._path(key), "OPEN", **params)
            return await self._http.send("GET", location, None, idempotent=True, stream=True)
        except RemoteFailure as exc:
            # The NameNode refuses offsets at or past the end ("Offset=… out of the range"), a
            # DataNode seeks past the end of an empty file with EOFException.
            if exc.exception == "EOFException" or exc.message.startswith("Offset="):
                return None
            if exc.exception == "FileNotFoundException":
                raise await self._missing(key) from None
            raise self._error(exc, key) from None

    async def read(
        self, key: str, start: int = 0, end: int | None = None, if_match: str | None = None
    ) -> AsyncGenerator[bytes, None]:
        start = max(start, 0)
        before: Status | None = None
        if if_match is not None or (end is not None and end <= start):
            # No bytes to send, or a version to check: the stat reports misses and changes.
            before, info, _ = await self._stat_path(key)
            if if_match is not None and if_match != "*" and bare(if_match) != bare(info.etag):
                raise VersionChanged(f"{key}: is now {info.etag}, not {if_match}")
            if (end is not None and end <= start) or start >= before.length:
                return
        response = await self._open(key, start, end)
        if response is None:
            return
        try:
            if before is not None:
                # OPEN carries no version: if the file is still the one stat saw now that the
                # DataNode has opened it, the bytes are that version's (renames make new files).
                try:
                    after = await self._status(self._path(key))
                except RemoteFailure:
                    after = None
                if after is None or after.version != before.version:
                    raise VersionChanged(f"{key}: changed before it could be read")
            async for chunk in response.aiter_bytes(CHUNK_SIZE):
                yield chunk
        except httpx.TransportError as exc:
            raise StoreUnavailable(f"{key}: the read broke off: {type(exc).__name__}") from None
        finally:
            await response.aclose()

    # -- listing -----------------------------------------------------------------------------

    async def _children(self, path: str) -> list[Status]:
        """A directory's entries, batch by batch (LISTSTATUS_BATCH, startAfter); [] if gone."""
        found: list[Status] = []
        after = ""
        while True:
            params = {"startAfter": after} if after else {}
            try:
                doc = await self._http.call("GET", path or "/", "LISTSTATUS_BATCH", query=params)
            except RemoteFailure as exc:
                if exc.exception == "FileNotFoundException" and path == self.root:
                    raise StoreUnavailable(f"{self!r}: the mount folder does not exist") from None
                if exc.exception == "FileNotFoundException":
                    return []  # removed while we walked
                if exc.status != 400 or "LISTSTATUS_BATCH" not in exc.message:
                    raise
                # A server older than LISTSTATUS_BATCH (Hadoop 2.8): the whole directory at once.
                doc = await self._http.call("GET", path or "/", "LISTSTATUS")
                return [Status.of(e) for e in doc["FileStatuses"]["FileStatus"]]
            listing = doc["DirectoryListing"]
            batch = [Status.of(e) for e in listing["partialListing"]["FileStatuses"]["FileStatus"]]
            found += batch
            if not batch or not listing.get("remainingEntries"):
                return found
            after = batch[-1].name

    async def list_page(
        self,
        prefix: str = "",
        delimiter: str | None = None,
        token: str | None = None,
        start_after: str | None = None,
        max_keys: int = 1000,
    ) -> ListPage:
        marker = start_after or ""
        if token:
            marker = max(marker, decode_token(token))
        if max_keys <= 0:
            return ListPage([], [], None)
        try:
            found = await self._walk(_Walk(self, prefix, delimiter or None, marker), max_keys)
        except RemoteFailure as exc:
            raise self._error(exc, prefix) from None
        more, found = len(found) > max_keys, found[:max_keys]
        objects = await self._infos([(key, s) for key, s in found if s is not None])
        prefixes = [key for key, s in found if s is None]
        return ListPage(objects, prefixes, encode_token(found[-1][0]) if more else None)

    async def _walk(self, walk: _Walk, limit: int) -> list[tuple[str, Status | None]]:
        """Up to limit + 1 entries after the marker: (key, status) of objects, (prefix, None)."""
        found: list[tuple[str, Status | None]] = []
        last = ""
        async with aclosing(walk.items("", self.root)) as items:
            async for key, status, folder in items:
                if status is not None and (cp := walk.rollup(key)) is not None:
                    key, status = cp, None
                if key == last or key <= walk.marker:
                    continue
                if folder is not None and not await walk.any_file(folder):
                    continue  # an empty directory is no prefix
                found.append((key, status))
                last = key
                if len(found) > limit:
                    break
        return found

    async def _infos(self, files: list[tuple[str, Status]]) -> list[ObjectInfo]:
        """Infos of listed files, their xattrs fetched 16 at a time (one ETag per version)."""
        metas: dict[str, StoredMeta | None] = {}
        limit = anyio.Semaphore(16)

        async def fetch(key: str) -> None:
            async with limit:
                metas[key] = await self._meta(f"{self.root}/{key}")

        if self._xattrs:
            async with anyio.create_task_group() as tg:
                for key, _ in files:
                    tg.start_soon(fetch, key)
        return [self._info(key, status, metas.get(key)) for key, status in files]


class _Walk:
    """A depth-first walk of the tree in S3 key order (UTF-8 bytes), pruned by prefix, marker and
    delimiter. HDFS lists children in *signed*-byte order, so each directory is sorted here."""

    def __init__(self, store: HdfsReads, prefix: str, delimiter: str | None, marker: str):
        self.store, self.prefix, self.delimiter, self.marker = store, prefix, delimiter, marker

    def rollup(self, key: str) -> str | None:
        """The common prefix `key` rolls up into, if any."""
        if self.delimiter is None or not key.startswith(self.prefix):
            return None
        at = key.find(self.delimiter, len(self.prefix))
        return None if at < 0 else key[: at + len(self.delimiter)]

    async def items(
        self, dir_key: str, path: str
    ) -> AsyncGenerator[tuple[str, Status | None, str | None], None]:
        """(key, status, None) of files; (common prefix, None, path) of a directory all of
        whose keys roll up into that prefix."""
        entries = []
        for s in await self.store._children(path):
            if not s.name or is_internal(s.name) or not (s.is_file or s.is_dir):
                continue  # symlinks are not followed
            key = f"{dir_key}{s.name}/" if s.is_dir else dir_key + s.name
            if not key.startswith(self.prefix) and not (s.is_dir and self.prefix.startswith(key)):
                continue
            # Whatever lies wholly at or before the marker is pruned, subtrees included.
            if key <= self.marker and not (s.is_dir and self.marker.startswith(key)):
                continue
            entries.append((key, s))
        entries.sort(key=lambda e: e[0])  # code point order is UTF-8 byte order
        for key, s in entries:
            if s.is_file:
                yield key, s, None
            elif (cp := self.rollup(key)) is not None:
                yield cp, None, f"{path}/{s.name}"
            else:
                async with aclosing(self.items(key, f"{path}/{s.name}")) as inner:
                    async for item in inner:
                        yield item

    async def any_file(self, path: str) -> bool:
        """Whether a file lies anywhere below `path` (depth-first, stopping at the first)."""
        children = [s for s in await self.store._children(path) if not is_internal(s.name)]
        if any(s.is_file for s in children):
            return True
        for s in children:
            if s.is_dir and await self.any_file(f"{path}/{s.name}"):
                return True
        return False


def open_hdfs(parts: SplitResult, options: Mapping[str, str]) -> Store:
    """`hdfs://namenode[:http-port]/path` (also `webhdfs://`): the NameNode's WebHDFS address."""
    if not parts.hostname:
        raise ValueError(f"hdfs URI {parts.geturl()!r} needs a NameNode: hdfs://host:port/path")
    https = options.get("https", "false").lower()
    if https not in ("true", "false"):
        raise ValueError(f"hdfs store option https must be true or false, not {https!r}")
    scheme = "https" if https == "true" else "http"
    try:
        port = parts.port or DEFAULT_PORTS[scheme]
    except ValueError as exc:
        raise ValueError(f"hdfs URI {parts.geturl()!r}: {exc}") from None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    root = unquote(parts.path)
    if "\0" in root or any(p in (".", "..") for p in root.split("/")):
        raise ValueError(f"hdfs URI {parts.geturl()!r} has a path HDFS cannot hold")
    for name, kind in (("max_attempts", int), ("connect_timeout", float),
                       ("read_timeout", float), ("retry_deadline", float)):  # fmt: skip
        try:
            kind(options.get(name, "1"))
        except ValueError:
            raise ValueError(f"hdfs store option {name} must be a number") from None
    from gateway.stores.hdfs_write import HdfsStore  # it builds on this module

    return HdfsStore(f"{scheme}://{host}:{port}", "/" + root.strip("/"), options)
