"""Spare block files (gateway/cache/spare.py): an evicted block's file becomes an empty spare
only when no one has it open, a fill takes a spare instead of making a file, and a spare is
never handed out with bytes in it or to two fillers at once."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.cache import blockfile, relayout, spare
from gateway.cache.freespace import FreeSpace, free_bytes
from gateway.cache.janitor import Janitor
from gateway.cache.layout import SPARE_DIR, Checksums, block_path, inflight_path
from tests.unit.test_cache_janitor import DATA, SIZE, fill_blocks, name_of

MOUNT = 1


@pytest.fixture
def root(tmp_path: Path) -> str:
    path = str(tmp_path / "cache")
    for sub in ("blocks", "inflight", SPARE_DIR):
        os.makedirs(os.path.join(path, sub))
    return path


def _spares(root: str) -> list[str]:
    """The spares in spare/ (as a taker lists them: not the names of a dot, spares being
    made or recycled)."""
    return sorted(n for n in os.listdir(os.path.join(root, SPARE_DIR)) if not n.startswith("."))


def _commit(root: str, fd: int, name: str, data: bytes) -> None:
    sums = Checksums()
    sums.update(data)
    assert blockfile.commit(fd, root, MOUNT, name, data, sums.tail(0), False, 0)


def test_an_evicted_file_no_one_has_open_becomes_an_empty_spare(root: str) -> None:
    assert spare.quiet_lease_breaks()  # as Janitor.start does, in the main thread
    fill_blocks(root, MOUNT, range(10))
    janitor = Janitor(root, 5 * SIZE, 0, interval=3600.0)
    janitor.run_once()
    assert janitor.recycled == 5
    kept = [i for i in range(10) if os.path.exists(block_path(root, MOUNT, name_of(i).hex()))]
    assert len(kept) == 5
    names = _spares(root)
    assert len(names) >= 5  # the recycled ones, and the few made ahead
    assert all(os.path.getsize(os.path.join(root, SPARE_DIR, n)) == 0 for n in names)
    janitor.stop()


def test_an_evicted_file_someone_reads_keeps_its_bytes_and_is_removed(root: str) -> None:
    fill_blocks(root, MOUNT, range(1))
    path = block_path(root, MOUNT, name_of(0).hex())
    reader = os.open(path, os.O_RDONLY)  # a reader, a zero-copy send, a short-circuit client
    assert spare.quiet_lease_breaks()
    try:
        before = _spares(root)
        assert not spare.recycle(root, path)
        assert not os.path.exists(path)
        assert _spares(root) == before
        assert os.pread(reader, DATA, 0) == b"x" * DATA  # the old bytes, whole
    finally:
        os.close(reader)


def test_a_fill_takes_a_spare_instead_of_making_a_file(root: str) -> None:
    assert spare.make(root, 3) == 3
    inodes = {os.stat(os.path.join(root, SPARE_DIR, n)).st_ino for n in _spares(root)}
    spares = spare.Spares(root)
    name = "ab" * 32
    how, fd = blockfile.claim(root, MOUNT, name, spares)
    assert how == blockfile.CLAIMED and fd is not None
    assert os.fstat(fd).st_ino in inodes
    assert len(_spares(root)) == 2
    _commit(root, fd, name, b"y" * 1000)
    committed = os.stat(block_path(root, MOUNT, name))
    assert committed.st_ino in inodes
    assert blockfile.read(block_path(root, MOUNT, name), 1000, 0, 1000, True) == b"y" * 1000
    assert spares.taken == 1


def test_a_spare_is_taken_by_one_filler_only(root: str) -> None:
    assert spare.make(root, 1) == 1
    first, second, third = spare.Spares(root), spare.Spares(root), spare.Spares(root)
    taken = first.take()
    assert taken is not None
    assert second.take() is None  # locked by the first
    how, fd = blockfile.claim(root, MOUNT, "cd" * 32, first)  # none left: a file is made
    assert how == blockfile.CLAIMED and fd is not None
    blockfile.discard(fd, root, "cd" * 32)
    os.close(taken[0])
    assert third.take() is not None  # given back untouched: still a spare


def test_a_claim_that_finds_a_live_fill_leaves_its_spare_a_spare(root: str) -> None:
    name = "ef" * 32
    how, fd = blockfile.claim(root, MOUNT, name)
    assert how == blockfile.CLAIMED and fd is not None
    assert spare.make(root, 1) == 1
    spares = spare.Spares(root)
    how2, theirs = blockfile.claim(root, MOUNT, name, spares)
    assert how2 == blockfile.FOLLOW and theirs is not None
    os.close(theirs)
    assert len(_spares(root)) == 1 and spares.take() is not None
    assert os.path.exists(inflight_path(root, name))
    blockfile.discard(fd, root, name)


def test_a_spare_with_bytes_is_never_handed_out(root: str) -> None:
    assert spare.make(root, 1) == 1
    (name,) = _spares(root)
    with open(os.path.join(root, SPARE_DIR, name), "wb") as f:
        f.write(b"left over")
    assert spare.Spares(root).take() is None


def test_spares_are_made_aside_and_moved_in_and_a_dead_maker_s_are_swept(root: str) -> None:
    # Made in spare/.new/ (a create holds its folder's lock while the inode is allocated, and
    # claims remove names from spare/ on the event loop), then moved into spare/.
    staging = os.path.join(root, SPARE_DIR, ".new")
    assert spare.make(root, 5) == 5
    assert len(_spares(root)) == 5 and os.listdir(staging) == []
    assert spare.count(root) == 5  # the folder of those being made is not a spare
    taker = spare.Spares(root)
    taken = [taker.take() for _ in range(6)]
    assert sum(t is not None for t in taken) == 5
    for t in taken:
        if t is not None:
            os.close(t[0])
    # A janitor that died between a create and its move left one behind: swept.
    Path(staging, "dead0").touch()
    assert spare.sweep(root) == 1 and os.listdir(staging) == []


def test_a_mount_s_first_block_makes_all_its_directories_and_no_later_miss_makes_one(
    root: str,
) -> None:
    made = []
    for i in range(40):
        name = f"{i:02x}" * 32
        how, fd = blockfile.claim(root, MOUNT, name)
        assert how == blockfile.CLAIMED and fd is not None
        _commit(root, fd, name, b"z" * 10)
        made.append(len(os.listdir(os.path.join(root, "blocks", str(MOUNT)))))
    assert made == [256] * 40
    assert blockfile.read(block_path(root, MOUNT, "27" * 32), 10, 0, 10, True) == b"z" * 10


def test_a_cache_written_with_two_levels_of_directories_is_moved_once_and_kept(
    root: str,
) -> None:
    names = [f"{i:02x}" * 32 for i in range(5)]
    for name in names:
        old = os.path.join(root, "blocks", str(MOUNT), name[:2], name[2:4], name)
        os.makedirs(os.path.dirname(old), exist_ok=True)
        with open(old, "wb") as f:
            sums = Checksums()
            sums.update(b"q" * 10)
            f.write(b"q" * 10 + sums.tail(0))
    assert relayout.ensure(root) == len(names)
    for name in names:
        assert blockfile.read(block_path(root, MOUNT, name), 10, 0, 10, True) == b"q" * 10
        assert not os.path.exists(os.path.join(root, "blocks", str(MOUNT), name[:2], name[2:4]))
    assert relayout.ensure(root) == 0  # the folder says it is current now


def _hold_a_lease(path: str, ready: Any) -> None:
    """A janitor's process holding a write lease when an opener comes: the kernel sends it
    SIGIO, whose default action would end it. It lets the lease go once the break begins."""
    spare.quiet_lease_breaks()
    fd = os.open(path, os.O_RDWR)
    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
    ready.set()
    while fcntl.fcntl(fd, fcntl.F_GETLEASE) == fcntl.F_WRLCK:
        time.sleep(0.001)  # the break is the kernel's to begin: polled, it has no event
    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    os.close(fd)


def test_an_open_that_breaks_the_janitor_s_lease_does_not_end_its_process(root: str) -> None:
    path = os.path.join(root, SPARE_DIR, "leased")
    with open(path, "wb"):
        pass
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_a_lease, args=(path, ready))
    holder.start()
    try:
        assert ready.wait(60)
        fd = os.open(path, os.O_RDONLY)  # waits for the holder to let the lease go
        os.close(fd)
        holder.join(60)
        assert holder.exitcode == 0  # -SIGIO had SIGIO kept its default action
    finally:
        if holder.is_alive():
            holder.kill()
            holder.join()


def _age_folder(root: str) -> None:
    """Date spare/ back, so that a spare made next changes its mtime whatever the file
    system's clock tick (a listing and a make within one tick would see the same mtime)."""
    os.utime(os.path.join(root, SPARE_DIR), (1_000_000, 1_000_000))


