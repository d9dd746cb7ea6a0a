"""The file store's low-level steps: hidden temp files, batched writes off the event loop,
zero-copy copies, sealing (ETag and attributes, fsync) and renaming into place; and the
folders that file:// buckets are."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import secrets
import stat as st
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread

from gateway.stores.base import (
    ContainerExists,
    ContainerNotEmpty,
    ContainerNotFound,
    IncompleteBody,
    ObjectInfo,
    StoreAccessDenied,
    StoreError,
    Swept,
    WriteAttrs,
)
from gateway.stores.file_meta import (
    WRITES_DIR,
    StoredMeta,
    guess_info,
    guess_type,
    is_internal,
    load,
    save,
    stored_info,
    synthetic_etag,
)

log = logging.getLogger(__name__)

NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
# Bodies are written in batches of at least this, so one thread hop moves a MiB or more.
BATCH = 1 << 20
# Bytes copied per thread hop: a cancelled copy stops within one step.
COPY_STEP = 64 << 20
# copy_file_range refusing this pair of files (another file system, an old kernel, FUSE).
_NO_COPY_RANGE = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP}


# Temp files this process is writing. Over NFS, flock is a POSIX lock, which never conflicts
# within one process: the sweep must not take such a lock for a dead writer's.
_LIVE: set[str] = set()
_warned_unmarked = False


@dataclass(slots=True)
class Temp:
    """A hidden file being written beside its destination; removed unless placed.

    Its writer holds an exclusive flock on it from its creation until it is placed or
    removed, and a marker (a symlink in <root>/.s3gw-writes/) names it meanwhile: a marker
    whose file nobody holds locked is what a writer that died left (sweep_writes).
    """

    path: str
    fd: int | None
    marker: str | None = None
    placed: bool = False

    def discard(self) -> None:
        if not self.placed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        if self.fd is not None:
            os.close(self.fd)  # and so unlocked: only now, once it is placed or gone
            self.fd = None
        if self.marker is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.marker)
            self.marker = None
        _LIVE.discard(self.path)


def new_temp(root: str, path: str) -> Temp:
    """Create the temp file `path` (OSError as os.open raises it), locked and marked."""
    fd = os.open(path, NEW_FILE, 0o666)
    try:
        # Without locks on this file system (some FUSE ones) the sweep never takes the lock,
        # and so never removes this file: leftovers, rather than a live writer's file lost.
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        _LIVE.add(path)
        return Temp(path, fd, _mark(root, path))
    except BaseException:
        os.close(fd)
        os.unlink(path)
        _LIVE.discard(path)
        raise


def _mark(root: str, path: str) -> str | None:
    global _warned_unmarked
    folder = os.path.join(root, WRITES_DIR)
    marker = os.path.join(folder, secrets.token_urlsafe(12))
    for _ in range(2):
        try:
            os.symlink(path, marker)
            return marker
        except FileNotFoundError:
            with contextlib.suppress(OSError):
                os.makedirs(folder, exist_ok=True)
        except OSError as exc:
            if not _warned_unmarked:
                _warned_unmarked = True
                log.warning(
                    "file store %s: temp files not marked (%s): a crash leaves them behind",
                    root,
                    exc.strerror,
                )
            return None
    return None


def sweep_writes(root: str, inside: Callable[[str], bool]) -> Swept:
    """Remove the temp files of writers that died, found by their markers: one nobody holds
    locked, in this store's tree, and not this process's own. Safe beside live writers of
    any process or node (their locks), and beside other sweeps (each removal is one unlink)."""
    folder = os.path.join(root, WRITES_DIR)
    try:
        markers = [entry.path for entry in os.scandir(folder)]
    except (FileNotFoundError, NotADirectoryError):
        return Swept()
    files = size = 0
    for marker in markers:
        try:
            target = os.readlink(marker)
        except OSError:
            continue  # gone meanwhile, or nothing of ours
        if target in _LIVE:
            continue
        folder_of = os.path.realpath(os.path.dirname(target))
        if is_internal(os.path.basename(target)) and inside(folder_of):
            removed = _remove_if_unheld(target)
            if removed is None:
                continue  # its writer lives
            if removed >= 0:
                files, size = files + 1, size + removed
        with contextlib.suppress(FileNotFoundError):
            os.unlink(marker)
    return Swept(files, size)


def _remove_if_unheld(path: str) -> int | None:
    """Bytes removed (-1: nothing was there), or None while a writer holds the file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return -1  # placed (or removed) before its writer could drop the marker
    except OSError:
        return None  # cannot tell: left alone
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return None
        held = os.fstat(fd)
        try:
            here = os.lstat(path)
        except FileNotFoundError:
            return -1
        if (here.st_dev, here.st_ino) != (held.st_dev, held.st_ino):
            return -1  # placed meanwhile and the name reused: never ours to remove
        os.unlink(path)
        return held.st_size
    finally:
        os.close(fd)


async def discard(temp: Temp) -> None:
    # Shielded: a write cancelled mid-way must still take its temp file away.
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(temp.discard)


