"""The worker processes of a node telling each other of changed keys (gateway/generations.py):
two metadata caches over one folder's counters stand for two workers."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from gateway.generations import SLOTS, Generations, OpenClaims
from gateway.service.learnt import FILE, LearntVersions, reset
from gateway.service.metadata import MetadataCache
from gateway.stores import ObjectInfo

NOW = 100.0


def info(etag: str) -> ObjectInfo:
    return ObjectInfo(key="k", size=3, etag=etag, last_modified=datetime(2026, 1, 1, tzinfo=UTC))


def test_a_key_forgotten_by_one_worker_is_stale_in_the_other(tmp_path: Path) -> None:
    a = MetadataCache(Generations(str(tmp_path)))
    b = MetadataCache(Generations(str(tmp_path)))
    for cache in (a, b):
        assert cache.fresh(1, "k", 600, NOW) is None
        assert cache.put(1, "k", info('"v1"'), NOW, cache.ticket(1, "k"))
        assert cache.fresh(1, "k", 600, NOW) == info('"v1"')
    after = b.forget(1, "k")  # b wrote the key
    assert b.put(1, "k", info('"v2"'), NOW, after)
    assert a.fresh(1, "k", 600, NOW) is None  # a asks again
    assert b.fresh(1, "k", 600, NOW) == info('"v2"')
    a.put(1, "k", info('"v2"'), NOW, a.ticket(1, "k"))
    assert a.fresh(1, "k", 600, NOW) == info('"v2"')
    assert a.fresh(2, "k", 600, NOW) is None  # another mount's key is another key


def test_an_answer_to_a_lookup_older_than_a_sibling_write_is_not_trusted(tmp_path: Path) -> None:
    a = MetadataCache(Generations(str(tmp_path)))
    b = MetadataCache(Generations(str(tmp_path)))
    asked = a.ticket(1, "k")  # a's lookup begins
    b.forget(1, "k")  # b's write lands while it is under way
    assert not a.put(1, "k", info('"old"'), NOW, asked)  # the answer from before the write
    assert a.fresh(1, "k", 600, NOW) is None
    assert a.peek(1, "k") == info('"old"')  # a hint, for what to drop when it changes
    a.put(1, "k", info('"new"'), NOW, a.ticket(1, "k"))  # a lookup after the write is trusted
    assert a.fresh(1, "k", 600, NOW) == info('"new"')


def test_every_lookup_keeps_its_own_ticket_whatever_else_the_worker_hears(
    tmp_path: Path,
) -> None:
    """Found from outside: a cold open sent before a DELETE, answered after it, was trusted
    because another request of the same worker heard "gone" meanwhile, and the worker's one
    remembered generation of the key went with that. Each question carries its own."""
    a = MetadataCache(Generations(str(tmp_path)))
    b = MetadataCache(Generations(str(tmp_path)))
    opening = a.ticket(1, "k")  # a's open of the key is sent to the store
    b.forget(1, "k")  # b deletes it (before and after the store's delete)
    b.forget(1, "k")
    a.forget(1, "k")  # another of a's requests is told "no such key"
    assert not a.put(1, "k", info('"deleted"'), NOW, opening)  # the open's late answer
    assert a.fresh(1, "k", 600, NOW) is None and b.fresh(1, "k", 600, NOW) is None


def test_counters_are_kept_across_restarts_and_slots_spread(tmp_path: Path) -> None:
    gens = Generations(str(tmp_path))
    slot = gens.slot(1, "k")
    gens.bump(slot)
    gens.bump(slot)
    gens.close()
    again = Generations(str(tmp_path))
    assert again.current(slot) == 2  # never back to a value a worker may remember
    slots = {Generations.slot(1, f"key-{i}") for i in range(1000)}
    assert len(slots) > 990 and all(0 <= s < SLOTS for s in slots)


def test_one_worker_trusts_no_answer_asked_before_a_change(tmp_path: Path) -> None:
    cache = MetadataCache(Generations(str(tmp_path)))
    cache.put(1, "k", info('"v1"'), NOW, cache.ticket(1, "k"))
    assert cache.fresh(1, "k", 600, NOW) == info('"v1"')
    asked = cache.ticket(1, "k")
    cache.forget(1, "k")
    assert cache.fresh(1, "k", 600, NOW) is None
    assert not cache.put(1, "k", info('"v1"'), NOW, asked)  # asked before the change
    assert cache.fresh(1, "k", 600, NOW) is None


class Wall:
    """The wall clock the shared records are stamped with, moved by the test."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _sharing(root: Path, wall: Wall) -> MetadataCache:
    """A worker's cache whose monotonic clock (the `now`s given) reads NOW when the wall
    clock reads its start, and moves with it."""
    start = wall.now
    return MetadataCache(
        Generations(str(root)),
        learnt=LearntVersions(str(root)),
        wall=wall,
        mono=lambda: NOW + (wall.now - start),
    )


