"""The blocking steps on block files (layout.py says where they live). Call them on a thread.

A block being filled lives at inflight/<name>, created already locked (flock LOCK_EX) so that
any process can tell a live fill (lock held) from one whose process died (lock free). Only a
process holding that lock removes or renames the file, which is what keeps two processes from
removing each other's fills. A write-through's spooled blocks, .w.<token>.<index>, live as long
as their writer holds the lock on .w.<token> (also made under a private name and locked before
it gets its public one). A private name can be seen unlocked for the moment between its
creation and its lock, so a sweep leaves one alone for PRIVATE_GRACE seconds.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import threading
import time

from awscrt.checksums import crc32c

from gateway.cache import verity
from gateway.cache.freespace import FreeSpace
from gateway.cache.layout import (
    CLAIMS_LOCK,
    INFLIGHT_DIR,
    MAGIC_V1,
    PIECE,
    RETIRED_DIR,
    TRAILER_SIZE,
    Checksums,
    Corrupt,
    block_path,
    fan_out,
    inflight_path,
    parse_trailer,
    piece_crcs,
    retired_path,
    tail_size,
)
from gateway.cache.spare import Spares

log = logging.getLogger(__name__)

_READ = os.O_RDONLY | os.O_CLOEXEC
_CREATE = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
PRIVATE_GRACE = 10.0  # seconds a private name may stay unlocked before it counts as dead
_SPOOL = ".w."
RETIRED_MAX_AGE = 3600.0  # retired blocks older than this belong to a process that died


def pread_exact(fd: int, length: int, start: int) -> bytes:
    data = os.pread(fd, length, start)
    if len(data) == length:
        return data
    parts = [data]
    got = len(data)
    while got < length:
        more = os.pread(fd, length - got, start + got)
        if not more:
            raise Corrupt(f"file ends at {start + got}, wanted {start + length}")
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def read(path: str, data_len: int, start: int, length: int, verify: bool) -> bytes:
    """Bytes [start, start+length) of a committed block of `data_len` bytes.

    With `verify`, the CRC32C of what is read is checked (the whole block, or the pieces that
    hold the range): ~30 us a MiB here. Raises FileNotFoundError for a block that is
    not there, Corrupt for one that is damaged.
    """
    fd = os.open(path, _READ)
    try:
        return read_fd(fd, data_len, start, length, verify)
    finally:
        os.close(fd)


def read_fd(fd: int, data_len: int, start: int, length: int, verify: bool) -> bytes:
    """read(), from a block file opened already (a client given the descriptor by its node).
    A sealed file whose page the kernel refuses (EIO, verity.py) is Corrupt as any other."""
    try:
        if start == 0 and length == data_len:
            return _read_whole(fd, data_len, verify)
        return _read_range(fd, data_len, start, length, verify)
    except OSError as exc:
        if verity.refused(exc, fd):
            raise Corrupt("fs-verity refused a damaged page") from exc
        raise


def _read_whole(fd: int, data_len: int, verify: bool) -> bytes:
    data = pread_exact(fd, data_len, 0)
    # One byte more than the tail: a longer file is no block of ours either.
    tail = os.pread(fd, tail_size(data_len) + 1, data_len)
    _check_whole(data, tail, data_len, verify)
    return data


def read_resident(path: str, data_len: int, verify: bool) -> memoryview | None:
    """The whole block if all of it is in the page cache now, else None (or a block gone):
    read with RWF_NOWAIT, which never waits for the disk, so it may run on the event loop
    (a 1 MiB block: ~0.1 ms of copying, against ~0.1 ms of CPU for a thread hop and a wait
    behind the other reads). One read of the data and its tail; Corrupt as read()."""
    try:
        fd = os.open(path, _READ)
    except FileNotFoundError:
        return None
    try:
        return read_resident_fd(fd, data_len, verify)
    finally:
        os.close(fd)


def read_resident_fd(fd: int, data_len: int, verify: bool) -> memoryview | None:
    """read_resident() of an open block file."""
    tail_len = tail_size(data_len)
    buf = bytearray(data_len + tail_len + 1)  # one byte more: a longer file is no block
    try:
        got = os.preadv(fd, [buf], 0, os.RWF_NOWAIT)
    except BlockingIOError:
        return None
    # A read stops at the first page not in memory: too short to be the block is no answer
    # (the read on a thread tells a page out of memory from a file of the wrong size).
    view = memoryview(buf)
    if got < data_len + TRAILER_SIZE:
        return None
    parsed = parse_trailer(bytes(view[data_len : data_len + TRAILER_SIZE]))
    if parsed is not None and parsed[0] != MAGIC_V1 and got < data_len + tail_len:
        return None
    _check_whole(view[:data_len], bytes(view[data_len:got]), data_len, verify)
    return view[:data_len]


def check(fd: int, data_len: int) -> None:
    """Read the whole block and check it (size, trailer, CRC32C): Corrupt if it is damaged.
    Blocking; it also brings the block into the page cache."""
    read_fd(fd, data_len, 0, data_len, True)


def _check_whole(data: bytes | memoryview, tail: bytes, data_len: int, verify: bool) -> None:
    parsed = parse_trailer(tail[:TRAILER_SIZE])
    if parsed is None:
        raise Corrupt("no block trailer")
    magic, length, crc, _, piece = parsed
    if length != data_len:
        raise Corrupt(f"trailer says {length} bytes, expected {data_len}")
    expected = TRAILER_SIZE if magic == MAGIC_V1 else tail_size(data_len)
    if len(tail) != expected or (magic != MAGIC_V1 and piece != PIECE):
        raise Corrupt(f"block file of {data_len + len(tail)} bytes, pieces of {piece}")
    if verify and crc32c(data) != crc:
        raise Corrupt("block checksum mismatch")


def _read_range(fd: int, data_len: int, start: int, length: int, verify: bool) -> bytes:
    if length <= 0:
        return b""
    if not verify:
        size = os.fstat(fd).st_size
        if size not in (data_len + tail_size(data_len), data_len + TRAILER_SIZE):
            raise Corrupt(f"block file of {size} bytes")
        return pread_exact(fd, length, start)
    first, last = start // PIECE, (start + length - 1) // PIECE
    head = os.pread(fd, TRAILER_SIZE, data_len)
    parsed = parse_trailer(head)
    if parsed is None:
        raise Corrupt("no block trailer")
    magic, size, _, _, piece = parsed
    if size != data_len:
        raise Corrupt(f"trailer says {size} bytes, expected {data_len}")
    if magic == MAGIC_V1:
        # Written before the table: only the whole block can be checked.
        return _read_whole(fd, data_len, True)[start : start + length]
    if piece != PIECE:
        raise Corrupt(f"pieces of {piece} bytes")
    # The entry of the piece before the first read (the seed; none for the first piece) and
    # that of the last piece read.
    before = max(first - 1, 0)
    raw = os.pread(fd, 4 * (last - before + 1), data_len + TRAILER_SIZE + 4 * before)
    if len(raw) != 4 * (last - before + 1):
        raise Corrupt("block file with a short piece table")
    table = piece_crcs(raw)
    lo, hi = first * PIECE, min(data_len, (last + 1) * PIECE)
    data = pread_exact(fd, hi - lo, lo)
    if crc32c(data, table[0] if first else 0) != table[-1]:
        raise Corrupt(f"checksum mismatch in pieces {first}-{last}")
    if lo == start and hi == start + length:
        return data
    return data[start - lo : start - lo + length]


def remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError:
        log.warning("cache: could not remove %s", path, exc_info=True)


def _held(path: str) -> bool | None:
    """Whether a process holds the lock on the file at `path` (None: there is no such file)."""
    try:
        fd = os.open(path, _READ)
    except FileNotFoundError:
        return None
    try:
        return filler_alive(fd)
    finally:
        os.close(fd)


def _private(directory: str, stem: str) -> tuple[int, str]:
    """A new file under a private name in `directory`, already locked."""
    path = f"{directory}/.{stem}.{secrets.token_hex(6)}"
    fd = os.open(path, _CREATE, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        remove(path)
        raise
    return fd, path


# -- fills ------------------------------------------------------------------------------------

CLAIMED = "claimed"  # the fd is ours, locked, at inflight/<name>: fetch and write the block
FOLLOW = "follow"  # the fd reads another process's live fill: tail it
PRESENT = "present"  # the block was committed meanwhile: read it (the fd is None)
LATER = "later"  # claim(at_once=True) cannot tell without waiting: claim() on a thread (None)


def claim(
    root: str, mount_id: int, name: str, spares: Spares | None = None, at_once: bool = False
) -> tuple[str, int | None]:
    """Become the one filler of block `name` on this node, or find who is.

    Takes a spare file (spare.py: empty, locked) or else creates the in-flight file under a
    private name and locks it, then links it to its public name: the file is never visible
    unlocked, so a lock that can be taken means a dead filler.

    `at_once`: the event loop's try (a miss then waits for no thread): calls on names in
    folders every fill uses, as a hit's open of its block file; LATER where it needs more (no
    spare listed already, another filler's file to look into).
    """
    public = inflight_path(root, name)
    final = block_path(root, mount_id, name)
    for _ in range(100):
        if os.path.exists(final):
            return PRESENT, None
        spare = spares.take(listed_only=at_once) if spares is not None else None
        if spare is None and at_once:
            return LATER, None
        fd, private = spare or _private(f"{root}/{INFLIGHT_DIR}", name)
        try:
            os.link(private, public)
        except FileExistsError:
            os.close(fd)  # a spare stays one (still empty); a private file is removed below
            if spare is not None and spares is not None:
                spares.give_back(private)
        except FileNotFoundError:
            os.close(fd)  # a sweep took our private name for a dead one: make another
            continue
        except BaseException:
            os.close(fd)
            if spare is None:
                remove(private)
            raise
        else:
            remove(private)
            # Committed between the check above and the link: someone else already filled it.
            if os.path.exists(final):
                os.unlink(public)
                os.close(fd)
                return PRESENT, None
            return CLAIMED, fd
        if spare is None:
            remove(private)
        if at_once:
            return LATER, None
        found = _busy(root, mount_id, name)
        if found is not None:
            return found
    raise OSError(f"could not claim the fill of block {name}")


def _busy(root: str, mount_id: int, name: str) -> tuple[str, int | None] | None:
    """Block `name` has a public in-flight file that is not ours: FOLLOW its live filler, or
    None (look again) once a dead one's file is removed or the fill just ended."""
    public = inflight_path(root, name)
    try:
        theirs = os.open(public, _READ)
    except FileNotFoundError:
        return None  # it just ended: look again
    if filler_alive(theirs):
        return FOLLOW, theirs
    _remove_dead(theirs, public)
    os.close(theirs)
    return None


