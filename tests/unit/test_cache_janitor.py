"""The page store's janitor, journals and snapshot, on real files, with real processes where
who holds a lock matters: one janitor per directory, takeover after SIGKILL, one budget for
every writer, capacity and free-space floor, restart from a snapshot, rescans."""

from __future__ import annotations

import base64
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from multiprocessing.process import BaseProcess
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path

import pytest

from gateway.cache import spare
from gateway.cache.janitor import Janitor, read_stats
from gateway.cache.journal import FILL, RECORD, JournalWriter, load_snapshot
from gateway.cache.keyrecords import KeyRecords
from gateway.cache.layout import (
    BLOCKS_DIR,
    JOURNAL_DIR,
    SNAPSHOT,
    block_path,
    trailer,
)
from gateway.cache.pages import key_name
from tests.support.net import eventually

DATA = 100  # data bytes of the small blocks
SIZE = DATA + 32  # their size on disk
_spawn = multiprocessing.get_context("spawn")


def name_of(i: int) -> bytes:
    return i.to_bytes(4, "big") * 8


def make_block(root: str, mount: int, i: int, data: int = DATA) -> str:
    path = block_path(root, mount, name_of(i).hex())
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(b"x" * data + trailer(data, 0, 0))
    return path


def fill_blocks(root: str, mount: int, numbers: range, data: int = DATA) -> None:
    """Commit blocks the way a worker does: file first, then a journal record."""
    journal = JournalWriter(root)
    for i in numbers:
        make_block(root, mount, i, data)
        journal.fill(name_of(i), data + 32, mount, False)
    journal.close()


def on_disk(root: str, mount: int, numbers: range) -> list[int]:
    return [i for i in numbers if os.path.exists(block_path(root, mount, name_of(i).hex()))]


def janitor_process(root: str, capacity: int, acting: Synchronized[int]) -> None:
    """A worker process's janitor, reporting whether it is the one acting."""
    janitor = Janitor(root, capacity, 0, interval=0.05, snapshot_interval=3600.0)
    janitor.start()
    while True:
        acting.value = int(janitor.is_janitor)
        time.sleep(0.01)


@pytest.fixture
def root(tmp_path: Path) -> str:
    return str(tmp_path / "cache")


@pytest.fixture
def processes() -> Iterator[list[BaseProcess]]:
    started: list[BaseProcess] = []
    yield started
    for proc in started:
        if proc.is_alive():
            proc.kill()
        proc.join()


def start_janitors(
    root: str, capacity: int, count: int, processes: list[BaseProcess]
) -> list[Synchronized[int]]:
    flags: list[Synchronized[int]] = []
    for _ in range(count):
        acting = _spawn.Value("i", 0)
        proc = _spawn.Process(target=janitor_process, args=(root, capacity, acting), daemon=True)
        proc.start()
        processes.append(proc)
        flags.append(acting)
    return flags


def test_only_one_of_two_janitor_processes_acts(root: str, processes: list[BaseProcess]) -> None:
    flags = start_janitors(root, 4 * SIZE, 2, processes)
    eventually(lambda: sum(f.value for f in flags) == 1)
    fill_blocks(root, 1, range(10))
    eventually(lambda: len(on_disk(root, 1, range(10))) == 4)

    acting = [f.value for f in flags].index(1)
    # The figures are published after the evictions: wait for them, then they must hold.
    eventually(lambda: (s := read_stats(root)) is not None and s.evictions == 6)
    passes: set[float] = set()
    wrong: list[object] = []

    def five_more_passes() -> bool:
        """Five passes of the acting janitor, and all along the other one idle."""
        stats = read_stats(root)
        assert stats is not None
        passes.add(stats.updated)
        seen = ([f.value for f in flags], stats.pid, stats.evictions, stats.bytes_used)
        if seen != ([int(i == acting) for i in range(2)], processes[acting].pid, 6, 4 * SIZE):
            wrong.append(seen)
        return len(passes) > 5 or bool(wrong)

    eventually(five_more_passes)
    assert not wrong
    assert on_disk(root, 1, range(10)) == [6, 7, 8, 9]