def test_a_version_the_shared_record_was_too_busy_for_is_published_again(
    tmp_path: Path,
) -> None:
    """A worker that opened a key holds its open claim until its siblings can find the version
    (they would open the key again otherwise: a second store GET). Another process holding
    the shared file's write lock past the busy timeout no longer loses the record."""
    wall = Wall()
    a, b = _sharing(tmp_path, wall), _sharing(tmp_path, wall)
    holder = sqlite3.connect(tmp_path / FILE, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # a sibling's write, held
    a.put(1, "k", info('"v1"'), NOW, a.ticket(1, "k"))  # refused at once
    assert a.fresh(1, "k", -1, NOW) == info('"v1"')  # a knows it
    assert b.peek(1, "k") is None  # b does not: not in the shared record

    async def release_once_retried() -> bool:
        sharing = asyncio.create_task(a.published(1, "k"))
        await asyncio.sleep(0)  # it has begun waiting
        holder.execute("COMMIT")
        return await sharing

    assert asyncio.run(release_once_retried())
    assert b.peek(1, "k") == info('"v1"')
    assert asyncio.run(a.published(1, "k"))  # nothing left to share: at once

    holder.execute("BEGIN IMMEDIATE")
    a.put(1, "k2", info('"v2"'), NOW, a.ticket(1, "k2"))
    assert not asyncio.run(a.published(1, "k2"))  # held throughout: given up, a hint lost
    holder.execute("COMMIT")
    assert b.peek(1, "k2") is None
    holder.close()


def test_a_busy_shared_record_stalls_no_loop_and_what_it_refused_goes_with_the_next_put(
    tmp_path: Path,
) -> None:
    """A write to the shared record runs on the worker's event loop: it waits for no
    sibling's write (SQLite's busy handler slept 1 ms and more at each refusal: two workers
    loading keys stalled each other's loops). What it refused is published with the worker's
    next put the file takes, without anyone waiting on published()."""
    wall = Wall()
    a, b = _sharing(tmp_path, wall), _sharing(tmp_path, wall)
    assert a._learnt is not None
    assert a._learnt._db.execute("PRAGMA busy_timeout").fetchone() == (0,)
    holder = sqlite3.connect(tmp_path / FILE, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # a sibling's write, held
    a.put(1, "k1", info('"v1"'), NOW, a.ticket(1, "k1"))
    a.put(1, "k2", info('"v2"'), NOW, a.ticket(1, "k2"))
    assert b.peek(1, "k1") is None and b.peek(1, "k2") is None  # refused, kept by a
    holder.execute("COMMIT")
    holder.close()
    a.put(1, "k3", info('"v3"'), NOW, a.ticket(1, "k3"))
    assert [b.peek(1, k) for k in ("k1", "k2", "k3")] == [info('"v1"'), info('"v2"'), info('"v3"')]
    assert asyncio.run(a.published(1, "k1"))  # nothing left to share: at once


def test_a_version_one_worker_learnt_is_fresh_in_another_for_the_ttl_from_learning(
    tmp_path: Path,
) -> None:
    wall = Wall()
    a, b = _sharing(tmp_path, wall), _sharing(tmp_path, wall)
    assert a.fresh(1, "k", 60, NOW) is None
    a.put(1, "k", info('"v1"'), NOW, a.ticket(1, "k"))  # a asked the store
    wall.now += 50
    assert b.peek(1, "k") == info('"v1"')
    assert b.fresh(1, "k", 60, NOW + 50) == info('"v1"')  # learnt 50 s ago: fresh for 10 more
    wall.now += 11
    assert b.fresh(1, "k", 60, NOW + 61) is None  # and not after
    assert b.fresh(1, "k", -1, NOW + 1e6) == info('"v1"')  # immutable: for good


def test_a_version_answered_late_is_fresh_in_a_sibling_from_when_it_was_asked(
    tmp_path: Path,
) -> None:
    """A store (or a loaded node) that takes seconds to answer: the version was current when
    it was asked, perhaps not when it came; siblings count the TTL from the asking, as the
    worker that asked does."""
    wall = Wall()
    a, b = _sharing(tmp_path, wall), _sharing(tmp_path, wall)
    ticket = a.ticket(1, "k")
    wall.now += 4  # the answer took 4 s
    a.put(1, "k", info('"v1"'), NOW, ticket)  # asked at NOW
    wall.now += 0.5
    assert b.fresh(1, "k", 5, NOW + 4.5) == info('"v1"')
    wall.now += 1
    assert b.fresh(1, "k", 5, NOW + 5.5) is None  # 5.5 s after the asking: past the TTL
    assert a.fresh(1, "k", 5, NOW + 5.5) is None


def test_a_shared_version_is_not_trusted_after_a_change_of_its_key(tmp_path: Path) -> None:
    wall = Wall()
    a, b, c = _sharing(tmp_path, wall), _sharing(tmp_path, wall), _sharing(tmp_path, wall)
    asked = c.ticket(1, "k")  # c's lookup begins...
    after = a.forget(1, "k")  # ...a writes the key meanwhile...
    c.put(1, "k", info('"old"'), NOW, asked)  # ...and c's answer from before the write comes
    assert b.fresh(1, "k", 600, NOW) is None  # b does not take it
    assert b.peek(1, "k") is None
    a.put(1, "k", info('"new"'), NOW, after)
    assert b.fresh(1, "k", 600, NOW) == info('"new"')
    a.forget(1, "k")  # deleted
    assert b.fresh(1, "k", 600, NOW) is None


def test_shared_records_of_an_earlier_run_are_dropped_at_start(tmp_path: Path) -> None:
    wall = Wall()
    a = _sharing(tmp_path, wall)
    a.put(1, "k", info('"v1"'), NOW, a.ticket(1, "k"))
    a.close()
    reset(tmp_path)
    b = _sharing(tmp_path, wall)
    assert b.fresh(1, "k", -1, NOW) is None


def test_the_state_counter_is_told_to_every_process_and_by_the_cli(tmp_path: Path) -> None:
    a, b = Generations(str(tmp_path)), Generations(str(tmp_path))
    before = b.state()
    cli = Generations.existing(str(tmp_path))
    assert cli is not None
    cli.bump_state()
    assert a.state() == b.state() == before + 1
    assert Generations.existing(str(tmp_path / "elsewhere")) is None  # no node: nothing made
    assert not (tmp_path / "elsewhere").exists()


_HOLD = """
import sys, time
from gateway.generations import OpenClaims
claims = OpenClaims(sys.argv[1])
assert claims.take(int(sys.argv[2]))
print("held", flush=True)
sys.stdin.readline()
"""


def test_one_process_opens_a_key_and_the_others_wait_until_it_lets_go(tmp_path: Path) -> None:
    byte = OpenClaims.byte(1, "k")
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(tmp_path), str(byte)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        here = OpenClaims(str(tmp_path))
        assert not here.take(byte) and not here.free(byte)
        assert here.take(OpenClaims.byte(1, "other"))  # another key is another claim
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(10)
        assert here.free(byte) and here.take(byte)  # its lock went with it
        assert here.take(byte)  # this process's own claims are counted, not excluded
        here.drop(byte)
        here.drop(byte)
    finally:
        holder.kill()


def test_a_shared_version_comes_back_whole(tmp_path: Path) -> None:
    rich = ObjectInfo(
        key="dir/é.bin", size=12, etag='"abc-2"',
        last_modified=datetime(2026, 5, 1, 12, 30, 15, 123456, tzinfo=UTC),
        content_type="image/jpeg", content_encoding="gzip", content_disposition="inline",
        content_language="fr", cache_control="max-age=60", expires="Thu, 01 Jan 2037 00:00:00 GMT",
        metadata={"owner": "ml", "ünï": "cødé"}, storage_class="STANDARD_IA",
        checksums={"crc32c": "AAAAAA=="}, tags={"a": "b"}, tag_count=1,
        encryption={"algorithm": "AES256"},
    )  # fmt: skip
    learnt = LearntVersions(str(tmp_path))
    learnt.publish(3, rich.key, rich, 5.0, 7)
    assert learnt.lookup(3, rich.key) == (rich, 5.0, 7)
    assert learnt.lookup(4, rich.key) is None


def test_a_worker_that_cannot_share_versions_keeps_to_itself_and_waits_for_nothing(
    tmp_path: Path,
) -> None:
    """Found from outside: a worker whose open of the node's versions file failed kept an
    empty database in memory, and every cold miss it served then waited ~212 ms in
    published() for a record that could never be taken. It says so once and waits for
    nothing: published() ends without ever suspending."""
    not_a_folder = tmp_path / "file"
    not_a_folder.write_bytes(b"")
    cache = MetadataCache(Generations(str(tmp_path)), learnt=LearntVersions(str(not_a_folder)))
    assert cache.put(1, "k", info('"v1"'), NOW, cache.ticket(1, "k"))
    assert cache.fresh(1, "k", 600, NOW) == info('"v1"')
    step = cache.published(1, "k")
    try:
        step.send(None)
    except StopIteration as done:
        assert done.value is True
    else:
        step.close()
        raise AssertionError("published() waited for a record nobody can see")
