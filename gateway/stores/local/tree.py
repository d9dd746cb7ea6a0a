"""The folder tree a file:// store serves: keys to paths under its root (never out of it), the
file system's name limits, and OS errors turned into the typed store errors."""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from gateway.stores.base import (
    KeyTooLong,
    ObjectNotFound,
    StoreAccessDenied,
    StoreError,
    StoreMissing,
    StoreUnavailable,
    UnsupportedKey,
)
from gateway.stores.file_meta import DIR_MARKER, FOLDER_SELF, is_internal

# Linux's limits, for a root that does not exist yet to ask (pathconf).
_NAME_MAX, _PATH_MAX = 255, 4096


def utf8(name: str) -> bool:
    # Names that are not UTF-8 (surrogate-escaped by os) cannot be S3 keys, nor sort like them.
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class Tree:
    """The files under `root` as keys; the readers, writers and uploads of the store use it."""

    def __init__(self, root: str) -> None:
        if not os.path.isabs(root):
            raise ValueError(f"file store root must be an absolute path, not {root!r}")
        self.root = os.path.normpath(root)
        self._real_root: str | None = None
        self._name_limits: tuple[int, int] | None = None

    def path(self, key: str) -> str:
        """The path of `key` under the root; ObjectNotFound for keys no file can have, and
        KeyTooLong for those longer than the file system holds."""
        if not key or "\0" in key or key.startswith("/") or not utf8(key):
            raise ObjectNotFound(key)
        marker = key.endswith("/") and len(key) > 1
        parts = (key[:-1] if marker else key).split("/")
        # '' catches 'a//b'; a trailing '/' (a directory marker) is the folder's DIR_MARKER.
        if any(p in ("", ".", "..") or is_internal(p) for p in parts):
            raise ObjectNotFound(key)
        name_max, path_max = self._limits()
        longest = max(len(p.encode("utf-8")) for p in parts)
        if longest > name_max:
            raise KeyTooLong(
                f"a name in it is {longest} bytes, and the file system holds names of at most"
                f" {name_max} bytes"
            )
        path = os.path.join(self.root, *parts, *([DIR_MARKER] if marker else []))
        if len(os.fsencode(path)) >= path_max:
            raise KeyTooLong(
                f"with the bucket's folder its path is {len(os.fsencode(path))} bytes, and the"
                f" file system holds paths of at most {path_max - 1} bytes"
            )
        return path

    def _limits(self) -> tuple[int, int]:
        """NAME_MAX and PATH_MAX (counting its NUL) of the root's file system."""
        if self._name_limits is None:
            try:
                name_max = os.pathconf(self.root, "PC_NAME_MAX")
                path_max = os.pathconf(self.root, "PC_PATH_MAX")
            except (OSError, ValueError):
                return _NAME_MAX, _PATH_MAX  # no root yet: Linux's, until there is one
            self._name_limits = name_max, path_max
        return self._name_limits

    def real_root(self) -> str:
        if self._real_root is None:
            self._real_root = os.path.realpath(self.root)
        return self._real_root

    def inside(self, real: str) -> bool:
        root = self.real_root()
        return real == root or real.startswith(root.rstrip("/") + "/")

    def resolve(self, key: str) -> str:
        """The real path of `key`, refusing symlinks that lead out of the root: a file, or, for
        a key that names a folder (keys below it were written after it), its FOLDER_SELF."""
        real = os.path.realpath(self.path(key))
        if not self.inside(real):
            raise ObjectNotFound(key)
        if not key.endswith("/") and os.path.isdir(real):
            return os.path.join(real, FOLDER_SELF)
        return real

    def open_object(self, key: str) -> tuple[int, os.stat_result]:
        """The object's file opened for reading, and its stat; ObjectNotFound unless it is a
        regular file. The caller closes the fd."""
        try:
            # O_NONBLOCK: opening a FIFO must not hang a worker thread; no effect on regular files.
            fd = os.open(self.resolve(key), os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise self.os_error(exc, key) from None
        try:
            s = os.fstat(fd)
            if not stat.S_ISREG(s.st_mode):
                raise ObjectNotFound(key)
        except BaseException:
            os.close(fd)
            raise
        return fd, s

    def target(self, key: str) -> str:
        """The path a write of `key` takes: its folder's real path and its name."""
        if not os.path.isdir(self.root):
            raise StoreMissing(f"file store root {self.root} is not a directory")
        try:
            path = self.path(key)
        except ObjectNotFound:
            raise UnsupportedKey(f"the file store cannot hold the key {key!r}") from None
        folder = os.path.realpath(os.path.dirname(path))
        if not self.inside(folder):
            raise UnsupportedKey(f"{key!r}: its folder leads out of the store's root")
        dest = os.path.join(folder, os.path.basename(path))
        if not key.endswith("/") and os.path.isdir(dest) and not os.path.islink(dest):
            return os.path.join(dest, FOLDER_SELF)  # `a` beside `a/b`: kept inside the folder
        return dest

    def os_error(self, exc: OSError, key: str) -> StoreError:
        if exc.errno == errno.ENAMETOOLONG:
            # Past the checks of path(): a folder of the tree on a file system of shorter names,
            # or a symlink whose target makes the path too long.
            return KeyTooLong("a name in it, or its path, is longer than the file system holds")
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            if not os.path.isdir(self.root):
                return StoreMissing(f"file store root {self.root} is not a directory")
            return ObjectNotFound(key)
        if exc.errno in (errno.EACCES, errno.EPERM):
            return StoreAccessDenied(f"{key}: {exc.strerror}")
        return StoreUnavailable(f"{key}: {exc}")


def make_folder(path: str) -> None:
    """Make the folder `path` and those above it, turning a file that stands where one of
    them must be into that folder's FOLDER_SELF (the key `a` stays readable beside `a/b`):
    renamed aside, the folder made, renamed into it. A reader in between finds no `a`."""
    try:
        os.makedirs(path, exist_ok=True)
        return
    except (FileExistsError, NotADirectoryError):
        pass
    parent = os.path.dirname(path)
    if parent != path:
        make_folder(parent)
    if os.path.isfile(path) and not os.path.islink(path):
        aside = os.path.join(parent, f"{FOLDER_SELF}-move-{os.urandom(6).hex()}")
        os.rename(path, aside)
        with contextlib.suppress(FileExistsError):  # another writer made it meanwhile
            os.mkdir(path)
        os.rename(aside, os.path.join(path, FOLDER_SELF))
    os.makedirs(path, exist_ok=True)


def unfold(folder: str) -> bool:
    """Turn a folder that holds nothing but its FOLDER_SELF back into a plain file (after the
    last key below it went); whether it did."""
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    if names != [FOLDER_SELF]:
        return False
    parent = os.path.dirname(folder)
    aside = os.path.join(parent, f"{FOLDER_SELF}-move-{os.urandom(6).hex()}")
    try:
        os.rename(os.path.join(folder, FOLDER_SELF), aside)
    except OSError:
        return False
    try:
        os.rmdir(folder)
    except OSError:
        os.rename(aside, os.path.join(folder, FOLDER_SELF))  # something came in: put it back
        return False
    os.rename(aside, folder)
    return True