@pytest.mark.slow
def test_a_janitor_takes_over_within_seconds_of_a_sigkill(
    root: str, processes: list[BaseProcess]
) -> None:
    flags = start_janitors(root, 4 * SIZE, 2, processes)
    eventually(lambda: sum(f.value for f in flags) == 1)
    first = [f.value for f in flags].index(1)
    fill_blocks(root, 1, range(10))  # evicted by the first janitor after its snapshot
    eventually(lambda: len(on_disk(root, 1, range(10))) == 4)

    processes[first].kill()  # SIGKILL
    killed = time.monotonic()
    eventually(lambda: flags[1 - first].value == 1, timeout=10)
    assert time.monotonic() - killed < 5

    # The new janitor knows exactly what is on disk, whatever order it reads journals in.
    eventually(lambda: (s := read_stats(root)) is not None and s.pid == processes[1 - first].pid)
    stats = read_stats(root)
    assert stats is not None and stats.bytes_used == 4 * SIZE and stats.entries == 4
    fill_blocks(root, 2, range(100, 102))
    eventually(lambda: on_disk(root, 1, range(10)) == [8, 9])
    assert on_disk(root, 2, range(100, 102)) == [100, 101]


def writer_process(root: str, mount: int, first: int) -> None:
    fill_blocks(root, mount, range(first, first + 5))


def test_fills_from_two_writer_processes_share_one_budget(root: str) -> None:
    janitor = Janitor(root, 6 * SIZE, 0)
    janitor.run_once()
    writers = [_spawn.Process(target=writer_process, args=(root, m, m * 100)) for m in (1, 2)]
    for proc in writers:
        proc.start()
    for proc in writers:
        proc.join()
        assert proc.exitcode == 0

    janitor.run_once()
    stats = read_stats(root)
    assert stats is not None
    assert stats.entries == 6 and stats.bytes_used == 6 * SIZE and stats.evictions == 4
    kept = on_disk(root, 1, range(100, 105)) + on_disk(root, 2, range(200, 205))
    assert len(kept) == 6
    assert sum(stats.mounts.values()) == 6 * SIZE
    janitor.stop()


def test_evicts_to_capacity_least_recently_used_first_and_to_a_new_capacity(root: str) -> None:
    janitor = Janitor(root, 5 * SIZE, 0)
    janitor.run_once()
    journal = JournalWriter(root)
    for i in range(8):
        make_block(root, 1, i)
        journal.fill(name_of(i), SIZE, 1, False)
    journal.access(name_of(1), 1)
    journal.access(name_of(5), 1)
    journal.close()

    janitor.run_once()
    # 1 and 5 were used after their fill: the oldest of the others go.
    assert on_disk(root, 1, range(8)) == [1, 4, 5, 6, 7]
    stats = read_stats(root)
    assert stats is not None and stats.bytes_used == 5 * SIZE and stats.evictions == 3

    janitor.capacity = 2 * SIZE
    janitor.run_once()
    assert on_disk(root, 1, range(8)) == [1, 5]
    janitor.stop()


def test_a_use_read_before_the_fill_it_follows_still_protects_the_block(root: str) -> None:
    """Worker A fills blocks 0-3, worker B reads 0 and 1 next; B's journal is flushed and read
    first (journals are read one after the other). Blocks 0 and 1 were used twice all the same:
    a sweep of blocks used once evicts the others."""
    janitor = Janitor(root, 6 * SIZE, 0)
    janitor.run_once()
    filler = JournalWriter(root)
    for i in range(4):
        make_block(root, 1, i)
        filler.fill(name_of(i), SIZE, 1, False)
    reader = JournalWriter(root)
    reader.access(name_of(0), 1)
    reader.access(name_of(1), 1)
    reader.access(name_of(9), 1)  # a block dropped since: its use is of nothing kept
    reader.flush()
    janitor.run_once()  # the uses, and not yet the fills
    filler.close()
    janitor.run_once()
    sweep = JournalWriter(root)
    for i in range(10, 16):
        make_block(root, 1, i)
        sweep.fill(name_of(i), SIZE, 1, False)
    sweep.close()
    reader.close()

    janitor.run_once()
    assert on_disk(root, 1, range(4)) == [0, 1]
    stats = read_stats(root)
    assert stats is not None and stats.bytes_used == 6 * SIZE and stats.entries == 6
    assert stats.protected_bytes == 2 * SIZE  # blocks 0 and 1, the ones used twice
    janitor.stop()


def test_repeated_uses_within_one_flush_are_one_record(root: str) -> None:
    journal = JournalWriter(root)
    for _ in range(100):
        journal.access(name_of(1), 1)
        journal.access(name_of(2), 1)
    journal.flush()
    journal.access(name_of(1), 1)
    journal.access(name_of(1), 1, pinned=True)  # a pin is news
    journal.flush()
    # header, two uses, then one use and one pin
    assert os.path.getsize(journal.path) == 5 * RECORD.size
    journal.close()


