"""The `hdfs://namenode:http-port/path` under-store over WebHDFS: a folder tree of an HDFS seen as
a bucket, as file:// sees a local one. The mount's folder and its errors are `tree.Tree` (over
the WebHDFS client of `client`); writes are in `writes`, multipart uploads in `multipart`,
listing in `listing`."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from urllib.parse import SplitResult, unquote

import httpx

from gateway.stores.base import (
    ListPage,
    ListRequest,
    ObjectInfo,
    StoreRejected,
    StoreUnavailable,
    VersionChanged,
    one_version,
)
from gateway.stores.delegating import DelegatingStore
from gateway.stores.etags import bare
from gateway.stores.file_meta import with_tags
from gateway.stores.hdfs.client import RemoteFailure, Status
from gateway.stores.hdfs.listing import list_page
from gateway.stores.hdfs.multipart import Uploads
from gateway.stores.hdfs.tree import Tree
from gateway.stores.hdfs.writes import Writes
from gateway.stores.listing import resume_after
from gateway.stores.retry import SYSTEM_CLOCK, Clock

CHUNK_SIZE = 512 * 1024
DEFAULT_PORTS = {"http": 9870, "https": 9871}  # dfs.namenode.http(s)-address


class HdfsStore(DelegatingStore):
    """The files under an HDFS folder as objects (see `tree.Tree`)."""

    scheme = "hdfs"
    writes: Writes

    def __init__(
        self, base: str, root: str, options: Mapping[str, str], *, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.tree = Tree(base, root, options, clock)
        self.root = self.tree.root
        self.writes = Writes(self.tree)
        self.uploads = Uploads(self.tree, self.writes)

    def __repr__(self) -> str:
        return repr(self.tree)

    async def close(self) -> None:
        await self.tree.http.close()

    # -- reads -------------------------------------------------------------------------------

    async def stat(self, key: str) -> ObjectInfo:
        return (await self.tree.stat_path(key))[1]

    async def _open(self, key: str, start: int, end: int | None) -> httpx.Response | None:
        return await self.tree.open(key, start, end)

    async def read(
        self, key: str, start: int = 0, end: int | None = None, if_match: str | None = None
    ) -> AsyncGenerator[bytes, None]:
        start = max(start, 0)
        before: Status | None = None
        if if_match is not None or (end is not None and end <= start):
            # No bytes to send, or a version to check: the stat reports misses and changes.
            before, info, _ = await self.tree.stat_path(key)
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
                    after = await self.tree.status(self.tree.path(key))
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

    # -- tags: in the meta xattr, beside the ETag and attributes -----------------------------

    async def get_tags(self, key: str, version_id: str | None = None) -> dict[str, str]:
        one_version(self.scheme, version_id)
        info = await self.stat(key)
        return dict(info.tags or {})

    async def part_sizes(self, key: str, etag: str) -> list[int] | None:
        """Recorded when the gateway joined the parts (complete_multipart)."""
        status, _, _ = await self.tree.stat_path(key)
        meta = await self.tree.meta(self.tree.path(key))
        if meta is None or not meta.parts or bare(meta.etag) != bare(etag):
            return None
        if (meta.size, meta.mtime_ns) != (status.length, status.mtime_ms * 10**6):
            return None
        return list(meta.parts)

    async def put_tags(
        self, key: str, tags: Mapping[str, str], version_id: str | None = None
    ) -> None:
        one_version(self.scheme, version_id)
        status, info, _ = await self.tree.stat_path(key)
        if not self.tree.xattrs:
            if tags:
                raise StoreRejected("this HDFS keeps no extended attributes for tags")
            return
        meta = await self.tree.meta(self.tree.path(key))
        mtime_ns = status.mtime_ms * 10**6
        if meta is not None and (meta.size, meta.mtime_ns) != (status.length, mtime_ns):
            meta = None  # changed behind our back: what the stat told
        new = with_tags(meta, dict(tags), status.length, mtime_ns, info)
        await self.writes.save_meta(self.tree.path(key), key, new)

    async def _list_page(self, q: ListRequest) -> ListPage:
        return await list_page(self.tree, q.prefix, q.delimiter, resume_after(q), q.max_keys)


def open_hdfs(
    parts: SplitResult, options: Mapping[str, str], *, clock: Clock = SYSTEM_CLOCK
) -> HdfsStore:
    """`hdfs://namenode[:http-port]/path` (also `webhdfs://`): the NameNode's WebHDFS address;
    `clock` times the retries."""
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
    numbers = (
        ("max_attempts", int),
        ("connect_timeout", float),
        ("read_timeout", float),
        ("retry_deadline", float),
    )
    for name, kind in numbers:
        try:
            kind(options.get(name, "1"))
        except ValueError:
            raise ValueError(f"hdfs store option {name} must be a number") from None
    return HdfsStore(f"{scheme}://{host}:{port}", "/" + root.strip("/"), options, clock=clock)
