"""The worker processes of a node telling each other of changed keys (gateway/generations.py):
two metadata caches over one folder's counters stand for two workers."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from gateway.generations import SLOTS, Generations
from gateway.service.metadata import MetadataCache
from gateway.stores import ObjectInfo

NOW = 100.0


def info(etag: str) -> ObjectInfo:
    return ObjectInfo(key="k", size=3, etag=etag, last_modified=datetime(2026, 1, 1, tzinfo=UTC))


def test_a_key_forgotten_by_one_worker_is_stale_in_the_other(tmp_path: Path) -> None:
    a = MetadataCache(generations=Generations(str(tmp_path)))
    b = MetadataCache(generations=Generations(str(tmp_path)))
    for cache in (a, b):
        assert cache.fresh(1, "k", 600, NOW) is None
        cache.put(1, "k", info('"v1"'), NOW)
        assert cache.fresh(1, "k", 600, NOW) == info('"v1"')
    b.forget(1, "k")  # b wrote the key
    b.put(1, "k", info('"v2"'), NOW)
    assert a.fresh(1, "k", 600, NOW) is None  # a asks again
    assert b.fresh(1, "k", 600, NOW) == info('"v2"')
    a.put(1, "k", info('"v2"'), NOW)
    assert a.fresh(1, "k", 600, NOW) == info('"v2"')
    assert a.fresh(2, "k", 600, NOW) is None  # another mount's key is another key


def test_an_answer_to_a_lookup_older_than_a_sibling_write_is_not_trusted(tmp_path: Path) -> None:
    a = MetadataCache(generations=Generations(str(tmp_path)))
    b = MetadataCache(generations=Generations(str(tmp_path)))
    assert a.fresh(1, "k", 600, NOW) is None  # a's lookup begins
    b.forget(1, "k")  # b's write lands while it is under way
    a.put(1, "k", info('"old"'), NOW)  # the store's answer from before the write
    assert a.fresh(1, "k", 600, NOW) is None
    a.put(1, "k", info('"new"'), NOW)  # the lookup after the write is trusted
    assert a.fresh(1, "k", 600, NOW) == info('"new"')


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


def test_one_worker_forgets_without_counters() -> None:
    cache = MetadataCache()
    cache.put(1, "k", info('"v1"'), NOW)
    assert cache.fresh(1, "k", 600, NOW) == info('"v1"')
    cache.forget(1, "k")
    assert cache.fresh(1, "k", 600, NOW) is None