def test_min_free_is_kept_on_the_real_file_system(root: str) -> None:
    big = 4 << 20
    janitor = Janitor(root, 1 << 50, 0)
    janitor.run_once()
    fill_blocks(root, 1, range(10), data=big)
    janitor.run_once()
    assert len(on_disk(root, 1, range(10))) == 10

    st = os.statvfs(root)
    janitor.min_free = st.f_bavail * st.f_frsize + (10 << 20)  # 10 MiB more than is free
    janitor.run_once()
    left = on_disk(root, 1, range(10))
    # At least 3 blocks go (12 MiB); the others stay unless the disk filled meanwhile.
    assert 3 <= 10 - len(left) < 10
    assert left == list(range(10 - len(left), 10))
    janitor.stop()


def restartable(root: str) -> None:
    """Six blocks, four of them used twice in this order: 4, 1, 5, 0; then stopped."""
    janitor = Janitor(root, 100 * SIZE, 0)
    janitor.run_once()
    journal = JournalWriter(root)
    for i in range(6):
        make_block(root, 1, i)
        journal.fill(name_of(i), SIZE, 1, False)
    journal.flush()
    for i in (4, 1, 5, 0):
        journal.access(name_of(i), 1)
    journal.close()
    janitor.run_once()
    janitor.stop()
    make_block(root, 1, 99)  # on disk, but no journal told of it


def test_snapshot_and_restart_restore_the_index_and_order_without_a_scan(root: str) -> None:
    restartable(root)
    janitor = Janitor(root, 3 * SIZE, 0)
    janitor.run_once()
    # The oldest go first: 2 and 3 (used once), then 4, the oldest of those used twice.
    assert on_disk(root, 1, range(6)) == [0, 1, 5]
    stats = read_stats(root)
    assert stats is not None and stats.entries == 3 and stats.bytes_used == 3 * SIZE
    assert on_disk(root, 1, range(99, 100)) == [99]  # no scan met it
    janitor.stop()


def test_a_torn_snapshot_is_ignored_and_the_index_rebuilt_by_a_scan(root: str) -> None:
    restartable(root)
    path = os.path.join(root, SNAPSHOT)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 7)
    assert load_snapshot(root) is None

    janitor = Janitor(root, 100 * SIZE, 0)
    janitor.run_once()
    stats = read_stats(root)
    assert stats is not None and stats.entries == 7  # the unjournaled block counted too
    janitor.stop()


def test_a_corrupt_snapshot_is_ignored(root: str) -> None:
    restartable(root)
    path = os.path.join(root, SNAPSHOT)
    raw = bytearray(Path(path).read_bytes())
    raw[100] ^= 1
    Path(path).write_bytes(bytes(raw))
    assert load_snapshot(root) is None
    Path(path).write_bytes(b"not a snapshot at all, but long enough for a header")
    assert load_snapshot(root) is None


def test_rescan_adopts_an_unjournaled_block_and_forgets_a_vanished_one(root: str) -> None:
    fill_blocks(root, 1, range(3))
    janitor = Janitor(root, 100 * SIZE, 0, rescan_interval=0.0)
    janitor.run_once()
    make_block(root, 2, 10, data=DATA * 2)  # a writer died before its journal said so
    os.unlink(block_path(root, 1, name_of(0).hex()))  # gone behind the janitor's back

    def settled() -> bool:
        janitor.run_once()
        stats = read_stats(root)
        return stats is not None and stats.mounts == {1: 2 * SIZE, 2: 2 * DATA + 32}

    eventually(settled)
    janitor.stop()


def test_rescan_removes_the_key_records_whose_block_is_gone(root: str) -> None:
    make_block(root, 1, 0)
    kept, gone = key_name(1, "kept"), key_name(1, "gone")
    records = KeyRecords(root)
    records.put(1, kept, name_of(0).hex())
    records.put(1, gone, name_of(1).hex())  # its block 0 was evicted meanwhile
    records.flush()
    janitor = Janitor(root, 100 * SIZE, 0, rescan_interval=0.0)

    def swept() -> bool:
        janitor.run_once()
        return KeyRecords(root).find(1, gone) is None

    eventually(swept)
    assert KeyRecords(root).find(1, kept) == name_of(0).hex()
    janitor.stop()
    records.close()


def test_rescan_takes_in_the_symlink_records_of_an_older_cache(root: str) -> None:
    """A cache written before keys.db kept a record as a symlink under keys/; the janitor's
    rescan takes them into keys.db (and removes them), so a restart after an upgrade still
    knows which keys it holds."""
    make_block(root, 1, 0)
    kept = key_name(1, "kept")
    folder = os.path.join(root, "keys", "1", kept[:2], kept[2:4])
    os.makedirs(folder)
    target = base64.urlsafe_b64encode(name_of(0)).rstrip(b"=").decode()
    os.symlink(target, os.path.join(folder, kept))
    janitor = Janitor(root, 100 * SIZE, 0, rescan_interval=0.0)

    def adopted() -> bool:
        janitor.run_once()
        return not os.path.exists(os.path.join(root, "keys"))

    eventually(adopted)
    assert KeyRecords(root).find(1, kept) == name_of(0).hex()
    janitor.stop()


