"""The key records (gateway/cache/keyrecords.py): rows written in batches, found by every
process, the keys recorded at a process's start answered without a row read."""

from __future__ import annotations

from pathlib import Path

from gateway.cache.keyrecords import KeyRecords
from gateway.cache.pages import key_name


def test_records_are_written_in_a_batch_and_found_by_another_process_s_records(
    tmp_path: Path,
) -> None:
    mine, sibling = KeyRecords(str(tmp_path)), KeyRecords(str(tmp_path))
    a, b = key_name(1, "a"), key_name(1, "b")
    mine.put(1, a, "11" * 32)
    assert mine.find(1, a) == "11" * 32  # before its flush, in this process
    assert sibling.find(1, a) is None
    mine.flush()
    assert sibling.find(1, a) == "11" * 32
    mine.drop(1, a, "22" * 32)  # names another version: kept
    mine.put(1, b, "33" * 32)
    mine.drop(1, b, "33" * 32)  # the last word on b: gone
    mine.flush()
    assert sibling.find(1, a) == "11" * 32 and sibling.find(1, b) is None
    mine.close()
    sibling.close()


def test_the_keys_recorded_at_start_are_answered_without_a_row_read(tmp_path: Path) -> None:
    before = KeyRecords(str(tmp_path))
    held = [key_name(1, f"k{i}") for i in range(1000)]
    for name in held:
        before.put(1, name, "44" * 32)
    before.close()
    started = KeyRecords(str(tmp_path))
    assert started.might_hold(key_name(1, "anything"))  # not loaded yet: ask the file
    assert started.load() == 1000
    assert all(started.might_hold(name) for name in held)
    others = [key_name(1, f"other{i}") for i in range(1000)]
    assert not any(started.might_hold(name) for name in others)
    started.close()
