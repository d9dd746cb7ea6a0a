"""The `file:///abs/path` under-store: a folder tree seen as a bucket, keys as relative paths."""

from __future__ import annotations

import os
import stat as st
from collections.abc import AsyncGenerator, Mapping
from urllib.parse import SplitResult, unquote

import anyio.to_thread

from gateway.stores.base import (
    ListPage,
    ListRequest,
    ObjectInfo,
    ObjectNotFound,
    StoreRejected,
    Swept,
    VersionChanged,
    one_version,
)
from gateway.stores.delegating import DelegatingStore
from gateway.stores.etags import bare
from gateway.stores.file_meta import info_of, load, save, stored_info, synthetic_etag, with_tags
from gateway.stores.listing import resume_after
from gateway.stores.local.files import sweep_writes
from gateway.stores.local.listing import list_sync
from gateway.stores.local.multipart import Uploads
from gateway.stores.local.tree import Tree
from gateway.stores.local.writes import Writes

# One thread hop per MiB keeps the hop cost (~50 µs) well below the copy cost.
CHUNK_SIZE = 1 << 20


class LocalStore(DelegatingStore):
    """Objects are the regular files under `root`; directories and other file types are not.

    Names the store reserves for itself (`file_meta.is_internal`) are never objects.
    """

    scheme = "file"

    def __init__(self, root: str) -> None:
        self.tree = Tree(root)
        self.root = self.tree.root
        self.writes = Writes(self.tree)
        self.uploads = Uploads(self.tree, self.writes)

    def __repr__(self) -> str:
        return f"LocalStore({self.root!r})"

    def local_folder(self) -> str:
        return self.root

    # -- stat and read -----------------------------------------------------------------------

    def _stat_sync(self, key: str) -> ObjectInfo:
        try:
            path = self.tree.resolve(key)
            s = os.stat(path)
        except OSError as exc:
            raise self.tree.os_error(exc, key) from None
        if not st.S_ISREG(s.st_mode):
            raise ObjectNotFound(key)
        return info_of(key, s, path)

    async def stat(self, key: str) -> ObjectInfo:
        return await anyio.to_thread.run_sync(self._stat_sync, key)

    def _open_sync(
        self, key: str, start: int, end: int | None, if_match: str | None
    ) -> tuple[int | None, bytes, int, int, str]:
        """Open, check the version, read a first chunk: (fd or None, data, pos, stop, etag)."""
        fd, s = self.tree.open_object(key)
        try:
            # The version token for the check at the end of the read; the ETag for the client's.
            etag = synthetic_etag(s)
            if if_match is not None and if_match != "*":
                current = info_of(key, s, fd).etag
                if bare(if_match) != bare(current):
                    raise VersionChanged(f"{key}: is now {current}, not {if_match}")
            stop = s.st_size if end is None else min(end, s.st_size)
            pos = max(start, 0)
            data = b""
            if pos < stop:
                data = os.pread(fd, min(CHUNK_SIZE, stop - pos), pos)
                pos += len(data)
                if not data:
                    raise VersionChanged(f"{key}: shrank while being read")
            if pos >= stop:
                os.close(fd)
                return None, data, pos, stop, etag
            return fd, data, pos, stop, etag
        except BaseException:
            os.close(fd)
            raise

    @staticmethod
    def _pread_sync(fd: int, key: str, pos: int, stop: int, etag: str) -> bytes:
        data = os.pread(fd, min(CHUNK_SIZE, stop - pos), pos)
        if not data:
            raise VersionChanged(f"{key}: shrank while being read")
        # An in-place overwrite during the read would tear the bytes: check once, at the end.
        if pos + len(data) >= stop and synthetic_etag(os.fstat(fd)) != etag:
            raise VersionChanged(f"{key}: changed while being read")
        return data

    async def read(
        self, key: str, start: int = 0, end: int | None = None, if_match: str | None = None
    ) -> AsyncGenerator[bytes, None]:
        fd, data, pos, stop, etag = await anyio.to_thread.run_sync(
            self._open_sync, key, start, end, if_match
        )
        try:
            if data:
                yield data
            while fd is not None and pos < stop:
                data = await anyio.to_thread.run_sync(self._pread_sync, fd, key, pos, stop, etag)
                pos += len(data)
                yield data
        finally:
            # Closed inline, not in a thread: an await here could be cancelled and leak the fd,
            # and close() of a local regular file does not block.
            if fd is not None:
                os.close(fd)

    # -- tags: in the meta xattr, beside the ETag and attributes -----------------------------

    def _tags_sync(self, key: str, tags: dict[str, str] | None) -> dict[str, str]:
        fd, s = self.tree.open_object(key)
        try:
            meta = load(fd, s)
            if tags is None:
                return dict(meta.attrs.tags) if meta else {}
            info = stored_info(key, s, meta) if meta else info_of(key, s, fd)
            if not save(fd, with_tags(meta, tags, s.st_size, s.st_mtime_ns, info)) and tags:
                raise StoreRejected("this file system keeps no extended attributes for tags")
            return tags
        finally:
            os.close(fd)

    def _parts_sync(self, key: str, etag: str) -> list[int] | None:
        fd, s = self.tree.open_object(key)
        try:
            meta = load(fd, s)
        finally:
            os.close(fd)
        if meta is None or not meta.parts or bare(meta.etag) != bare(etag):
            return None
        return list(meta.parts)

    async def part_sizes(self, key: str, etag: str) -> list[int] | None:
        """Recorded when the gateway joined the parts (complete_multipart)."""
        return await anyio.to_thread.run_sync(self._parts_sync, key, etag)

    async def get_tags(self, key: str, version_id: str | None = None) -> dict[str, str]:
        one_version(self.scheme, version_id)
        return await anyio.to_thread.run_sync(self._tags_sync, key, None)

    async def put_tags(
        self, key: str, tags: Mapping[str, str], version_id: str | None = None
    ) -> None:
        one_version(self.scheme, version_id)
        await anyio.to_thread.run_sync(self._tags_sync, key, dict(tags))

    # -- listing -----------------------------------------------------------------------------

    async def _list_page(self, q: ListRequest) -> ListPage:
        return await anyio.to_thread.run_sync(
            list_sync, self.tree, q.prefix, q.delimiter, resume_after(q), q.max_keys
        )

    async def sweep(self) -> Swept:
        return await anyio.to_thread.run_sync(sweep_writes, self.root, self.tree.inside)


def open_local(parts: SplitResult, options: Mapping[str, str]) -> LocalStore:
    """`file:///absolute/path`."""
    if parts.netloc not in ("", "localhost"):
        raise ValueError(f"file URI {parts.geturl()!r} names a host; use file:///absolute/path")
    path = unquote(parts.path)
    if not path.startswith("/") or "\0" in path:
        raise ValueError(
            f"file URI {parts.geturl()!r} needs an absolute path: file:///absolute/path"
        )
    if options:
        raise ValueError(f"file stores take no options, got {', '.join(sorted(options))}")
    return LocalStore(os.path.normpath(path))