def test_a_partial_journal_record_is_read_once_complete(root: str) -> None:
    janitor = Janitor(root, 100 * SIZE, 0)
    janitor.run_once()
    journal = JournalWriter(root)
    make_block(root, 1, 0)
    journal.fill(name_of(0), SIZE, 1, False)
    journal.flush()
    make_block(root, 1, 1)
    record = RECORD.pack(FILL, 0, 0, 1, SIZE, name_of(1))
    with open(journal.path, "ab") as f:  # a write that got only part of the way yet
        f.write(record[:20])
    janitor.run_once()
    stats = read_stats(root)
    assert stats is not None and stats.entries == 1

    with open(journal.path, "ab") as f:
        f.write(record[20:])
    janitor.run_once()
    stats = read_stats(root)
    assert stats is not None and stats.entries == 2
    journal.close()
    janitor.stop()


def test_journals_of_dead_writers_go_once_a_snapshot_covers_them(root: str) -> None:
    janitor = Janitor(root, 100 * SIZE, 0, snapshot_interval=0.0)
    janitor.run_once()
    live = JournalWriter(root)
    journals = os.path.join(root, JOURNAL_DIR)
    before = set(os.listdir(journals))  # the janitor's own and the live writer's
    fill_blocks(root, 1, range(2))
    assert len(set(os.listdir(journals)) - before) == 1

    janitor.run_once()
    assert set(os.listdir(journals)) == before
    stats = read_stats(root)
    assert stats is not None and stats.entries == 2
    live.close()
    janitor.stop()


def test_a_long_journal_is_sealed_and_a_new_one_begun(root: str) -> None:
    janitor = Janitor(root, 100 * SIZE, 0)
    janitor.run_once()
    journal = JournalWriter(root, max_bytes=10 * RECORD.size)
    first = journal.path
    for i in range(12):
        make_block(root, 1, i)
        journal.fill(name_of(i), SIZE, 1, False)
    journal.flush()
    assert journal.path != first
    make_block(root, 1, 12)
    journal.fill(name_of(12), SIZE, 1, False)
    journal.close()
    journal.fill(name_of(13), SIZE, 1, False)  # after close: dropped, no error
    janitor.run_once()
    stats = read_stats(root)
    assert stats is not None and stats.entries == 13
    janitor.stop()


def test_quotas_evict_a_mounts_own_blocks(root: str) -> None:
    janitor = Janitor(root, 100 * SIZE, 0)
    janitor.run_once()
    fill_blocks(root, 1, range(5))
    fill_blocks(root, 2, range(10, 15))
    janitor.set_quotas({2: 2 * SIZE})
    janitor.run_once()
    assert on_disk(root, 1, range(5)) == list(range(5))
    assert on_disk(root, 2, range(10, 15)) == [13, 14]
    janitor.stop()


def test_files_outside_the_layout_are_left_alone(root: str) -> None:
    make_block(root, 1, 0)
    strangers = [
        f"{root}/{BLOCKS_DIR}/1/00/00/notes.txt",
        f"{root}/{BLOCKS_DIR}/01/00/00/{name_of(0).hex()}",  # not a mount id as we write them
        f"{root}/{BLOCKS_DIR}/x/00/00/{name_of(0).hex()}",
        f"{root}/{BLOCKS_DIR}/1/ff/00/{name_of(0).hex()}",  # in another name's directory
        f"{root}/{BLOCKS_DIR}/1/00/notes.txt",
        f"{root}/{BLOCKS_DIR}/1/ff/{name_of(0).hex()}",  # in another name's directory
    ]
    for path in strangers:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        Path(path).write_bytes(b"y" * 1000)
    janitor = Janitor(root, 0, 0)  # evict everything it counts
    janitor.run_once()
    stats = read_stats(root)
    assert stats is not None and stats.evictions == 1 and stats.bytes_used == 0
    assert on_disk(root, 1, range(1)) == []
    assert all(os.path.exists(p) for p in strangers)
    janitor.stop()


def test_no_stats_before_a_janitor_ran(root: str) -> None:
    assert read_stats(root) is None


