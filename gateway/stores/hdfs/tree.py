"""The mount's folder of an HDFS over WebHDFS (the client in `client`): keys to paths within
HDFS's limits, file statuses and the metadata kept in xattrs to ObjectInfo, and RemoteException
answers to the typed store errors."""

from __future__ import annotations

import base64
import logging
import re
from collections.abc import Mapping
from datetime import UTC, datetime

import anyio
import httpx

from gateway.stores.base import (
    KeyTooLong,
    ObjectInfo,
    ObjectNotFound,
    PreconditionFailed,
    StoreError,
    StoreUnavailable,
    UnsupportedKey,
)
from gateway.stores.file_meta import (
    XATTR,
    StoredMeta,
    decode,
    guess_type,
    is_internal,
    recorded_info,
)
from gateway.stores.hdfs.client import RemoteFailure, Status, WebHdfs
from gateway.stores.retry import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)

OPTIONS = frozenset(
    {
        "user",
        "delegation_token",
        "https",
        "max_attempts",
        "connect_timeout",
        "read_timeout",
        "retry_deadline",
    }
)
# HDFS's limits: a path name's UTF-8 bytes (dfs.namenode.fs-limits.max-component-length, by
# default), a path's characters and depth (HdfsServerConstants), and an xattr's name and
# value together (dfs.namenode.fs-limits.max-xattr-size, by default).
MAX_NAME, MAX_PATH, MAX_DEPTH, MAX_XATTR = 255, 8000, 1000, 16384
_XATTRS_OFF = re.compile(r"xattrs\.enabled|GETXATTRS|SETXATTR")
# A key HDFS refuses for its shape, not for the state of the namespace.
_BAD_NAMES = {
    "PathComponentTooLongException",
    "MaxDirectoryItemsExceededException",
    "InvalidPathException",
    "HadoopIllegalArgumentException",
}


