"""The `file:///abs/path` under-store: a folder tree seen as a bucket, keys as relative paths."""

from __future__ import annotations

import errno
import os
import stat as st
from collections.abc import AsyncGenerator, Iterator, Mapping
from urllib.parse import SplitResult, unquote

import anyio.to_thread

from gateway.stores.base import (
    ListPage,
    ObjectInfo,
    ObjectNotFound,
    StoreAccessDenied,
    StoreError,
    StoreUnavailable,
    VersionChanged,
    decode_token,
    encode_token,
)
from gateway.stores.local_files import create_folder, delete_folder
from gateway.stores.local_meta import bare, info_of, is_internal, synthetic_etag
from gateway.stores.local_multipart import LocalMultipart

# One thread hop per MiB keeps the hop cost (~50 µs) well below the copy cost.
CHUNK_SIZE = 1 << 20

# An item of a walk: ("file", key, entry, ()) or ("dir", common prefix, entry, real paths from
# the root down to that directory, to follow symlinked directories without looping).
_Item = tuple[str, str, os.DirEntry[str], tuple[str, ...]]


def _utf8(name: str) -> bool:
    # Names that are not UTF-8 (surrogate-escaped by os) cannot be S3 keys, nor sort like them.
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class LocalStore(LocalMultipart):
    """Objects are the regular files under `root`; directories and other file types are not.

    Names the store reserves for itself (`local_meta.is_internal`) are never objects.
    """

    scheme = "file"

    def __init__(self, root: str) -> None:
        if not os.path.isabs(root):
            raise ValueError(f"file store root must be an absolute path, not {root!r}")
        self.root = os.path.normpath(root)
        self._real_root: str | None = None

    def __repr__(self) -> str:
        return f"LocalStore({self.root!r})"

    # -- paths -------------------------------------------------------------------------------

    def _path(self, key: str) -> str:
        """The path of `key` under the root; ObjectNotFound for keys no file can have."""
        if not key or "\0" in key or key.startswith("/") or not _utf8(key):
            raise ObjectNotFound(key)
        parts = key.split("/")
        # '' also catches a trailing '/': a directory-like key is never a file.
        if any(p in ("", ".", "..") or is_internal(p) for p in parts):
            raise ObjectNotFound(key)
        return os.path.join(self.root, *parts)

    def _root_real(self) -> str:
        if self._real_root is None:
            self._real_root = os.path.realpath(self.root)
        return self._real_root

    def _inside(self, real: str) -> bool:
        root = self._root_real()
        return real == root or real.startswith(root.rstrip("/") + "/")

    def _resolve(self, key: str) -> str:
        """The real path of `key`, refusing symlinks that lead out of the root."""
        real = os.path.realpath(self._path(key))
        if not self._inside(real):
            raise ObjectNotFound(key)
        return real

    def _os_error(self, exc: OSError, key: str) -> StoreError:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ENAMETOOLONG, errno.ELOOP):
            if not os.path.isdir(self.root):
                return StoreUnavailable(f"file store root {self.root} is not a directory")
            return ObjectNotFound(key)
        if exc.errno in (errno.EACCES, errno.EPERM):
            return StoreAccessDenied(f"{key}: {exc.strerror}")
        return StoreUnavailable(f"{key}: {exc}")

    # -- stat and read -----------------------------------------------------------------------

    def _stat_sync(self, key: str) -> ObjectInfo:
        try:
            path = self._resolve(key)
            s = os.stat(path)
        except OSError as exc:
            raise self._os_error(exc, key) from None
        if not st.S_ISREG(s.st_mode):
            raise ObjectNotFound(key)
        return info_of(key, s, path)

    async def stat(self, key: str) -> ObjectInfo:
        return await anyio.to_thread.run_sync(self._stat_sync, key)

    def _open_sync(
        self, key: str, start: int, end: int | None, if_match: str | None
    ) -> tuple[int | None, bytes, int, int, str]:
        """Open, check the version, read a first chunk: (fd or None, data, pos, stop, etag)."""
        try:
            # O_NONBLOCK: opening a FIFO must not hang a worker thread; no effect on regular files.
            fd = os.open(self._resolve(key), os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise self._os_error(exc, key) from None
        try:
            s = os.fstat(fd)
            if not st.S_ISREG(s.st_mode):
                raise ObjectNotFound(key)
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

    # -- listing -----------------------------------------------------------------------------

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
        return await anyio.to_thread.run_sync(
            self._list_sync, prefix, delimiter or None, marker, max_keys
        )

    async def create_container(self) -> None:
        if self.root == "/":
            raise ValueError("the file system's root is no bucket")
        await anyio.to_thread.run_sync(create_folder, self.root)

    async def delete_container(self) -> None:
        await anyio.to_thread.run_sync(delete_folder, self.root)

    def _list_sync(self, prefix: str, delimiter: str | None, marker: str, limit: int) -> ListPage:
        if not os.path.isdir(self.root):
            raise StoreUnavailable(f"file store root {self.root} is not a directory")
        objects: list[ObjectInfo] = []
        prefixes: list[str] = []
        last = ""
        more = False
        if limit <= 0:
            return ListPage([], [], None)
        walk = _Walk(self, prefix, delimiter, marker)
        for kind, name, entry, chain in walk.items("", self.root, (self._root_real(),)):
            if kind == "dir":
                if name == last or name <= marker or not walk.has_file(entry.path, chain):
                    continue
            elif delimiter is not None and (cp := walk.rollup(name)) is not None:
                if cp == last or cp <= marker:
                    continue
                kind, name = "dir", cp
            if len(objects) + len(prefixes) == limit:
                more = True
                break
            if kind == "dir":
                prefixes.append(name)
            else:
                try:
                    objects.append(info_of(name, entry.stat(), entry.path))
                except OSError:
                    continue  # deleted since the directory was read
            last = name
        return ListPage(objects, prefixes, encode_token(last) if more else None)


class _Walk:
    """A depth-first walk of the tree in S3 key order, pruned by prefix, marker and delimiter."""

    def __init__(self, store: LocalStore, prefix: str, delimiter: str | None, marker: str):
        self.store = store
        self.prefix = prefix
        self.delimiter = delimiter
        self.marker = marker

    def rollup(self, key: str) -> str | None:
        """The common prefix `key` rolls up into, if any."""
        if self.delimiter is None or not key.startswith(self.prefix):
            return None
        at = key.find(self.delimiter, len(self.prefix))
        return None if at < 0 else key[: at + len(self.delimiter)]

    def _children(
        self, path: str, chain: tuple[str, ...]
    ) -> list[tuple[str, bool, str, os.DirEntry[str]]]:
        """Entries that can hold objects, as (name, is_dir, real path, entry), unsorted."""
        found = []
        try:
            with os.scandir(path) as it:
                for e in it:
                    if not _utf8(e.name) or is_internal(e.name):
                        continue
                    try:
                        is_dir = e.is_dir()
                        if not is_dir and not e.is_file():
                            continue
                        real = os.path.join(chain[-1], e.name)
                        if e.is_symlink():
                            real = os.path.realpath(e.path)
                            # Out of the root, or a loop back into the walk's own path.
                            if not self.store._inside(real) or real in chain:
                                continue
                    except OSError:
                        continue
                    found.append((e.name, is_dir, real, e))
        except (FileNotFoundError, NotADirectoryError):
            return []  # removed while we walked
        except PermissionError as exc:
            raise StoreAccessDenied(f"cannot list {path}: {exc.strerror}") from None
        return found

    def _entries(
        self, dir_key: str, path: str, chain: tuple[str, ...]
    ) -> list[tuple[str, bool, str, os.DirEntry[str]]]:
        """This directory's candidates as (key, is_dir, real path, entry), sorted as S3 keys."""
        found = []
        for name, is_dir, real, e in self._children(path, chain):
            # A directory sorts as its name plus '/': 'a-c' < 'a/b' < 'a0'.
            key = f"{dir_key}{name}/" if is_dir else dir_key + name
            if not key.startswith(self.prefix) and not (is_dir and self.prefix.startswith(key)):
                continue
            # Prune what lies wholly at or before the marker, subtrees included.
            if key <= self.marker and not (is_dir and self.marker.startswith(key)):
                continue
            found.append((key, is_dir, real, e))
        found.sort(key=lambda f: f[0])
        return found

    def items(self, dir_key: str, path: str, ancestors: tuple[str, ...]) -> Iterator[_Item]:
        for key, is_dir, real, entry in self._entries(dir_key, path, ancestors):
            if not is_dir:
                yield "file", key, entry, ()
                continue
            cp = self.rollup(key)
            if cp is not None:
                # Every key below rolls up into the same prefix: no need to walk it all.
                yield "dir", cp, entry, (*ancestors, real)
            else:
                yield from self.items(key, entry.path, (*ancestors, real))

    def has_file(self, path: str, chain: tuple[str, ...]) -> bool:
        """Whether any regular file lies below `path` (empty folders produce no prefix)."""
        children = self._children(path, chain)
        if any(not is_dir for _, is_dir, _, _ in children):
            return True
        return any(self.has_file(e.path, (*chain, real)) for _, _, real, e in children)


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
