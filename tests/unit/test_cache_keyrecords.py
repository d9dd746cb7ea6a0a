"""The key records (gateway/cache/keyrecords.py): rows written in batches, found by every
process, the keys recorded at a process's start answered without a row read."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from gateway.cache import keyfilter
from gateway.cache.keyfilter import KeyFilter
from gateway.cache.keyrecords import KeyRecords
from gateway.cache.pages import key_name
from tests.support.net import eventually


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


def test_records_put_while_a_flush_runs_on_another_thread_are_all_written(
    tmp_path: Path,
) -> None:
    """The event loop records keys while the page store flushes on a cache-io thread: none is
    lost, and the flush never fails on a table changed under it (in CI it once did, and the
    task that flushes died with it)."""
    records = KeyRecords(str(tmp_path))
    names = [key_name(1, f"race{i}") for i in range(20_000)]
    done = threading.Event()
    failures: list[BaseException] = []

    def flusher() -> None:
        try:
            while not done.is_set():
                records.flush()
        except BaseException as exc:
            failures.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    thread = threading.Thread(target=flusher)
    thread.start()
    try:
        for name in names:
            records.put(1, name, "55" * 32)
    finally:
        done.set()
        thread.join()
        sys.setswitchinterval(interval)
    records.flush()
    assert failures == []
    check = KeyRecords(str(tmp_path))
    assert sum(check.find(1, name) is not None for name in names) == len(names)
    records.close()
    check.close()


def _open_and_record(root: str, i: int, start: Any) -> None:
    start.wait()
    records = KeyRecords(root)
    records.put(1, key_name(1, f"worker{i}"), "66" * 32)
    records.flush()
    records.close()


def test_the_workers_of_a_starting_node_all_open_a_new_file(tmp_path: Path) -> None:
    """Every worker opens keys.db at the same moment when a node starts on a new cache folder
    (a new file's first switch to WAL takes it whole: "database is locked" for the others);
    each must have its records, or a restart forgets what that worker cached (CI saw it)."""
    ctx = multiprocessing.get_context("fork")
    for round_ in range(5):
        root = str(tmp_path / str(round_))
        os.makedirs(root)
        start = ctx.Event()
        workers = [ctx.Process(target=_open_and_record, args=(root, i, start)) for i in range(4)]
        try:
            for worker in workers:
                worker.start()
            start.set()
            for worker in workers:
                worker.join(60)
        finally:
            for worker in workers:  # a hung one ends with the test
                if worker.is_alive():
                    worker.kill()
                    worker.join()
        assert [w.exitcode for w in workers] == [0, 0, 0, 0]
        check = KeyRecords(root)
        assert all(check.find(1, key_name(1, f"worker{i}")) for i in range(4))
        check.close()


def test_a_key_never_recorded_is_ruled_out_without_reading_keys_db(tmp_path: Path) -> None:
    # A cold miss asks for its key's record; in a node whose workers commit fills, keys.db
    # changes between two asks and SQLite reads its pages again (~50 us of the event loop's
    # CPU): the filter answers for the keys it never saw.
    records = KeyRecords(str(tmp_path))
    try:
        eventually(lambda: records.filtered)
        held = [key_name(1, f"held{i}") for i in range(100)]
        for name in held:
            records.put(1, name, "66" * 32)
        records.flush()
        assert all(records.find(1, key_name(1, f"cold{i}")) is None for i in range(1000))
        assert records.asked == 0
        assert all(records.find(1, name) == "66" * 32 for name in held)
        assert records.asked == len(held)
    finally:
        records.close()


def test_a_record_of_another_process_is_found_by_one_that_filters(tmp_path: Path) -> None:
    """Before and after this process opened keys.db: the first are in the filter by its scan
    at open, the others by their writer, which sets their bits before it writes them."""
    root = str(tmp_path)
    assert _in_a_process(root, "before", 5000) == 0
    mine = KeyRecords(root)
    try:
        eventually(lambda: mine.filtered)
        assert _in_a_process(root, "after", 50) == 0
        for label, count in (("before", 5000), ("after", 50)):
            for i in range(0, count, 7):
                assert mine.find(1, key_name(1, f"{label}{i}")) == "77" * 32, (label, i)
        assert mine.find(1, key_name(1, "never")) is None
    finally:
        mine.close()


def _in_a_process(root: str, label: str, count: int) -> int | None:
    """_record_many in a process of its own; its exit code (it is ended if it hangs)."""
    proc = multiprocessing.get_context("spawn").Process(
        target=_record_many, args=(root, label, count)
    )
    proc.start()
    try:
        proc.join(60)
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
    return proc.exitcode


def _record_many(root: str, label: str, count: int) -> None:
    records = KeyRecords(root)
    for i in range(count):
        records.put(1, key_name(1, f"{label}{i}"), "77" * 32)
    records.flush()
    records.close()


def test_a_key_s_bits_are_set_in_one_write_and_an_older_layout_s_file_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key's seven bits lie in one 64-byte block: its add is one pwrite (each system call
    of a commit's thread waits to take the GIL back from a busy event loop). The file of the
    layout before (bits spread over the whole file) is removed: its bits mean nothing now."""
    (tmp_path / "keys.filter").write_bytes(bytes(64 << 10))
    bloom = KeyFilter(str(tmp_path), 1 << 30)
    assert not (tmp_path / "keys.filter").exists()
    writes: list[int] = []
    real = os.pwrite

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        writes.append(len(data))
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    digests = [bytes.fromhex(key_name(1, f"k{i}")) for i in range(50)]
    bloom.add(digests)
    assert writes == [64] * 50
    bloom.add(digests)  # set already: nothing written
    assert len(writes) == 50
    bloom.covered = True
    assert all(bloom.may_hold(d) for d in digests)
    others = [bytes.fromhex(key_name(1, f"other{i}")) for i in range(2000)]
    assert sum(bloom.may_hold(d) for d in others) < 20  # 1 MiB of filter, 50 keys
    bloom.close()


def test_the_filter_is_sized_by_the_cache_and_kept_at_the_size_its_maker_chose(
    tmp_path: Path,
) -> None:
    small = KeyFilter(str(tmp_path), 1 << 20)  # a 1 MiB cache: the least, 64 KiB
    path = tmp_path / keyfilter.FILE
    assert path.stat().st_size == 64 << 10
    assert path.stat().st_blocks * 512 >= 64 << 10  # written: a bit set allocates nothing
    other = KeyFilter(str(tmp_path), 1 << 40)  # a sibling told of a larger one: the same map
    digest = bytes.fromhex(key_name(1, "sized"))
    other.add([digest])
    small.covered = other.covered = True
    assert small.may_hold(digest) and other.may_hold(digest)
    assert path.stat().st_size == 64 << 10
    small.close()
    other.close()


def test_the_flush_at_close_waits_for_a_sibling_s_write_rather_than_lose_its_records(
    tmp_path: Path,
) -> None:
    """A node's workers stop together and each flushes its records then. A flush made while
    the node runs waits 50 ms for a sibling's and keeps its records for the next one; the
    last has no next, so it waits: a restarted node fetched again a key it had cached (CI,
    tests/e2e/test_jobs_fleet_faults.py, after a stop of every node under load)."""
    records = KeyRecords(str(tmp_path))
    name = key_name(1, "committed just before the stop")
    records.put(1, name, "44" * 32)
    sibling = sqlite3.connect(str(tmp_path / "keys.db"), isolation_level=None)
    sibling.execute("BEGIN IMMEDIATE")  # a sibling's write holds the file
    closing = threading.Thread(target=records.close)
    closing.start()
    try:
        # The write goes on for ten times what a flush while running waits (the close either
        # waits for it, or gives up and loses the record: what is asserted below).
        closing.join(timeout=0.5)
    finally:
        sibling.execute("COMMIT")
        sibling.close()
    closing.join()
    assert KeyRecords(str(tmp_path)).find(1, name) == "44" * 32