def open_files_under(root: str) -> list[str]:
    fds = Path("/proc/self/fd")
    targets = []
    for fd in fds.iterdir():
        try:
            targets.append(os.readlink(fd))
        except OSError:
            continue
    return [t for t in targets if t.startswith(os.path.realpath(root))]


def test_a_janitor_interrupted_while_loading_leaves_nothing_open(
    root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C (or a failing scan) while the index is built: no journal stays open, and the
    lock is free for the next janitor."""
    fill_blocks(root, 1, range(5))
    before = open_files_under(root)

    def interrupted(root: str) -> Iterator[tuple[float, int, str, int]]:
        raise KeyboardInterrupt

    monkeypatch.setattr("gateway.cache.janitor.scan_blocks", interrupted)
    janitor = Janitor(root, 100 * SIZE, 0)
    with pytest.raises(KeyboardInterrupt):
        janitor.run_once()
    assert not janitor.is_janitor
    janitor.stop()
    assert open_files_under(root) == before
    monkeypatch.undo()

    again = Janitor(root, 100 * SIZE, 0)
    again.run_once()
    assert again.is_janitor
    stats = read_stats(root)
    assert stats is not None and stats.entries == 5
    again.stop()


def test_the_spares_kept_follow_the_fills_not_only_the_spares_taken(root: str) -> None:
    # A burst of misses empties the pool and goes on making files of its own; the spares
    # taken (the pool's drop) cannot tell how many more the fills wanted, their records can.
    janitor = Janitor(root, 1 << 40, 0)
    janitor.run_once()
    at_rest = spare.count(root)
    assert at_rest >= 100  # a floor that covers the first moments of a burst
    fill_blocks(root, 1, range(200))  # 200 fills, none of which took a spare
    janitor.run_once()
    assert spare.count(root) >= min(spare.TARGET, 4 * 200)
    janitor.stop()


def killed_writer_process(root: str) -> None:
    """Commits ten blocks, its journal flushed after the first five, and is killed (SIGKILL)
    before the next flush: the last five are on disk and in no journal."""
    journal = JournalWriter(root)
    for i in range(10):
        make_block(root, 1, i)
        journal.fill(name_of(i), SIZE, 1, False)
        if i == 4:
            journal.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def test_blocks_a_killed_writers_journal_never_told_of_are_counted_at_the_restart(
    root: str, caplog: pytest.LogCaptureFixture
) -> None:
    first = Janitor(root, 100 * SIZE, 0)
    first.run_once()
    first.stop()  # a snapshot: the restart below does not scan
    writer = _spawn.Process(target=killed_writer_process, args=(root,))
    writer.start()
    writer.join()
    assert writer.exitcode == -signal.SIGKILL

    janitor = Janitor(root, 100 * SIZE, 0)  # the restart: the hourly rescan is far off

    def counted() -> int:
        janitor.run_once()
        stats = read_stats(root)
        return stats.entries if stats is not None else 0

    with caplog.at_level(logging.INFO, logger="gateway.cache"):
        eventually(lambda: counted() == 10)
    assert "died without closing them" in caplog.text
    assert "rescan found 5 blocks no journal told of" in caplog.text
    janitor.stop()


def test_a_janitor_stopped_before_its_rescan_leaves_the_rescan_to_the_next(root: str) -> None:
    first = Janitor(root, 100 * SIZE, 0)
    first.run_once()
    first.stop()
    writer = _spawn.Process(target=killed_writer_process, args=(root,))
    writer.start()
    writer.join()
    second = Janitor(root, 100 * SIZE, 0, snapshot_interval=0.0)
    second.run_once()  # finds the journal unsealed and begins a rescan
    second.stop()  # before that rescan is taken in: its last snapshot covers the journal

    third = Janitor(root, 100 * SIZE, 0)

    def counted() -> int:
        third.run_once()
        stats = read_stats(root)
        return stats.entries if stats is not None else 0

    eventually(lambda: counted() == 10)
    third.stop()


def test_a_closed_journal_starts_no_rescan(root: str, caplog: pytest.LogCaptureFixture) -> None:
    first = Janitor(root, 100 * SIZE, 0)
    first.run_once()
    first.stop()
    writer = _spawn.Process(target=writer_process, args=(root, 1, 0))
    writer.start()
    writer.join()
    make_block(root, 1, 99)  # on disk, in no journal: only a rescan would count it
    janitor = Janitor(root, 100 * SIZE, 0)
    with caplog.at_level(logging.INFO, logger="gateway.cache"):
        janitor.run_once()
        janitor.stop()  # waits for a rescan, had one started
    stats = read_stats(root)
    assert stats is not None and stats.entries == 5
    assert "died without closing" not in caplog.text and "rescan" not in caplog.text
