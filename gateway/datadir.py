"""The node's data dir and cache dir are its own: folders 0700, files 0600, made so and checked
(and repaired) at start. Other users of the host read cached blocks only through the
short-circuit socket, which asks the node (docs/tenants.md, "The host")."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700
# The data dir itself, when the short-circuit socket lies in it: others may pass through to
# the socket (whose peer credentials decide), never list the folder or open what is in it.
PASSAGE_MODE = 0o711
UMASK = 0o077
# Where the workers of a node share their metrics (prometheus_client's multiprocess mode).
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


class NotPrivate(Exception):
    """A file or folder of the node that others may read and that this process cannot make
    private (another owner, a read-only mount)."""


@dataclass(frozen=True)
class Repaired:
    path: str
    was: int
    now: int


def private_umask() -> None:
    """Files and folders this process creates from now on are the node's alone."""
    os.umask(UMASK)


def make_private(
    data_dir: Path, cache_dir: Path, socket: Path | None, config_file: Path | None = None
) -> list[Repaired]:
    """Create the data dir and the cache dir as the node's own, make every file and folder
    created from now on private (the process's umask: SQLite's files, block files, the
    journal), and repair what an older version, a copy or a hand left readable. `socket`:
    the short-circuit socket, kept connectable for others. Returns what was repaired; raises
    NotPrivate where it cannot."""
    private_umask()
    passage = socket is not None and _real(socket.parent) == _real(data_dir)
    top = PASSAGE_MODE if passage else DIR_MODE
    repaired: list[Repaired] = []
    # Folders others could enter before this start: walked into below, whatever they are now.
    opened = {str(p) for p in (data_dir, cache_dir) if p.is_dir() and p.stat().st_mode & 0o077}
    for folder, mode in ((data_dir, top), (cache_dir, DIR_MODE)):
        if folder.is_dir():  # first what exists: what the process may not do says so
            _repair(folder, mode, repaired)
        folder.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    _repair(data_dir, top, repaired)  # made by mkdir under an umask not ours
    for root in [data_dir] if _inside(cache_dir, data_dir) else [data_dir, cache_dir]:
        for path, st in _walk(root, socket, opened):
            wanted = DIR_MODE if stat.S_ISDIR(st.st_mode) else FILE_MODE
            _repair(path, wanted, repaired, st)
    if config_file is not None:
        _repair(config_file, FILE_MODE, repaired)
    return repaired


def _repair(
    path: Path, wanted: int, repaired: list[Repaired], st: os.stat_result | None = None
) -> None:
    st = st or os.stat(path)
    mode = stat.S_IMODE(st.st_mode)
    # What the group and others may do is set; the owner's bits are left as they are.
    now = mode & ~0o077 | wanted & 0o077
    if now == mode:
        return
    try:
        os.chmod(path, now, follow_symlinks=False)
    except OSError as exc:
        raise NotPrivate(
            f"{path} is mode {mode:04o} (owner uid {st.st_uid}): other users of this host may "
            f"read the node's data, and this process (uid {os.geteuid()}) cannot make it "
            f"{wanted:04o}: {exc.strerror}. Make it so as its owner, e.g. "
            f"`chmod -R go= {path}`, or run the node as that user."
        ) from None
    if mode & ~now:  # something taken away (not the passage's x bits given)
        repaired.append(Repaired(str(path), mode, now))


def _walk(
    root: Path, socket: Path | None, opened: set[str]
) -> Iterator[tuple[Path, os.stat_result]]:
    """Every file and folder others could reach under root, not following links (a link's own
    mode means nothing; what it points to outside is not the node's), leaving out the socket.
    A folder that others could not enter (no group or other bits) is not walked into: what it
    holds is out of their reach, whatever its modes, and this version made it so (its files
    are 0600 too), so a start over a large cache costs a stat of each folder's first level."""
    skip = str(socket) if socket is not None else None
    stack = [str(root)]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            continue  # removed meanwhile (an eviction, a temp folder)
        for entry in entries:
            if entry.path == skip or entry.is_symlink():
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISSOCK(st.st_mode):
                continue
            yield Path(entry.path), st
            if stat.S_ISDIR(st.st_mode) and (st.st_mode & 0o077 or entry.path in opened):
                stack.append(entry.path)


def _real(path: Path) -> Path:
    return path.resolve()


def _inside(path: Path, folder: Path) -> bool:
    return _real(path).is_relative_to(_real(folder))


def prepare_metrics_dir(data_dir: Path) -> Path:
    """Before a node's workers start: an empty folder for their figures, named in the
    environment. prometheus_client reads it once, when it is imported, so this runs before
    anything imports it in the process the workers are forked from (gateway/edge.py)."""
    folder = data_dir / "metrics"
    if folder.exists():
        for stale in folder.iterdir():
            stale.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    os.environ[MULTIPROC_ENV] = str(folder)
    return folder
