"""fs-verity seals on block files: a sealed file is read-only for good, and the kernel checks
every page of it against its Merkle tree whenever the page is read from the disk (read, mmap
and sendfile alike), failing the read with EIO instead of handing over a damaged byte.

Called through ioctl(2) directly (linux/fsverity.h): FS_IOC_ENABLE_VERITY to seal and
FS_IOC_GETFLAGS to ask whether a file is sealed. ext4 needs the `verity` feature
(`mkfs.ext4 -O verity`, `tune2fs -O verity`) and the kernel CONFIG_FS_VERITY; btrfs and f2fs
have it too. Blocking calls: a thread's, as blockfile.py's are.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import struct

_FS_IOC_ENABLE_VERITY = 0x40806685  # _IOW('f', 133, struct fsverity_enable_arg), 128 bytes
_FS_IOC_GETFLAGS = 0x80086601  # _IOR('f', 1, long)
_FS_VERITY_FL = 0x00100000
_HASH_SHA256 = 1
_TREE_BLOCK = 4096  # Merkle tree block: the page size, which kernels before 6.3 require
# struct fsverity_enable_arg: version, hash, block size, salt size, salt ptr, sig size,
# reserved, sig ptr, 11 reserved u64s.
_ENABLE = struct.pack("=IIIIQIIQ11Q", 1, _HASH_SHA256, _TREE_BLOCK, 0, 0, 0, 0, 0, *[0] * 11)
_FLAGS = bytes(struct.calcsize("l"))
PROBE_PREFIX = ".verity-probe."


def seal(fd: int) -> None:
    """Seal the file open on `fd` (read-only: fs-verity takes no file that is open for
    writing anywhere, ETXTBSY). Reads the whole file once to build its tree; OSError if the
    file system cannot (EOPNOTSUPP) or the disk fails."""
    fcntl.ioctl(fd, _FS_IOC_ENABLE_VERITY, _ENABLE)


def is_sealed(fd: int) -> bool:
    """Whether the file open on `fd` is sealed: one ioctl, ~1 us. False where the file system
    has no such flags."""
    try:
        raw = fcntl.ioctl(fd, _FS_IOC_GETFLAGS, _FLAGS)
    except OSError:
        return False
    return bool(struct.unpack("l", raw)[0] & _FS_VERITY_FL)


def refused(exc: OSError, fd: int) -> bool:
    """Whether a failed read of `fd` is fs-verity refusing a damaged page: EIO on a sealed
    file. (A failing disk gives EIO too; either way the block's bytes cannot be trusted.)"""
    return exc.errno == errno.EIO and is_sealed(fd)


def probe(folder: str) -> str:
    """'' if block files in `folder` can be sealed, else why not: a small file is written,
    sealed and removed (done once per cache folder when its store opens)."""
    path = os.path.join(folder, PROBE_PREFIX + secrets.token_hex(6))
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, bytes(_TREE_BLOCK + 1))
        finally:
            os.close(fd)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            seal(fd)
            if not is_sealed(fd):
                return "sealed, but the file system does not report it sealed"
        finally:
            os.close(fd)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.ENOTTY):
            return (
                "no fs-verity here (ext4: the `verity` feature, mkfs.ext4 -O verity, and a "
                f"kernel with CONFIG_FS_VERITY): {exc.strerror}"
            )
        return f"could not seal a probe file: {exc}"
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return ""
