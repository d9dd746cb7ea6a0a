"""The on-disk layout (root/ab/cd/<sha256 hex>, temporary files in root/tmp) and the blocking
steps on it. Every function here but `object_path` blocks: call it on a worker thread."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
from concurrent.futures import Future
from typing import Any

log = logging.getLogger("gateway.cache")

TMP_DIR = "tmp"
_HEX2 = re.compile(r"[0-9a-f]{2}")
_NAME = re.compile(r"[0-9a-f]{64}")
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_CLOEXEC

# (mtime, name, size) of one committed file, as found by a scan.
Found = tuple[float, str, int]


class Truncated(Exception):
    """The file ended before the range asked for."""


def object_path(root: str, name: str) -> str:
    # Two levels of 256 keep every directory small up to tens of millions of objects.
    return f"{root}/{name[:2]}/{name[2:4]}/{name}"


def open_root(root: str, want_free: bool) -> tuple[list[Found], int | None]:
    """Create the layout, drop temporary files a crash left, and list committed files, oldest
    first (mtime is the LRU order that survives a restart); also the free bytes if wanted."""
    tmp = os.path.join(root, TMP_DIR)
    os.makedirs(tmp, exist_ok=True)
    with os.scandir(tmp) as leftovers:
        for entry in leftovers:
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                os.unlink(entry.path)
    found: list[Found] = []
    with os.scandir(root) as top:
        for d1 in top:
            if not (_HEX2.fullmatch(d1.name) and d1.is_dir(follow_symlinks=False)):
                continue
            with os.scandir(d1.path) as mid:
                for d2 in mid:
                    if _HEX2.fullmatch(d2.name) and d2.is_dir(follow_symlinks=False):
                        _scan_leaf(d2.path, d1.name + d2.name, found)
    found.sort()
    return found, free_bytes(root) if want_free else None


def _scan_leaf(path: str, prefix: str, found: list[Found]) -> None:
    # One stat per file is the floor (sizes are not in directory entries); at ~2 files per
    # leaf directory the opens of the directories cost as much as the stats.
    with os.scandir(path) as files:
        for entry in files:
            name = entry.name
            if not (name.startswith(prefix) and _NAME.fullmatch(name)):
                continue  # not ours: leave it alone
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                found.append((st.st_mtime, name, st.st_size))


def free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _pread_exact(fd: int, start: int, length: int) -> bytes:
    data = os.pread(fd, length, start)
    if len(data) == length:
        return data
    parts = [data]
    got = len(data)
    while got < length:
        more = os.pread(fd, length - got, start + got)
        if not more:
            raise Truncated(f"file ends at {start + got}, wanted {start + length}")
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def read_range(path: str, start: int, length: int) -> bytes:
    fd = os.open(path, _READ)
    try:
        return _pread_exact(fd, start, length)
    finally:
        os.close(fd)


def open_range(path: str, start: int, length: int) -> tuple[int, bytes]:
    """Open and read the first chunk in one hop; the fd stays open for the chunks that follow."""
    fd = os.open(path, _READ)
    try:
        return fd, _pread_exact(fd, start, length)
    except BaseException:
        os.close(fd)
        raise


def read_at(fd: int, start: int, length: int, close: bool) -> bytes:
    try:
        return _pread_exact(fd, start, length)
    finally:
        if close:
            os.close(fd)


def close_after(fd: int | None, pending: Future[Any] | None, pending_opens: bool) -> None:
    """Close `fd` once the call in flight on it ended: closing first could let that call hit
    whatever file reuses the descriptor number. With `pending_opens`, the call in flight is the
    one that opens the file (create_temp, open_range) and its result holds the fd."""
    if pending is not None:
        with contextlib.suppress(BaseException):
            result = pending.result()
            if pending_opens:
                fd = result[0] if isinstance(result, tuple) else result
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def _write_all(fd: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def create_temp(path: str, data: bytes | bytearray) -> int:
    fd = os.open(path, _CREATE, 0o644)
    try:
        _write_all(fd, data)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    return fd


def append(fd: int, data: bytes | bytearray) -> None:
    _write_all(fd, data)


def finish_temp(fd: int | None, path: str, data: bytes | bytearray, sync: bool) -> None:
    """Write the tail, make the data durable if asked, close. The caller renames afterwards."""
    if fd is None:
        fd = os.open(path, _CREATE, 0o644)
    try:
        _write_all(fd, data)
        if sync:
            # fdatasync also persists the size; the rename that follows needs no directory fsync
            # because losing it after a power cut only loses a cache entry, never tears one.
            os.fdatasync(fd)
    finally:
        os.close(fd)


def install(tmp: str, dest: str, free_of: str | None) -> int | None:
    """Rename a complete temporary file into place; then the free bytes if asked."""
    try:
        os.replace(tmp, dest)
    except FileNotFoundError:
        # Fan-out directories are made on first use; a missing temp file raises again below.
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        os.replace(tmp, dest)
    return free_bytes(free_of) if free_of is not None else None


def discard_temp(
    fd: int | None, pending: Future[Any] | None, pending_opens: bool, path: str
) -> None:
    close_after(fd, pending, pending_opens)
    remove(path)


def remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError:
        log.warning("cache: could not remove %s", path, exc_info=True)


def touch(paths: list[str]) -> None:
    for path in paths:
        try:
            os.utime(path)
        except FileNotFoundError:
            pass
        except OSError:
            log.warning("cache: could not touch %s", path, exc_info=True)
