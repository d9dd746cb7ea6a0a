"""Whether a block file's bytes are in the page cache now, so that sending them (sendfile)
or reading them on the event loop never waits for the disk: cachestat(2), Linux 6.5+, through
libc's syscall(). Where the kernel lacks it, nothing is ever said to be resident (CACHESTAT
is False) and zero-copy sends are off."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from gateway.cache.layout import TRAILER_SIZE, Corrupt, tail_size


def sendable(fd: int, data_len: int, start: int, length: int) -> bool:
    """Whether bytes [start, start+length) of a block file (of the right size for `data_len`)
    are all in the page cache now, so that sending them does not wait for the disk: one
    cachestat(2) (Linux 6.5+) and one fstat, ~2 us. Corrupt for a file of the wrong size."""
    size = os.fstat(fd).st_size
    if size not in (data_len + tail_size(data_len), data_len + TRAILER_SIZE):
        raise Corrupt(f"block file of {size} bytes")
    return in_page_cache(fd, start, length)


def in_page_cache(fd: int, start: int, length: int) -> bool:
    """sendable() of a file whose size was checked already: one cachestat(2), ~1-2 us."""
    if _cachestat is None:
        return False
    first, last = start // _PAGE, (start + length - 1) // _PAGE
    return _cachestat(fd, start, length) == last - first + 1


def _cachestat_call() -> Callable[[int, int, int], int] | None:
    """cachestat(2) through libc's syscall(), or None where the kernel lacks it."""
    import ctypes

    number = {"x86_64": 451, "aarch64": 451}.get(os.uname().machine)
    if number is None:
        return None

    class _Range(ctypes.Structure):
        _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]

    class _Stat(ctypes.Structure):
        _fields_ = [(n, ctypes.c_uint64) for n in ("cache", "dirty", "wb", "evicted", "recent")]

    try:
        syscall = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    rng, stat = _Range(), _Stat()
    rng_ref, stat_ref = ctypes.byref(rng), ctypes.byref(stat)
    lock = threading.Lock()

    def cachestat(fd: int, off: int, length: int) -> int:
        with lock:
            rng.off, rng.len = off, length
            if syscall(number, fd, rng_ref, stat_ref, 0) != 0:
                return -1
            return int(stat.cache)

    probe = os.open(os.path.dirname(os.path.abspath(__file__)), os.O_RDONLY | os.O_CLOEXEC)
    try:
        ok = syscall(number, probe, rng_ref, stat_ref, 0) == 0 or ctypes.get_errno() != 38
    finally:
        os.close(probe)
    return cachestat if ok else None


_PAGE = os.sysconf("SC_PAGE_SIZE")
_cachestat = _cachestat_call()
CACHESTAT = _cachestat is not None  # zero-copy sends need it (PageStore.region)