def claim_all(
    root: str,
    mount_id: int,
    names: list[str],
    block: str | None = None,
    spares: Spares | None = None,
    group: str | None = None,
) -> tuple[list[tuple[str, int | None]], bool]:
    """claim() of each of `names` (the sub-blocks of one block), then whether `block` is being
    filled or is committed: a sub-block fill that finds so gives its claims up and reads the
    block instead. Claiming first and looking second (a block fill does the opposite: claims
    the block, then looks for sub-blocks) means that of a block fill and a sub-block fill
    racing, at least one sees the other, so no byte is fetched by both.

    `group` (the block's name): the claims of one block's sub-blocks are made by one process
    at a time (a byte of <root>/claims.lock locked for them), so that two workers asking for
    the same range at once do not each claim part of it and fetch it in two requests."""
    claims: list[tuple[str, int | None]] = []
    held = _lock_group(root, group) if group is not None else None
    try:
        for name in names:
            claims.append(claim(root, mount_id, name, spares))
    except BaseException:
        release_all(root, names, claims)
        raise
    finally:
        if held is not None:
            fcntl.lockf(held[0], fcntl.LOCK_UN, 1, held[1])
    busy = block is not None and (
        os.path.exists(inflight_path(root, block))
        or os.path.exists(block_path(root, mount_id, block))
    )
    return claims, busy


