"""The namespace behind the WebHDFS test server: HDFS semantics (FileSystem and ClientProtocol as
NamenodeWebHdfsMethods calls them) over a local folder, with HDFS's exceptions and messages.

Files are regular files under `root`; an HDFS path `/a/b` is `root/a/b`. fileId is the inode
number, modificationTime the mtime in milliseconds, user xattrs the folder's own user xattrs.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import shutil
import stat as st
import struct
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

BLOCK_SIZE = 128 << 20
BYTES_PER_CRC = 512
XATTRS_DISABLED = (
    "The XAttr operation has been rejected.  Support for XAttrs has been disabled by setting "
    "dfs.namenode.xattrs.enabled to false."
)

# Exception name -> (javaClassName, HTTP status), as ExceptionHandler maps them: IOExceptions
# are 403, FileNotFoundException 404, IllegalArgumentException and its kin 400.
_JAVA = {
    "FileNotFoundException": ("java.io.FileNotFoundException", 404),
    "AccessControlException": ("org.apache.hadoop.security.AccessControlException", 403),
    "FileAlreadyExistsException": ("org.apache.hadoop.fs.FileAlreadyExistsException", 403),
    "ParentNotDirectoryException": ("org.apache.hadoop.fs.ParentNotDirectoryException", 403),
    "PathIsNotEmptyDirectoryException": (
        "org.apache.hadoop.fs.PathIsNotEmptyDirectoryException",
        403,
    ),
    "IOException": ("java.io.IOException", 403),
    "EOFException": ("java.io.EOFException", 403),
    "InvalidToken": ("org.apache.hadoop.security.token.SecretManager$InvalidToken", 403),
    "RetriableException": ("org.apache.hadoop.ipc.RetriableException", 403),
    "SecurityException": ("java.lang.SecurityException", 401),
    "IllegalArgumentException": ("java.lang.IllegalArgumentException", 400),
    "HadoopIllegalArgumentException": ("org.apache.hadoop.HadoopIllegalArgumentException", 400),
    "UnsupportedOperationException": ("java.lang.UnsupportedOperationException", 400),
}


class RemoteError(Exception):
    """An exception the server answers as a RemoteException JSON body."""

    def __init__(self, exception: str, message: str) -> None:
        super().__init__(message)
        self.exception = exception
        self.java_class, self.status = _JAVA[exception]
        self.message = message

    def body(self) -> dict[str, Any]:
        return {
            "RemoteException": {
                "exception": self.exception,
                "javaClassName": self.java_class,
                "message": self.message,
            }
        }


def signed_order(name: str) -> bytes:
    """HDFS keeps a directory's children sorted by their UTF-8 bytes compared as *signed* bytes
    (DFSUtilClient.compareBytes): non-ASCII names sort before ASCII ones. Flipping the top bit
    turns that order into plain byte order."""
    return bytes(b ^ 0x80 for b in name.encode("utf-8"))


@dataclass
class Namespace:
    root: Path
    xattrs: bool = True  # dfs.namenode.xattrs.enabled

    def __post_init__(self) -> None:
        # The NameNode applies each operation under its namesystem lock.
        self.lock = threading.RLock()

    # -- paths ---------------------------------------------------------------------------------

    def local(self, path: str) -> Path:
        if not path.startswith("/"):
            raise RemoteError("IllegalArgumentException", f"Invalid path name {path}")
        parts = [p for p in path.split("/") if p]
        # DFSUtil.isValidName: no '.', '..' or ':' components.
        if any(p in (".", "..") or ":" in p for p in parts):
            raise RemoteError("HadoopIllegalArgumentException", f"Invalid path name {path}")
        return self.root.joinpath(*parts)

    def _check_parents(self, path: str) -> None:
        """ParentNotDirectoryException when an ancestor of `path` is a file."""
        parts = [p for p in path.split("/") if p][:-1]
        at = self.root
        for i, part in enumerate(parts):
            at = at / part
            if at.exists() and not at.is_dir():
                shown = "/" + "/".join(parts[: i + 1])
                raise RemoteError("ParentNotDirectoryException", f"{shown} (is not a directory)")

    def status(self, path: str, name: str = "") -> dict[str, Any]:
        """A FileStatus JSON object (JsonUtil.toJsonMap of an HdfsFileStatus)."""
        local = self.local(path)
        try:
            s = local.stat()
        except (FileNotFoundError, NotADirectoryError):
            raise RemoteError("FileNotFoundException", f"File does not exist: {path}") from None
        is_dir = st.S_ISDIR(s.st_mode)
        return {
            "accessTime": 0 if is_dir else s.st_atime_ns // 1_000_000,
            "blockSize": 0 if is_dir else BLOCK_SIZE,
            "childrenNum": len(os.listdir(local)) if is_dir else 0,
            "fileId": s.st_ino,
            "group": "supergroup",
            "length": 0 if is_dir else s.st_size,
            "modificationTime": s.st_mtime_ns // 1_000_000,
            "owner": "hdfs",
            "pathSuffix": name,
            "permission": f"{s.st_mode & 0o777:o}",
            "replication": 0 if is_dir else 3,
            "storagePolicy": 0,
            "type": "DIRECTORY" if is_dir else "FILE",
        }

    # -- reads ---------------------------------------------------------------------------------

    def listing(self, path: str, start_after: str, limit: int) -> tuple[list[dict[str, Any]], int]:
        """One batch of ClientProtocol.getListing: children after `start_after`, in HDFS order,
        and how many remain."""
        with self.lock:
            local = self.local(path)
            if local.is_file():
                return [self.status(path)], 0
            if not local.is_dir():
                raise RemoteError("FileNotFoundException", f"File {path} does not exist.")
            names = sorted(os.listdir(local), key=signed_order)
            if start_after:
                mark = signed_order(start_after)
                names = [n for n in names if signed_order(n) > mark]
            batch = names[:limit]
            base = path.rstrip("/")
            return [self.status(f"{base}/{n}", n) for n in batch], len(names) - len(batch)

    def open_file(self, path: str, offset: int) -> tuple[BinaryIO, int]:
        """The DataNode's DFSClient.open and seek: the file and its length."""
        local = self.local(path)
        if local.is_dir():
            raise RemoteError("FileNotFoundException", f"Path is not a file: {path}")
        try:
            f = open(local, "rb")  # noqa: SIM115 - the caller streams and closes it
        except (FileNotFoundError, NotADirectoryError):
            raise RemoteError("FileNotFoundException", f"File does not exist: {path}") from None
        size = os.fstat(f.fileno()).st_size
        if offset > size:
            f.close()
            raise RemoteError("EOFException", "Cannot seek after EOF")
        f.seek(offset)
        return f, size

    def checksum(self, path: str) -> dict[str, Any]:
        """MD5MD5CRC32FileChecksum: MD5 over the blocks' MD5s of their per-512-byte CRC32s."""
        f, size = self.open_file(path, 0)
        block_md5s = []
        with f:
            for _ in range(max(1, -(-size // BLOCK_SIZE))):
                crcs = bytearray()
                for _ in range(BLOCK_SIZE // BYTES_PER_CRC):
                    chunk = f.read(BYTES_PER_CRC)
                    if not chunk:
                        break
                    crcs += struct.pack(">I", zlib.crc32(chunk))
                block_md5s.append(hashlib.md5(crcs).digest())
        crc_per_block = BLOCK_SIZE // BYTES_PER_CRC if len(block_md5s) > 1 else 0
        digest = hashlib.md5(b"".join(block_md5s)).digest()
        raw = struct.pack(">iq", BYTES_PER_CRC, crc_per_block) + digest
        return {
            "FileChecksum": {
                "algorithm": f"MD5-of-{crc_per_block}MD5-of-{BYTES_PER_CRC}CRC32",
                "bytes": raw.hex(),
                "length": len(raw),
            }
        }

    def content_summary(self, path: str) -> dict[str, Any]:
        local = self.local(path)
        if not local.exists():
            raise RemoteError("FileNotFoundException", f"File does not exist: {path}")
        files, dirs, length = 0, 1, 0  # HDFS counts the directory itself
        for folder, subdirs, names in os.walk(local):
            dirs, files = dirs + len(subdirs), files + len(names)
            length += sum((Path(folder) / n).stat().st_size for n in names)
        if local.is_file():
            files, dirs, length = 1, 0, local.stat().st_size
        return {
            "ContentSummary": {
                "directoryCount": dirs,
                "fileCount": files,
                "length": length,
                "quota": -1,
                "spaceConsumed": length * 3,
                "spaceQuota": -1,
            }
        }

    # -- namespace changes ---------------------------------------------------------------------

    def mkdirs(self, path: str) -> bool:
        with self.lock:
            self._check_parents(path)
            local = self.local(path)
            if local.exists() and not local.is_dir():
                raise RemoteError("FileAlreadyExistsException", f"Path is not a directory: {path}")
            local.mkdir(parents=True, exist_ok=True)
            return True

    def create(self, path: str, overwrite: bool) -> BinaryIO:
        """DFSClient.create with createParent: the new file, open for the DataNode to fill."""
        with self.lock:
            self._check_parents(path)
            local = self.local(path)
            if local.is_dir():
                raise RemoteError(
                    "FileAlreadyExistsException", f"{path} already exists as a directory"
                )
            if local.exists() and not overwrite:
                raise RemoteError(
                    "FileAlreadyExistsException", f"{path} for client 127.0.0.1 already exists"
                )
            local.parent.mkdir(parents=True, exist_ok=True)
            if local.exists():
                local.unlink()  # a new inode, as HDFS gives an overwritten file a new fileId
            return open(local, "xb")  # the DataNode handler closes it

    def append(self, path: str) -> BinaryIO:
        local = self.local(path)
        if not local.is_file():
            raise RemoteError("FileNotFoundException", f"File does not exist: {path}")
        return open(local, "ab")  # the DataNode handler closes it

    def rename(self, src: str, dst: str) -> bool:
        """The old FileSystem.rename: false rather than an error; into a directory if dst is one."""
        with self.lock:
            source, target = self.local(src), self.local(dst)
            if not source.exists() or src == "/":
                return False
            if target.is_dir():
                target = target / source.name
            if target.exists() or not target.parent.is_dir():
                return False
            if source == target:
                return True
            os.rename(source, target)
            return True

    def rename2(self, src: str, dst: str, overwrite: bool) -> None:
        """FSDirRenameOp.renameTo with Options.Rename: errors, never false."""
        with self.lock:
            source, target = self.local(src), self.local(dst)
            if not source.exists():
                raise RemoteError("FileNotFoundException", f"rename source {src} is not found.")
            if source == target:
                raise RemoteError(
                    "FileAlreadyExistsException",
                    f"The source {src} and destination {dst} are the same",
                )
            parent = dst.rsplit("/", 1)[0] or "/"
            if not target.parent.exists():
                raise RemoteError(
                    "FileNotFoundException", f"rename destination parent {parent} not found."
                )
            if not target.parent.is_dir():
                raise RemoteError(
                    "ParentNotDirectoryException", f"rename destination parent {parent} is a file."
                )
            if target.exists():
                if not overwrite:
                    raise RemoteError(
                        "FileAlreadyExistsException", f"rename destination {dst} already exists."
                    )
                if target.is_dir() != source.is_dir():
                    raise RemoteError(
                        "IOException",
                        f"Source {src} and destination {dst} must both be directories"
                        if target.is_dir()
                        else f"Source {src} and destination {dst} must both be files",
                    )
                if target.is_dir() and os.listdir(target):
                    raise RemoteError(
                        "IOException", f"rename destination directory is not empty: {dst}"
                    )
            os.replace(source, target)  # one step, as the NameNode swaps the inodes

    def delete(self, path: str, recursive: bool) -> bool:
        with self.lock:
            local = self.local(path)
            if path.rstrip("/") == "" or not local.exists():
                return False
            if local.is_dir():
                if os.listdir(local) and not recursive:
                    raise RemoteError(
                        "PathIsNotEmptyDirectoryException",
                        f"`{path} is non empty': Directory is not empty",
                    )
                shutil.rmtree(local)
            else:
                local.unlink()
            return True

    def concat(self, target: str, sources: list[str]) -> None:
        """FSDirConcatOp: sources appended to the target and removed, all in one directory."""
        with self.lock:
            trg = self.local(target)
            if not trg.is_file():
                raise RemoteError("FileNotFoundException", f"File does not exist: {target}")
            if len(set(sources)) != len(sources):
                raise RemoteError("HadoopIllegalArgumentException", "concat: repeated sources")
            paths = []
            for src in sources:
                local = self.local(src)
                if not local.is_file():
                    raise RemoteError("FileNotFoundException", f"File does not exist: {src}")
                if local.parent != trg.parent:
                    raise RemoteError(
                        "HadoopIllegalArgumentException",
                        f"Source file {src} is not in the same directory with the target {target}",
                    )
                if local == trg:
                    raise RemoteError(
                        "HadoopIllegalArgumentException",
                        f"concat: the src file {src} is the same with the target file {target}",
                    )
                if local.stat().st_size == 0:
                    raise RemoteError(
                        "HadoopIllegalArgumentException",
                        f"concat: source file {src} is invalid or empty or underConstruction",
                    )
                paths.append(local)
            with open(trg, "ab") as out:
                for local in paths:
                    with open(local, "rb") as f:
                        shutil.copyfileobj(f, out, 1 << 20)
            for local in paths:
                local.unlink()

    # -- extended attributes -------------------------------------------------------------------

    def _xattr_target(self, path: str, name: str | None) -> Path:
        if not self.xattrs:
            raise RemoteError("IOException", XATTRS_DISABLED)
        if name is not None and not name.lower().startswith("user."):
            if name.split(".", 1)[0].lower() in ("trusted", "system", "security", "raw"):
                raise RemoteError(
                    "AccessControlException", f"User doesn't have permission for xattr: {name}"
                )
            raise RemoteError(
                "HadoopIllegalArgumentException",
                "An XAttr name must be prefixed with user/trusted/security/system/raw, "
                "followed by a '.'",
            )
        local = self.local(path)
        if not local.exists():
            raise RemoteError("FileNotFoundException", f"File does not exist: {path}")
        return local

    def set_xattr(self, path: str, name: str, value: bytes, flags: set[str]) -> None:
        with self.lock:
            local = self._xattr_target(path, name)
            exists = name in os.listxattr(local)
            if exists and "REPLACE" not in flags:
                raise RemoteError(
                    "IOException",
                    f"XAttr: {name} already exists. The REPLACE flag must be specified.",
                )
            if not exists and "CREATE" not in flags:
                raise RemoteError(
                    "IOException",
                    f"XAttr: {name} does not exist. The CREATE flag must be specified.",
                )
            # os.setxattr changes the ctime only: HDFS keeps modificationTime on xattr changes too.
            os.setxattr(local, name, value)

    def get_xattrs(self, path: str, names: list[str], encoding: str) -> dict[str, Any]:
        with self.lock:
            local = self._xattr_target(path, names[0] if names else None)
            present = [n for n in os.listxattr(local) if n.startswith("user.")]
            if names and any(n not in present for n in names):
                raise RemoteError(
                    "IOException", "At least one of the attributes provided was not found."
                )
            wanted = names or present
            return {"XAttrs": [{"name": n, "value": encode_value(os.getxattr(local, n), encoding)}
                               for n in wanted]}  # fmt: skip


def encode_value(value: bytes, encoding: str) -> str:
    """XAttrCodec.encodeValue: "text" in quotes, 0x-hex, or 0s-base64."""
    encoding = encoding.upper()
    if encoding == "TEXT":
        return '"' + value.decode("utf-8", "replace") + '"'
    if encoding == "HEX":
        return "0x" + value.hex()
    return "0s" + base64.b64encode(value).decode("ascii")


def decode_value(value: str | None) -> bytes:
    """XAttrCodec.decodeValue: a quoted string, 0x-hex, 0s-base64, else the UTF-8 bytes."""
    if value is None:
        return b""
    if len(value) >= 2:
        if value.startswith('"') and value.endswith('"'):
            return value[1:-1].encode("utf-8")
        prefix = value[:2].lower()
        with contextlib.suppress(ValueError):
            if prefix == "0x":
                return bytes.fromhex(value[2:])
            if prefix == "0s":
                return base64.b64decode(value[2:], validate=True)
    return value.encode("utf-8")
