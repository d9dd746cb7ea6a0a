"""The OS name of a thread (Linux's `comm`, 15 bytes), so that `top -H`, `ps -L`, py-spy's
native view and /proc/<pid>/task/<tid>/comm tell a node's threads apart: CPython 3.11 names
only its Python objects, and every thread of a worker showed as `gateway`. The cache's threads
name themselves: `cache-io` (the page store's pool), `cache-janitor`, `cache-rescan`."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import threading

_PR_SET_NAME = 15
_libc: ctypes.CDLL | None = None
_lock = threading.Lock()


def name_this_thread(name: str) -> None:
    """Give the calling thread's OS name (truncated to 15 bytes); nothing where it cannot."""
    global _libc
    with _lock:
        if _libc is None:
            try:
                _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            except OSError:
                return
    with contextlib.suppress(AttributeError):  # no prctl: not Linux
        _libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