def test_a_dry_pool_lists_its_folder_again_only_once_it_changed_or_a_second_passed(
    root: str,
) -> None:
    now = [100.0]
    spares = spare.Spares(root, clock=lambda: now[0])
    _age_folder(root)
    assert spares.take() is None
    assert spares.listings == 1
    for _ in range(20):  # misses while the janitor is not keeping up: a stat each, no listing
        assert spares.take() is None
    assert spares.listings == 1
    assert spare.make(root, 2) == 2  # the folder changed: listed at the next miss
    first = spares.take()
    assert first is not None and spares.listings == 2
    second = spares.take()  # from the listing's names
    assert second is not None and spares.listings == 2
    _age_folder(root)
    assert spares.take() is None and spares.listings == 3  # dry again: listed once
    assert spares.take() is None and spares.listings == 3
    os.close(second[0])  # given back (a claim lost): the folder is unchanged
    assert spares.take() is None and spares.listings == 3
    now[0] += spare.RELIST_AFTER  # a change within a tick is seen a second later at most
    again = spares.take()
    assert again is not None and again[1] == second[1] and spares.listings == 4
    for fd, _ in (first, again):
        os.close(fd)


def test_a_write_through_spools_into_spares_and_a_dead_writer_s_are_swept(root: str) -> None:
    assert spare.make(root, 3) == 3
    inodes = {os.stat(os.path.join(root, SPARE_DIR, n)).st_ino for n in _spares(root)}
    spares = spare.Spares(root)
    lock_fd, lock = blockfile.spool_lock(root, spares)
    data = b"w" * 5000
    spooled = blockfile.spool(lock, 0, data, 0, False, spares)
    assert os.fstat(lock_fd).st_ino in inodes and os.stat(spooled).st_ino in inodes
    assert _spares(root) and len(_spares(root)) == 1 and spares.taken == 2
    assert blockfile.sweep_inflight(root) == 0  # its writer holds the lock: kept
    # A second writer dies with a block spooled: its lock and block go with the next sweep.
    dead_fd, dead = blockfile.spool_lock(root, spares)
    dead_block = blockfile.spool(dead, 0, b"d" * 100, 0, False, spares)  # no spare left: made
    assert os.stat(dead_block).st_ino not in inodes
    os.close(dead_fd)
    assert blockfile.sweep_inflight(root) == 2
    assert not os.path.exists(dead) and not os.path.exists(dead_block)
    # The live writer installs its block: the bytes whole, with their checksums.
    dest = block_path(root, MOUNT, "12" * 32)
    blockfile.install_all([(spooled, dest)])
    blockfile.unlock_spool(lock_fd, lock)
    assert blockfile.read(dest, len(data), 0, len(data), True) == data
    assert os.stat(dest).st_ino in inodes