def write_batch(fd: int, chunks: list[bytes], md5: Any) -> None:
    data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    md5.update(data)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


async def receive(fd: int, body: AsyncIterator[bytes], size: int, md5: Any, key: str) -> None:
    """Write exactly `size` bytes of `body` to `fd`, hashing them, off the event loop."""
    batch: list[bytes] = []
    pending = total = 0
    async for chunk in body:
        total += len(chunk)
        if total > size:
            raise IncompleteBody(f"{key}: the body is longer than its declared {size} bytes")
        batch.append(chunk)
        pending += len(chunk)
        if pending >= BATCH:
            await anyio.to_thread.run_sync(write_batch, fd, batch, md5)
            batch, pending = [], 0
    if total != size:
        raise IncompleteBody(f"{key}: the body ended after {total} of {size} bytes")
    if batch:
        await anyio.to_thread.run_sync(write_batch, fd, batch, md5)


def copy_step(src: int, dst: int, src_at: int, dst_at: int, count: int, md5: Any) -> int:
    """Copy up to COPY_STEP bytes; 0 if the source ends first. Zero-copy unless hashing."""
    n = min(count, COPY_STEP)
    if md5 is None:
        try:
            done = 0
            while done < n:
                moved = os.copy_file_range(src, dst, n - done, src_at + done, dst_at + done)
                if moved == 0:
                    return 0
                done += moved
            return n
        except OSError as exc:
            if exc.errno not in _NO_COPY_RANGE:
                raise
    done = 0
    while done < n:
        data = os.pread(src, min(BATCH, n - done), src_at + done)
        if not data:
            return 0
        if md5 is not None:
            md5.update(data)
        view = memoryview(data)
        at = dst_at + done
        while view:
            written = os.pwrite(dst, view, at)
            view, at = view[written:], at + written
        done += len(data)
    return n


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def seal(
    temp: Temp, key: str, etag: str, attrs: WriteAttrs, parts: tuple[int, ...] = ()
) -> ObjectInfo:
    """Record ETag and attributes (and the sizes of the parts it was uploaded in) on the
    finished temp file and flush them; it stays open, and locked, until it is placed."""
    assert temp.fd is not None
    s = os.fstat(temp.fd)
    meta = StoredMeta(etag, s.st_size, s.st_mtime_ns, attrs, parts)
    kept = save(temp.fd, meta)
    # fsync, not fdatasync: the xattr is metadata, and must survive a crash with the bytes.
    os.fsync(temp.fd)
    return stored_info(key, s, meta) if kept else guess_info(key, s, guess_type(key))


def place(temp: Temp, dest: str) -> None:
    """Rename into place, replacing any previous version at once; durable on return."""
    os.rename(temp.path, dest)
    temp.placed = True
    fsync_dir(os.path.dirname(dest))


def current_etag(path: str) -> str | None:
    """The ETag a stat of this file would give, None if there is no regular file."""
    try:
        s = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not st.S_ISREG(s.st_mode):
        return None
    meta = load(path, s)
    return meta.etag if meta else synthetic_etag(s)


# -- folders as buckets -------------------------------------------------------------------------


def create_folder(path: str) -> None:
    try:
        os.makedirs(path)
    except FileExistsError:
        raise ContainerExists(f"{path} exists") from None
    except PermissionError as exc:
        raise StoreAccessDenied(f"cannot create {path}: {exc.strerror}") from None
    except OSError as exc:
        raise StoreError(f"cannot create {path}: {exc.strerror}") from None


def _holds_objects(path: str) -> bool:
    for folder, dirs, files in os.walk(path, onerror=_raise):
        if any(not is_internal(f) for f in files):
            return True
        # A symlink to a folder is listed as the objects below it.
        if any(not is_internal(d) and os.path.islink(os.path.join(folder, d)) for d in dirs):
            return True
        dirs[:] = [d for d in dirs if not is_internal(d)]
    return False


def _raise(exc: OSError) -> None:
    raise exc


def delete_folder(path: str) -> None:
    """Remove a folder that holds no objects, with its empty folders and the store's internals."""
    if not os.path.isdir(path):
        raise ContainerNotFound(f"{path} is not a folder")
    try:
        if _holds_objects(path):
            raise ContainerNotEmpty(f"{path} holds objects")
        # Bottom-up, and only what is internal: an object put since the check stops it.
        for folder, dirs, files in os.walk(path, topdown=False, onerror=_raise):
            inside = os.path.relpath(folder, path).split(os.sep)
            for name in files:
                if not is_internal(name) and not any(map(is_internal, inside)):
                    raise ContainerNotEmpty(f"{path} gained objects while being deleted")
                os.unlink(os.path.join(folder, name))
            for name in dirs:
                os.rmdir(os.path.join(folder, name))
        os.rmdir(path)
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
            raise ContainerNotEmpty(f"{path} gained objects while being deleted") from None
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise StoreAccessDenied(f"cannot delete {path}: {exc.strerror}") from None
        raise StoreError(f"cannot delete {path}: {exc.strerror}") from None