class Tree:
    """The mount's folder of an HDFS, as the readers, writers and uploads of the store see it.

    Objects are the files under `root` (an absolute HDFS path, "" for '/'); directories are
    common prefixes, empty ones invisible; the store's own `.s3gw…` names are never keys."""

    def __init__(
        self, base: str, root: str, options: Mapping[str, str], clock: Clock = SYSTEM_CLOCK
    ) -> None:
        unknown = set(options) - OPTIONS
        if unknown:
            raise ValueError(f"unknown hdfs store options: {', '.join(sorted(unknown))}")
        self.root = root.rstrip("/")
        self.http = WebHdfs(base, options, clock)
        self.xattrs = True  # until the server says it keeps none
        self.root_seen = False

    def __repr__(self) -> str:
        return f"HdfsStore({self.http.base}{self.root or '/'})"

    # -- keys, errors, metadata --------------------------------------------------------------

    def path(self, key: str) -> str:
        """The HDFS path of `key`; ObjectNotFound for keys no HDFS file can have."""
        parts = key.split("/")
        if not key or "\0" in key or any(_bad_name(p) for p in parts):
            raise ObjectNotFound(key)
        try:
            longest = max(len(p.encode("utf-8")) for p in parts)
        except UnicodeEncodeError:
            raise ObjectNotFound(key) from None
        if longest > MAX_NAME:
            raise KeyTooLong(
                f"a name in it is {longest} bytes, and HDFS holds names of at most {MAX_NAME}"
                " bytes (dfs.namenode.fs-limits.max-component-length)"
            )
        path = f"{self.root}/{key}"
        if len(path) > MAX_PATH or path.count("/") > MAX_DEPTH:
            raise KeyTooLong(
                f"with the mount's folder its path is {len(path)} characters in"
                f" {path.count('/')} folders, and HDFS holds paths of at most {MAX_PATH}"
                f" characters in {MAX_DEPTH}"
            )
        return path

    def target(self, key: str) -> str:
        """The HDFS path a write of `key` takes; UnsupportedKey for keys no file can have."""
        try:
            return self.path(key)
        except ObjectNotFound:
            raise UnsupportedKey(f"an HDFS file cannot have the key {key!r}") from None

    def write_error(self, exc: RemoteFailure, key: str, *, exclusive: bool = False) -> StoreError:
        """As error(), for writes: a name taken or of the wrong shape is the key's fault."""
        if exc.exception == "FileAlreadyExistsException":
            if exclusive:
                return PreconditionFailed(f"{key} exists")
            return UnsupportedKey(f"{key!r}: a file stands where a folder is needed, or reverse")
        if exc.exception == "ParentNotDirectoryException" or exc.exception in _BAD_NAMES:
            return UnsupportedKey(f"{key!r}: {exc.message}")
        if "must both be" in exc.message or "directory is not empty" in exc.message:
            return UnsupportedKey(f"{key!r}: a folder of that name exists")
        return self.error(exc, key)

    def error(self, exc: RemoteFailure, key: str) -> StoreError:
        return exc.store_error(key, f"{self!r} {key!r}")

    async def missing(self, key: str) -> StoreError:
        """A miss is the key's, unless the mount's folder itself is gone (asked once)."""
        if not self.root_seen:
            try:
                root = await self.status(self.root or "/")
            except RemoteFailure as exc:
                if exc.exception != "FileNotFoundException":
                    return self.error(exc, key)
                return StoreUnavailable(f"{self!r}: the mount folder does not exist")
            if not root.is_dir:
                return StoreUnavailable(f"{self!r}: the mount path is no directory")
            self.root_seen = True
        return ObjectNotFound(key)

    async def require_root(self, key: str) -> None:
        """StoreUnavailable unless the mount folder exists (a write would create it)."""
        error = await self.missing(key)
        if not isinstance(error, ObjectNotFound):
            raise error

    async def status(self, path: str) -> Status:
        return Status.of((await self.http.call("GET", path, "GETFILESTATUS"))["FileStatus"])

    async def meta(self, path: str) -> StoredMeta | None:
        """The ETag and attributes the gateway recorded in the file's xattr, if any."""
        if not self.xattrs:
            return None
        try:
            doc = await self.http.call("GET", path, "GETXATTRS", encoding="base64")
        except RemoteFailure as exc:
            self.xattrs_refused(exc)
            return None
        except StoreError:
            return None
        for xattr in (doc or {}).get("XAttrs", []):
            value = str(xattr.get("value") or "")
            if xattr.get("name") == XATTR and value.startswith("0s"):
                return decode(base64.b64decode(value[2:]))
        return None

    def xattrs_refused(self, exc: RemoteFailure) -> None:
        # Disabled (dfs.namenode.xattrs.enabled=false) or an op this server does not know.
        if exc.status == 400 or _XATTRS_OFF.search(exc.message):
            if self.xattrs:
                log.warning("%r keeps no xattrs (%s): ETags are synthetic", self, exc.message)
            self.xattrs = False

    def info(self, key: str, status: Status, meta: StoredMeta | None) -> ObjectInfo:
        # A recorded meta describes these bytes only while length and mtime are unchanged.
        if meta is not None and (meta.size, meta.mtime_ns) != (
            status.length,
            status.mtime_ms * 10**6,
        ):
            meta = None
        modified = datetime.fromtimestamp(status.mtime_ms / 1000, UTC)
        if meta is None:
            return ObjectInfo(
                key, status.length, status.synthetic_etag(), modified, guess_type(key), tags={}
            )
        return recorded_info(key, status.length, modified, meta)

    async def stat_path(self, key: str) -> tuple[Status, ObjectInfo, bool]:
        """Status and info of `key`'s file, and whether its ETag was recorded (an MD5)."""
        path = self.path(key)
        metas: list[StoredMeta | None] = []

        async def fetch_meta() -> None:
            metas.append(await self.meta(path))

        failure: Exception | None = None
        # Both asked at once: a stat costs one round trip, not two. Failures are kept out of
        # the task group, which would wrap them in an ExceptionGroup.
        async with anyio.create_task_group() as tg:
            tg.start_soon(fetch_meta)
            try:
                status = await self.status(path)
            except (RemoteFailure, StoreError) as exc:
                failure = exc
        if isinstance(failure, RemoteFailure):
            if failure.exception == "FileNotFoundException":
                raise await self.missing(key)
            raise self.error(failure, key)
        if failure is not None:
            raise failure
        if not status.is_file:
            raise ObjectNotFound(key)
        info = self.info(key, status, metas[0] if metas else None)
        return status, info, info.etag != status.synthetic_etag()

    # -- reads and listings ------------------------------------------------------------------

    async def open(self, key: str, start: int, end: int | None) -> httpx.Response | None:
        """OPEN with offset/length, the redirect followed to the DataNode; None if the range
        starts at or past the end of the file."""
        params = {"offset": str(start)} if start > 0 else {}
        if end is not None:
            params["length"] = str(end - start)
        try:
            location = await self.http.redirect("GET", self.path(key), "OPEN", **params)
            return await self.http.send("GET", location, None, idempotent=True, stream=True)
        except RemoteFailure as exc:
            # The NameNode refuses offsets at or past the end ("Offset=… out of the range"), a
            # DataNode seeks past the end of an empty file with EOFException.
            if exc.exception == "EOFException" or exc.message.startswith("Offset="):
                return None
            if exc.exception == "FileNotFoundException":
                raise await self.missing(key) from None
            raise self.error(exc, key) from None

    async def children(self, path: str) -> list[Status]:
        """A directory's entries, batch by batch (LISTSTATUS_BATCH, startAfter); [] if gone."""
        found: list[Status] = []
        after = ""
        while True:
            params = {"startAfter": after} if after else {}
            try:
                doc = await self.http.call("GET", path or "/", "LISTSTATUS_BATCH", query=params)
            except RemoteFailure as exc:
                if exc.exception == "FileNotFoundException" and path == self.root:
                    raise StoreUnavailable(f"{self!r}: the mount folder does not exist") from None
                if exc.exception == "FileNotFoundException":
                    return []  # removed while we walked
                if exc.status != 400 or "LISTSTATUS_BATCH" not in exc.message:
                    raise
                # A server older than LISTSTATUS_BATCH (Hadoop 2.8): the whole directory at once.
                doc = await self.http.call("GET", path or "/", "LISTSTATUS")
                return [Status.of(e) for e in doc["FileStatuses"]["FileStatus"]]
            listing = doc["DirectoryListing"]
            batch = [Status.of(e) for e in listing["partialListing"]["FileStatuses"]["FileStatus"]]
            found += batch
            if not batch or not listing.get("remainingEntries"):
                return found
            after = batch[-1].name


def _bad_name(name: str) -> bool:
    # DFSUtil.isValidName: no '.', '..', ':' or empty components; and no name of ours.
    return name in ("", ".", "..") or ":" in name or is_internal(name)
