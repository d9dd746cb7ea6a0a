"""An operator's unpin as the page store's journal carries it: the janitor takes the pin off
(the block becomes evictable), counts it, and a replay of the journals after a crash does not
put the pin back, whichever journal it reads first. On real files, as the janitor's tests."""

from __future__ import annotations

import os
from pathlib import Path

from gateway.cache.janitor import Janitor, read_stats
from gateway.cache.journal import UNPIN, JournalWriter, load_snapshot, records
from gateway.cache.layout import JOURNAL_DIR
from gateway.cache.policy import PINNED, PROBATION, PROTECTED, SLRU
from tests.unit.test_cache_janitor import SIZE, make_block, name_of, on_disk

PINS = range(4)  # the blocks a load with --pin filled


def pin_fills(root: str) -> str:
    """Blocks 0-3 filled pinned, as a load with --pin does; the journal's path."""
    journal = JournalWriter(root)
    for i in PINS:
        make_block(root, 1, i)
        journal.fill(name_of(i), SIZE, 1, True)
    journal.close()
    return journal.path


def unpins(root: str) -> str:
    journal = JournalWriter(root)
    for i in PINS:
        journal.unpin(name_of(i), 1)
    journal.close()
    return journal.path


def fill_more(root: str, numbers: range) -> None:
    journal = JournalWriter(root)
    for i in numbers:
        make_block(root, 1, i)
        journal.fill(name_of(i), SIZE, 1, False)
    journal.close()


def rename(path: str, name: str) -> None:
    os.rename(path, os.path.join(os.path.dirname(path), name))


def segments(root: str) -> dict[int, int]:
    """Block number -> its segment, as the last snapshot has it."""
    snapshot = load_snapshot(root)
    assert snapshot is not None
    return {int.from_bytes(e[1][:4], "big"): e[3] for e in snapshot.entries}


def test_an_unpin_record_is_its_own_op_with_the_block_and_mount(tmp_path: Path) -> None:
    journal = JournalWriter(str(tmp_path))
    journal.unpin(name_of(7), 3)
    journal.flush()
    with open(journal.path, "rb") as f:
        data = f.read()
    journal.close()
    assert list(records(data))[1] == (UNPIN, 0, 3, 0, name_of(7))


def test_unpinned_blocks_are_evicted_under_pressure_and_counted(tmp_path: Path) -> None:
    root = str(tmp_path)
    janitor = Janitor(root, 6 * SIZE, 0)
    janitor.run_once()  # the janitor, from here on following the journals
    pin_fills(root)
    fill_more(root, range(10, 12))
    janitor.run_once()
    stats = read_stats(root)
    assert stats is not None and stats.pinned_bytes == 4 * SIZE

    fill_more(root, range(20, 26))  # past the capacity: pins stay, the others go
    janitor.run_once()
    assert on_disk(root, 1, PINS) == list(PINS)

    unpins(root)
    janitor.run_once()
    stats = read_stats(root)
    assert stats is not None
    assert (stats.pinned_bytes, stats.unpinned_blocks, stats.unpinned_bytes) == (0, 4, 4 * SIZE)
    fill_more(root, range(30, 36))  # they are ordinary blocks now: the oldest go first
    janitor.run_once()
    assert on_disk(root, 1, PINS) == []
    assert on_disk(root, 1, range(30, 36)) == list(range(30, 36))
    janitor.stop()


def test_a_replay_does_not_resurrect_a_pin_read_after_its_unpin(tmp_path: Path) -> None:
    """A node killed before its janitor wrote a snapshot: the restarted janitor replays every
    journal after the last snapshot, one after another in the order of their names. The
    unpin's journal is read first here, the pin's second; the unpin still wins."""
    root = str(tmp_path)
    first = Janitor(root, 100 * SIZE, 0)
    first.run_once()
    first.stop()  # a snapshot of nothing: every journal below is replayed
    rename(pin_fills(root), "9-pins.log")
    rename(unpins(root), "0-unpins.log")
    journals = sorted(os.listdir(os.path.join(root, JOURNAL_DIR)))
    assert journals.index("0-unpins.log") < journals.index("9-pins.log")

    restarted = Janitor(root, 100 * SIZE, 0)
    restarted.run_once()
    stats = read_stats(root)
    assert stats is not None and stats.entries == 4
    assert stats.pinned_bytes == 0 and stats.unpinned_blocks == 4
    # The pass that took pins off wrote a snapshot at once (not a minute later): a second
    # crash now replays nothing that could pin them again.
    assert segments(root) == {i: PROBATION for i in PINS}
    # ... and so covered both journals, which are deleted: nothing is left to replay.
    journals = os.listdir(os.path.join(root, JOURNAL_DIR))
    assert "0-unpins.log" not in journals and "9-pins.log" not in journals
    restarted.stop()

    again = Janitor(root, 100 * SIZE, 0)
    again.run_once()
    stats = read_stats(root)
    assert stats is not None and stats.pinned_bytes == 0 and stats.unpinned_blocks == 4
    again.stop()


def test_a_pin_after_the_unpin_in_a_later_pass_pins_again(tmp_path: Path) -> None:
    root = str(tmp_path)
    janitor = Janitor(root, 100 * SIZE, 0)
    janitor.run_once()
    pin_fills(root)
    janitor.run_once()
    unpins(root)
    janitor.run_once()
    journal = JournalWriter(root)
    journal.access(name_of(0), 1, pinned=True)  # a new load with --pin
    journal.close()
    janitor.run_once()
    stats = read_stats(root)
    assert stats is not None and stats.pinned_bytes == SIZE
    janitor.stop()


def test_policy_unpin_moves_a_pinned_block_to_probation_and_leaves_others_alone() -> None:
    policy = SLRU(10 * SIZE)
    policy.add(1, name_of(0), SIZE, pinned=True)
    policy.add(1, name_of(1), SIZE)
    policy.access(1, name_of(1))  # protected
    policy.add(1, name_of(2), SIZE)
    assert policy.unpin(1, name_of(0)) == SIZE
    assert policy.unpin(1, name_of(1)) is None  # not pinned: stays protected
    assert policy.unpin(1, name_of(9)) is None  # unknown
    assert policy.pinned_bytes == 0
    where = {e[1]: e[3] for e in policy.entries()}
    assert where == {name_of(0): PROBATION, name_of(1): PROTECTED, name_of(2): PROBATION}
    assert PINNED not in where.values()
    # the newest of probation: block 2, filled before the unpin, goes first
    assert [v.name for v in policy.victims(2 * SIZE)] == [name_of(2), name_of(0)]


def test_an_unpin_of_a_mount_takes_off_every_pin_of_that_mount_only(tmp_path: Path) -> None:
    root = str(tmp_path)
    janitor = Janitor(root, 100 * SIZE, 0)
    janitor.run_once()
    journal = JournalWriter(root)
    for mount in (1, 2):
        for i in PINS:
            make_block(root, mount, i)
            journal.fill(name_of(i), SIZE, mount, True)
    journal.flush()
    janitor.run_once()
    journal.unpin_mount(1)
    journal.close()
    janitor.run_once()
    stats = read_stats(root)
    assert stats is not None
    assert (stats.pinned_bytes, stats.unpinned_blocks) == (4 * SIZE, 4)  # mount 2's stay
    assert {(e[0], e[3]) for e in load_snapshot_entries(root)} == {(1, PROBATION), (2, PINNED)}
    janitor.stop()


def load_snapshot_entries(root: str) -> list[tuple[int, bytes, int, int, int]]:
    snapshot = load_snapshot(root)
    assert snapshot is not None
    return list(snapshot.entries)