_GROUPS = 1 << 20  # bytes of claims.lock a block's name is hashed to
_group_files: dict[str, int] = {}  # root -> the process's descriptor of its claims.lock
_group_lock = threading.Lock()


def _lock_group(root: str, group: str) -> tuple[int, int] | None:
    """Lock the byte of <root>/claims.lock that `group` hashes to (a POSIX record lock: it
    excludes other processes; the threads of this one share it, whose fills the in-process
    table keeps apart); the descriptor stays open for the process's life, since closing any
    descriptor of the file would drop all of the process's locks on it. None if it cannot be
    opened (claims go on unserialized, as before)."""
    with _group_lock:
        fd = _group_files.get(root)
        if fd is None:
            try:
                fd = os.open(f"{root}/{CLAIMS_LOCK}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError:
                return None
            _group_files[root] = fd
    offset = int(group[:8], 16) % _GROUPS
    fcntl.lockf(fd, fcntl.LOCK_EX, 1, offset)
    return fd, offset


def release_all(root: str, names: list[str], claims: list[tuple[str, int | None]]) -> None:
    """Give up claims made by claim_all: our fills' files removed, others' descriptors closed."""
    for name, (how, fd) in zip(names, claims, strict=False):
        if fd is None:
            continue
        if how == CLAIMED:
            discard(fd, root, name)
        else:
            close(fd)


def present_all(root: str, mount_id: int, names: list[str]) -> list[bool]:
    """For each name, whether it is committed or being filled (a sub-block a block fill can
    take instead of fetching its bytes)."""
    return [
        os.path.exists(block_path(root, mount_id, name))
        or os.path.exists(inflight_path(root, name))
        for name in names
    ]


MISSING = "missing"
CORRUPT = "corrupt"


def read_each(
    reads: list[tuple[str, int, int, int, bool]], first_wins: bool = False
) -> list[bytes | str]:
    """read() of several files in one go, as (path, data length, start, length, verify): the
    bytes, or MISSING (no such file, or unreadable now), or CORRUPT (damaged: removed).
    `first_wins`: if the first file is read, the others are not (the list has one entry)."""
    out: list[bytes | str] = []
    for path, data_len, start, length, verify in reads:
        if first_wins and len(out) == 1 and isinstance(out[0], bytes):
            break
        try:
            out.append(read(path, data_len, start, length, verify))
        except Corrupt as exc:
            log.warning("cache: dropped damaged block %s: %s", path, exc)
            remove(path)
            out.append(CORRUPT)
        except OSError:
            out.append(MISSING)
    return out


def filler_alive(fd: int) -> bool:
    """Whether a process holds the fill lock of this in-flight file."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def _remove_dead(fd: int, public: str) -> bool:
    """Remove a dead filler's file, but only if `public` still names it (and hold its lock while
    looking, so that two processes cleaning up cannot remove a fill a third one just made)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    try:
        mine = os.fstat(fd)
        with contextlib.suppress(FileNotFoundError):
            now = os.stat(public)
            if (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
                os.unlink(public)
                return True
        return False
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def follow(fd: int, offset: int, limit: int) -> tuple[bytes, bool]:
    """The bytes of another process's fill from `offset` (up to `limit`), and whether its
    filler still lives (asked only when there were no new bytes)."""
    data = os.pread(fd, limit, offset)
    if data:
        return data, True
    return b"", filler_alive(fd)


def write_all(fd: int, data: bytes | bytearray | memoryview, tail: bytes = b"") -> None:
    """All of `data`, then `tail`: one writev as a rule (a block's bytes are not copied again
    to be joined to their trailer); a short write goes on from where it stopped."""
    parts = [memoryview(data), memoryview(tail)]
    while parts:
        wrote = os.writev(fd, parts)
        while parts and wrote >= len(parts[0]):
            wrote -= len(parts.pop(0))
        if parts:
            parts[0] = parts[0][wrote:]


def commit(
    fd: int, root: str, mount_id: int, name: str, data: bytes, tail: bytes, sync: bool,
    min_free: int, seal: bool = False, space: FreeSpace | None = None,
) -> bool:  # fmt: skip
    """Write the last bytes and the tail (trailer and piece table), with `seal` seal the file
    (fs-verity, verity.py), rename the block into place, release the lock.

    Returns False (and keeps nothing) when the disk's free space has dropped below `min_free`
    (as `space` counts it, or asked of the file system).
    fdatasync is optional: a block torn by a power cut fails its checksum and is refetched.
    """
    public = inflight_path(root, name)
    try:
        write_all(fd, data, tail)
        if sync:
            os.fdatasync(fd)
        if min_free and (space or FreeSpace(root, every=0)).below(min_free, len(data) + len(tail)):
            os.unlink(public)
            return False
        if seal:
            # fs-verity seals no file open for writing: the fill's lock moves to a read-only
            # descriptor, and the file is sealed under it.
            writable, fd = fd, os.open(f"/proc/self/fd/{fd}", _READ)
            os.close(writable)
            _relock(fd, public)
            _seal(fd, public)
        dest = block_path(root, mount_id, name)
        try:
            os.rename(public, dest)
        except FileNotFoundError:
            fan_out(dest)  # the mount's first block
            os.rename(public, dest)
    except _Lost:
        log.info("cache: the fill of block %s was taken for a dead one while sealed", name)
        return False
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(public)
        raise
    finally:
        os.close(fd)
    return True


class _Lost(Exception):
    """Another process removed our fill's file in the moment its lock was not held."""


def _relock(fd: int, public: str) -> None:
    """Take the fill's lock again on `fd` (its file open read-only). It was free for a moment:
    another process may have removed the file as a dead fill's meanwhile; _Lost then (the
    public name may be a new fill's by now, not ours to touch)."""
    fcntl.flock(fd, fcntl.LOCK_EX)
    mine = os.fstat(fd)
    try:
        now = os.stat(public)
    except FileNotFoundError:
        raise _Lost from None
    if (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
        raise _Lost


def _seal(fd: int, path: str) -> None:
    """Seal the block file (verity.py). One the disk could not seal is kept unsealed: zero-copy
    sends check it as they check any (docs/cache.md, "Sealed blocks")."""
    try:
        verity.seal(fd)
    except OSError as exc:
        log.warning("cache: could not seal block %s: %s", path, exc)


def discard(fd: int, root: str, name: str) -> None:
    """Give up a claimed fill: remove its file (still under our lock), then unlock."""
    try:
        remove(inflight_path(root, name))
    finally:
        os.close(fd)


def close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def _age(entry: os.DirEntry[str], now: float) -> float:
    try:
        return now - entry.stat(follow_symlinks=False).st_mtime
    except FileNotFoundError:
        return 0.0


# -- write-through ----------------------------------------------------------------------------


def spool_lock(root: str, spares: Spares | None = None) -> tuple[int, str]:
    """The lock a writer holds while it spools blocks: (fd, its path .w.<token>). Spooled blocks
    are named <path>.<index>. A spare file (locked when taken) is the lock when there is one:
    a write makes no inode, as a miss makes none."""
    directory = f"{root}/{INFLIGHT_DIR}"
    fd, private = (spares.take() if spares is not None else None) or _private(directory, "lock")
    path = f"{directory}/{_SPOOL}{secrets.token_hex(8)}"
    try:
        os.rename(private, path)
    except BaseException:
        os.close(fd)
        remove(private)
        raise
    return fd, path


def spool(
    lock: str, index: int, data: bytes, flags: int, seal: bool = False, spares: Spares | None = None
) -> str:
    """Write a whole block whose bytes are at hand (a PUT's write-through) under its writer's
    lock, sealed with `seal` (as commit() seals); install_all renames it once the version is
    known. A spare file is renamed to the block's spool name (before a byte is written: a
    sweep that finds it there with its writer gone removes it) where there is one."""
    path = f"{lock}.{index}"
    sums = Checksums()
    sums.update(data)
    taken = spares.take() if spares is not None else None
    if taken is None:
        fd = os.open(path, _CREATE, 0o600)
    else:
        fd, spare_path = taken
        try:
            os.rename(spare_path, path)
        except BaseException:
            os.close(fd)  # still an empty spare, where it was
            raise
    try:
        write_all(fd, data, sums.tail(flags))
    except BaseException:
        os.close(fd)
        remove(path)
        raise
    os.close(fd)
    if seal:
        fd = os.open(path, _READ)
        try:
            _seal(fd, path)
        finally:
            os.close(fd)
    return path


def unlock_spool(fd: int, lock: str) -> None:
    """The writer is done: its spooled blocks are installed or removed."""
    try:
        remove(lock)
    finally:
        os.close(fd)


def install_all(moves: list[tuple[str, str]]) -> None:
    """Rename spooled blocks into place (a block already there holds the same bytes)."""
    for tmp, dest in moves:
        try:
            os.replace(tmp, dest)
        except FileNotFoundError:
            fan_out(dest)  # the mount's first block
            os.replace(tmp, dest)


def remove_all(paths: list[str]) -> None:
    for path in paths:
        remove(path)


# -- invalidated versions ---------------------------------------------------------------------


def retire_all(root: str, mount_id: int, names: list[str]) -> None:
    """Move the blocks of an invalidated version out of blocks/ (no new read finds them there)
    into retired/ (a read of that version under way still does)."""
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.rename(block_path(root, mount_id, name), retired_path(root, name))


def sweep_retired(root: str, older_than: float = RETIRED_MAX_AGE) -> int:
    """Remove retired blocks moved there more than `older_than` seconds ago (their process
    died before it removed them). Returns how many went."""
    removed = 0
    now = time.time()
    with contextlib.suppress(FileNotFoundError), os.scandir(f"{root}/{RETIRED_DIR}") as entries:
        for entry in entries:
            try:
                moved = entry.stat(follow_symlinks=False).st_ctime  # a rename sets it
            except FileNotFoundError:
                continue
            if now - moved > older_than:
                remove(entry.path)
                removed += 1
    return removed


# -- leftovers --------------------------------------------------------------------------------


def sweep_inflight(root: str) -> int:
    """Remove what dead processes left in inflight/: fills whose filler is dead, spooled blocks
    whose writer is gone, and private names unlocked for longer than PRIVATE_GRACE. Safe while
    other processes fill and write: nothing live is touched. Returns how many went."""
    removed = 0
    now = time.time()
    directory = f"{root}/{INFLIGHT_DIR}"
    with contextlib.suppress(FileNotFoundError), os.scandir(directory) as entries:
        for entry in entries:
            name = entry.name
            if name.startswith(_SPOOL):
                lock, dot, _ = name[len(_SPOOL) :].partition(".")
                # A spooled block is made after its lock is held; a lock is locked before it
                # gets this name: either unlocked (or gone) means its writer is.
                if _held(f"{directory}/{_SPOOL}{lock}" if dot else entry.path):
                    continue
            elif name.startswith("."):
                if _age(entry, now) <= PRIVATE_GRACE or _held(entry.path):
                    continue
            else:
                try:
                    fd = os.open(entry.path, _READ)
                except FileNotFoundError:
                    continue
                try:
                    if not filler_alive(fd) and _remove_dead(fd, entry.path):
                        removed += 1
                finally:
                    os.close(fd)
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
                removed += 1
    return removed
