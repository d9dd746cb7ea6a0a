"""The cache folder's layout, moved once to the current one when a node opens a folder an
older version wrote: blocks/<mount>/<ab>/<cd>/<name> (two levels of fan-out) becomes
blocks/<mount>/<ab>/<name> (one, layout.block_path), a rename a block, so a restart after an
upgrade keeps the cache. The first process to open the folder moves it under layout.lock while
the others wait; the file `layout` then says the folder is current, and later opens read only
that. Blocking: a thread's.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os

from gateway.cache.layout import BLOCKS_DIR, NAME, fan_dirs, fan_out, is_mount_folder

log = logging.getLogger(__name__)

MARKER = "layout"
CURRENT = "2"  # 1: two levels of fan-out (no marker)
_LOCK = "layout.lock"


def ensure(root: str) -> int:
    """Bring the folder at `root` to the current layout; how many blocks were moved."""
    if _current(root):
        return 0
    os.makedirs(root, exist_ok=True)
    fd = os.open(os.path.join(root, _LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another process may be moving it: wait for it
        if _current(root):
            return 0
        moved = _move(root)
        mark(root)
        return moved
    finally:
        os.close(fd)


def mark(root: str) -> None:
    """Say the folder at `root` is in the current layout."""
    os.makedirs(root, exist_ok=True)
    tmp = os.path.join(root, f".{MARKER}.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(CURRENT + "\n")
    os.replace(tmp, os.path.join(root, MARKER))


def _current(root: str) -> bool:
    try:
        with open(os.path.join(root, MARKER)) as f:
            return f.read().strip() == CURRENT
    except FileNotFoundError:
        return False


def _move(root: str) -> int:
    moved = 0
    top = os.path.join(root, BLOCKS_DIR)
    with contextlib.suppress(FileNotFoundError), os.scandir(top) as mounts:
        for m in mounts:
            if not is_mount_folder(m.name) or not m.is_dir(follow_symlinks=False):
                continue
            for d1 in fan_dirs(m.path):
                for d2 in fan_dirs(d1.path):
                    moved += _move_leaf(d2.path, d1.path, d1.name + d2.name)
            fan_out(os.path.join(m.path, "00", "0"))
    if moved:
        log.info("cache: moved %d blocks to the cache folder's layout %s", moved, CURRENT)
    return moved


def _move_leaf(leaf: str, into: str, prefix: str) -> int:
    moved = 0
    with os.scandir(leaf) as entries:
        for entry in entries:
            if NAME.fullmatch(entry.name) and entry.name.startswith(prefix):
                os.rename(entry.path, os.path.join(into, entry.name))
                moved += 1
    with contextlib.suppress(OSError):
        os.rmdir(leaf)  # unless something not ours is in it: left alone, as the janitor does
    return moved
