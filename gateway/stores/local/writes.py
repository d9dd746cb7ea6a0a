"""Writes of the file store. Every new object is written to a hidden temp file beside its
destination, sealed (ETag and attributes in an xattr, fsync) and only then renamed into place,
so a failure leaves nothing half-visible."""

from __future__ import annotations

import contextlib
import errno
import os
import stat as st
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio.to_thread

from gateway.stores.base import (
    ObjectInfo,
    ObjectNotFound,
    PreconditionFailed,
    StoreUnavailable,
    UnsupportedKey,
    VersionChanged,
    WriteAttrs,
    WriteConflict,
    one_version,
)
from gateway.stores.etags import bare, new_md5
from gateway.stores.file_meta import (
    FOLDER_SELF,
    guess_info,
    guess_type,
    load,
    stored_info,
    synthetic_etag,
    temp_name,
)
from gateway.stores.local.files import (
    Temp,
    copy_step,
    create_folder,
    current_etag,
    delete_folder,
    discard,
    fsync_dir,
    new_temp,
    place,
    receive,
    seal,
)
from gateway.stores.local.tree import Tree, make_folder, unfold

# link() refused by the file system itself, not by the state of the key.
_NO_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK}


@dataclass(slots=True)
class _Source:
    fd: int
    stat: os.stat_result
    info: ObjectInfo
    known: bool  # its ETag was recorded, so the copy needs no hashing