def test_a_claim_at_once_takes_a_listed_spare_and_never_lists_or_makes_a_file(root: str) -> None:
    # The event loop's claim (fills.py): a spare the process listed before, else LATER for a
    # claim on a thread, which lists spare/ (or makes a file) where the loop must not wait.
    assert spare.make(root, 2) == 2
    spares = spare.Spares(root)
    first, second = "a1" * 32, "b2" * 32
    assert blockfile.claim(root, MOUNT, first, spares, at_once=True) == (blockfile.LATER, None)
    assert spares.listings == 0 and len(_spares(root)) == 2  # nothing listed, nothing taken
    assert not os.path.exists(inflight_path(root, first))
    how, fd = blockfile.claim(root, MOUNT, first, spares)  # on a thread: lists, takes one
    assert how == blockfile.CLAIMED and fd is not None and spares.listings == 1
    how2, fd2 = blockfile.claim(root, MOUNT, second, spares, at_once=True)
    assert how2 == blockfile.CLAIMED and fd2 is not None
    assert spares.listings == 1 and _spares(root) == []  # the listed one, no listing
    assert fcntl.flock(fd2, fcntl.LOCK_EX | fcntl.LOCK_NB) is None  # ours, locked
    entries = os.listdir(os.path.join(root, "inflight"))
    assert sorted(entries) == sorted([first, second])  # no private name left behind
    _commit(root, fd2, second, b"z" * 100)
    # Committed: at once it says so; none listed left: LATER, not a new file.
    assert blockfile.claim(root, MOUNT, second, spares, at_once=True) == (blockfile.PRESENT, None)
    third = "c3" * 32
    assert blockfile.claim(root, MOUNT, third, spares, at_once=True) == (blockfile.LATER, None)
    assert sorted(os.listdir(os.path.join(root, "inflight"))) == [first]
    blockfile.discard(fd, root, first)