class Writes:
    """put, copy and delete of the file store, in the folder tree it is given, and the folder
    itself as a bucket."""

    def __init__(self, tree: Tree) -> None:
        self.tree = tree

    # -- where a write goes ------------------------------------------------------------------

    def make_temp(self, key: str, dest: str) -> Temp:
        folder = os.path.dirname(dest)
        for _ in range(3):
            try:
                make_folder(folder)  # a file `a` where `a/` must be a folder moves into it
            except (FileExistsError, NotADirectoryError):
                raise UnsupportedKey(f"{key!r}: a file stands where it needs a folder") from None
            except OSError as exc:
                raise self.tree.os_error(exc, key) from None
            path = os.path.join(folder, temp_name(os.path.basename(dest)))
            try:
                return new_temp(self.tree.root, path)
            except FileNotFoundError:
                continue  # a delete pruned the folder, empty, between makedirs and open
            except OSError as exc:
                raise self.tree.os_error(exc, key) from None
        raise StoreUnavailable(f"{key}: its folder keeps disappearing")

    @staticmethod
    def check(key: str, dest: str, if_match: str | None, if_none_match: bool) -> None:
        if if_none_match and current_etag(dest) is not None:
            raise PreconditionFailed(f"{key} exists")
        if if_match is not None:
            current = current_etag(dest)
            if current is None or bare(current) != bare(if_match):
                raise PreconditionFailed(f"{key} is {current or 'missing'}, not {if_match}")

    def place(self, key: str, temp: Temp, dest: str, exclusive: bool) -> None:
        try:
            if exclusive:
                self._link(key, temp, dest)
            else:
                place(temp, dest)
        except IsADirectoryError:
            raise UnsupportedKey(f"{key!r}: a folder of that name exists") from None
        except OSError as exc:
            raise self.tree.os_error(exc, key) from None

    @staticmethod
    def _link(key: str, temp: Temp, dest: str) -> None:
        """Place only if nothing is there, atomically: link() fails if the name exists."""
        try:
            os.link(temp.path, dest)
        except FileExistsError:
            if os.path.isdir(dest):
                raise UnsupportedKey(f"{key!r}: a folder of that name exists") from None
            raise PreconditionFailed(f"{key} exists") from None
        except OSError as exc:
            if exc.errno not in _NO_LINKS:
                raise
            # No hard links on this file system (some FUSE and network ones): check, then
            # rename, with a small race against a concurrent creator.
            if os.path.lexists(dest):
                raise PreconditionFailed(f"{key} exists") from None
            place(temp, dest)
            return
        temp.placed = True  # visible now: what follows must not fail the write
        with contextlib.suppress(OSError):
            os.unlink(temp.path)
        with contextlib.suppress(OSError):
            fsync_dir(os.path.dirname(dest))

    # -- put ---------------------------------------------------------------------------------

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
        dest = await anyio.to_thread.run_sync(self.tree.target, key)
        # Checked before the body is read, so a doomed write fails before its upload, and
        # again just before the rename. if_none_match is atomic (link); if_match keeps a
        # small race against writers outside the gateway between that check and the rename.
        await anyio.to_thread.run_sync(self.check, key, dest, if_match, if_none_match)
        temp = await anyio.to_thread.run_sync(self.make_temp, key, dest)
        try:
            assert temp.fd is not None
            md5 = new_md5()
            await receive(temp.fd, body, size, md5, key)
            etag = f'"{md5.hexdigest()}"'
            return await anyio.to_thread.run_sync(
                self._commit, key, temp, dest, etag, attrs, if_match, if_none_match
            )
        except PreconditionFailed as exc:
            # The condition held before the body: another write landed during this one.
            raise WriteConflict(str(exc)) from None
        finally:
            await discard(temp)

    def _commit(
        self,
        key: str,
        temp: Temp,
        dest: str,
        etag: str,
        attrs: WriteAttrs,
        if_match: str | None,
        if_none_match: bool,
    ) -> ObjectInfo:
        info = seal(temp, key, etag, attrs)
        self.check(key, dest, if_match, False)
        self.place(key, temp, dest, exclusive=if_none_match)
        return info

    # -- copy --------------------------------------------------------------------------------

    async def copy(
        self,
        src_key: str,
        dst_key: str,
        attrs: WriteAttrs | None,
        *,
        if_match: str | None = None,
        version_id: str | None = None,
    ) -> ObjectInfo:
        one_version("file", version_id)
        dest = await anyio.to_thread.run_sync(self.tree.target, dst_key)
        src = await anyio.to_thread.run_sync(self._open_source, src_key, if_match)
        try:
            temp = await anyio.to_thread.run_sync(self.make_temp, dst_key, dest)
            try:
                assert temp.fd is not None
                md5 = None if src.known else new_md5()
                done = 0
                while done < src.stat.st_size:
                    step = await anyio.to_thread.run_sync(
                        copy_step, src.fd, temp.fd, done, done, src.stat.st_size - done, md5
                    )
                    if step == 0:
                        raise VersionChanged(f"{src_key}: shrank while being copied")
                    done += step
                etag = src.info.etag if md5 is None else f'"{md5.hexdigest()}"'
                keep = attrs if attrs is not None else WriteAttrs.of(src.info)
                return await anyio.to_thread.run_sync(
                    self._finish_copy, src, src_key, dst_key, temp, dest, etag, keep
                )
            finally:
                await discard(temp)
        finally:
            os.close(src.fd)  # inline: an await here could be cancelled and leak the fd

    def _open_source(self, key: str, if_match: str | None) -> _Source:
        fd, s = self.tree.open_object(key)
        try:
            meta = load(fd, s)
            info = stored_info(key, s, meta) if meta else guess_info(key, s, guess_type(key))
            if if_match is not None and if_match != "*" and bare(if_match) != bare(info.etag):
                raise VersionChanged(f"{key}: is now {info.etag}, not {if_match}")
            return _Source(fd, s, info, meta is not None)
        except BaseException:
            os.close(fd)
            raise

    def _finish_copy(
        self,
        src: _Source,
        src_key: str,
        dst_key: str,
        temp: Temp,
        dest: str,
        etag: str,
        attrs: WriteAttrs,
    ) -> ObjectInfo:
        # The copy is of one version: a source rewritten in place meanwhile fails it.
        if synthetic_etag(os.fstat(src.fd)) != synthetic_etag(src.stat):
            raise VersionChanged(f"{src_key}: changed while being copied")
        info = seal(temp, dst_key, etag, attrs)
        self.place(dst_key, temp, dest, exclusive=False)
        return info

    # -- delete ------------------------------------------------------------------------------

    async def delete(self, key: str) -> None:
        await anyio.to_thread.run_sync(self._delete_sync, key)

    def _delete_sync(self, key: str) -> None:
        try:
            path = self.tree.path(key)
        except (ObjectNotFound, UnsupportedKey):
            return  # no file can have this key, so none is there
        folder = os.path.realpath(os.path.dirname(path))
        if not self.tree.inside(folder):
            return
        target = os.path.join(folder, os.path.basename(path))
        try:
            if st.S_ISDIR(os.lstat(target).st_mode):
                # A folder is no object, but may keep the object of its own key inside.
                folder, target = target, os.path.join(target, FOLDER_SELF)
            os.unlink(target)
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            raise self.tree.os_error(exc, key) from None
        # The object is gone from here on: only its durability is left to make sure of.
        folder = self._prune(folder)
        root = self.tree.real_root()
        while True:
            try:
                fsync_dir(folder)
                return
            except FileNotFoundError:
                # A sibling's delete pruned it meanwhile (and made that removal durable in
                # the folder above, which it fsyncs): the unlink went with it.
                if folder == root or not self.tree.inside(os.path.dirname(folder)):
                    return
                folder = os.path.dirname(folder)
            except OSError as exc:
                raise self.tree.os_error(exc, key) from None

    def _prune(self, folder: str) -> str:
        """Remove the folders a delete left empty (S3 has none); the first one left standing."""
        root = self.tree.real_root()
        while folder != root and self.tree.inside(folder):
            try:
                os.rmdir(folder)
            except FileNotFoundError:
                pass  # a sibling's delete removed it first: its parent may be empty now too
            except OSError:
                # Not empty, or a put is about to fill it; holding only the object of its own
                # key, it becomes that plain file again.
                if unfold(folder):
                    folder = os.path.dirname(folder)
                break
            folder = os.path.dirname(folder)
        return folder

    # -- the folder itself -------------------------------------------------------------------

    async def create_container(self) -> None:
        if self.tree.root == "/":
            raise ValueError("the file system's root is no bucket")
        await anyio.to_thread.run_sync(create_folder, self.tree.root)

    async def delete_container(self) -> None:
        await anyio.to_thread.run_sync(delete_folder, self.tree.root)