def test_a_claim_at_once_that_finds_a_live_fill_leaves_it_to_a_thread(root: str) -> None:
    name = "d4" * 32
    how, fd = blockfile.claim(root, MOUNT, name)  # another filler's, live
    assert how == blockfile.CLAIMED and fd is not None
    assert spare.make(root, 1) == 1
    spares = spare.Spares(root)
    assert spares._relist()  # listed before, as a claim on a thread lists it
    assert blockfile.claim(root, MOUNT, name, spares, at_once=True) == (blockfile.LATER, None)
    assert spare.count(root) == 1 and spares.take() is not None  # still a spare, given back
    how2, theirs = blockfile.claim(root, MOUNT, name, spares)  # the thread's: follows it
    assert how2 == blockfile.FOLLOW and theirs is not None
    os.close(theirs)
    blockfile.discard(fd, root, name)


def test_a_commit_s_floor_is_asked_of_the_file_system_now_and_then_and_each_time_near_it(
    root: str,
) -> None:
    """The free-space floor (cache_min_free) is checked at each commit without a statvfs
    each time far from it (a system call on a cache-io thread waits for the GIL), and with
    one each time near it; a commit below it keeps nothing."""
    now = [0.0]
    space = FreeSpace(root, every=0.05, near=256 << 20, clock=lambda: now[0])
    free = free_bytes(root)
    assert not space.below(1, 100 << 10) and space.asked == 1
    for _ in range(10):
        assert not space.below(1, 100 << 10)
    assert space.asked == 1  # far from the floor: what it wrote taken off the last figure
    now[0] += 0.05
    assert not space.below(1, 100 << 10) and space.asked == 2  # and asked again in time
    near = max(1, free - (100 << 20))  # the floor 100 MiB below what is free: near it
    for _ in range(3):
        assert not space.below(near, 100 << 10)
    assert space.asked == 5
    names = [f"{i:064x}" for i in (1, 2)]
    data = b"x" * (100 << 10)
    sums = Checksums()
    sums.update(data)
    how, fd = blockfile.claim(root, MOUNT, names[0])
    assert how == blockfile.CLAIMED and fd is not None
    assert not blockfile.commit(fd, root, MOUNT, names[0], data, sums.tail(0), False,
                                free + (1 << 30), space=space)  # fmt: skip
    assert space.asked == 6
    assert not os.path.exists(block_path(root, MOUNT, names[0]))
    assert not os.path.exists(inflight_path(root, names[0]))
    how, fd = blockfile.claim(root, MOUNT, names[1])
    assert fd is not None
    assert blockfile.commit(fd, root, MOUNT, names[1], data, sums.tail(0), False, 1, space=space)
    assert os.path.exists(block_path(root, MOUNT, names[1]))


@pytest.mark.parametrize("short", [0, 5, 10, 12])
def test_a_block_and_its_trailer_are_written_whole_however_short_a_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, short: int
) -> None:
    """A block's bytes and its trailer go in one writev, not joined first; a short write (the
    kernel may stop early) is written on from where it stopped, in either part."""
    real = os.writev
    calls: list[int] = []

    def writev(fd: int, parts: list[memoryview]) -> int:
        calls.append(fd)
        if len(calls) > 1:
            return real(fd, parts)
        return real(fd, [b"".join(parts)[:short]]) if short else 0  # the first call stops short

    monkeypatch.setattr(os, "writev", writev)
    path = tmp_path / "block"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        blockfile.write_all(fd, b"0123456789", b"trail")
    finally:
        os.close(fd)
    assert path.read_bytes() == b"0123456789trail"
