"""The page store's eviction policy: built by name (create), scan resistance, quotas, pins,
free space, capacity changes, idempotence, and an exact round trip through
entries()/restore()."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from gateway.cache.janitor import Janitor
from gateway.cache.policy import PINNED, PROBATION, PROTECTED, SLRU, Victim, create

B = 100  # bytes a block in these tests


def n(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest()


def names(victims: list[Victim]) -> list[bytes]:
    return [v.name for v in victims]


def test_hot_set_survives_a_sweep_of_many_times_the_capacity() -> None:
    policy = SLRU(100 * B)
    hot = [n(i) for i in range(50)]
    for name in hot:
        policy.add(1, name, B)
    for name in hot:
        policy.access(1, name)
    evicted: list[bytes] = []
    sweep = [n(i) for i in range(1000, 2000)]  # ten times the capacity, each block used once
    for name in sweep:
        policy.add(1, name, B)
        evicted += names(policy.victims())

    assert all((1, name) in policy for name in hot)
    assert set(evicted) <= set(sweep)
    assert len(evicted) == len(sweep) - 50
    assert policy.bytes_used == 100 * B
    # What is left of the sweep is its newest blocks.
    assert [name for name in sweep if (1, name) in policy] == sweep[-50:]


def test_a_plain_lru_would_have_lost_the_hot_set_without_the_second_use() -> None:
    """The counterpart of the test above: blocks used once are no better than the sweep."""
    policy = SLRU(100 * B)
    once = [n(i) for i in range(50)]
    for name in once:
        policy.add(1, name, B)
    for i in range(1000, 1200):
        policy.add(1, n(i), B)
        policy.victims()
    assert not any((1, name) in policy for name in once)


def test_protected_is_bounded_and_overflow_goes_back_to_probation() -> None:
    policy = SLRU(10 * B, protected_fraction=0.5)
    for i in range(10):
        policy.add(1, n(i), B)
        policy.access(1, n(i))
    assert policy.segment_bytes(PROTECTED) == 5 * B
    assert policy.segment_bytes(PROBATION) == 5 * B
    # The demoted ones are the oldest protected, and they go first.
    assert names(policy.victims(2 * B)) == [n(0), n(1)]


def test_victims_take_probation_before_protected_then_protected_lru() -> None:
    policy = SLRU(4 * B)
    for i in range(4):
        policy.add(1, n(i), B)
    policy.access(1, n(0))
    policy.access(1, n(1))
    policy.access(1, n(0))  # protected, oldest first: 1, 0
    assert names(policy.victims(4 * B)) == [n(2), n(3), n(1), n(0)]
    assert len(policy) == 0 and policy.bytes_used == 0


def test_lru_order_holds_across_mounts() -> None:
    policy = SLRU(10 * B)
    order = [(m, n(i)) for i, m in enumerate([3, 1, 2, 1, 3, 2])]
    for mount, name in order:
        policy.add(mount, name, B)
    victims = policy.victims(6 * B)
    assert [(v.mount, v.name) for v in victims] == order


def test_a_mount_over_its_quota_loses_its_own_blocks_first_probation_first() -> None:
    policy = SLRU(100 * B, quotas={1: 3 * B})
    policy.add(2, n(100), B)  # older than all of mount 1's, but mount 2 has room
    for i in range(5):
        policy.add(1, n(i), B)
    policy.access(1, n(0))  # protected
    victims = policy.victims()
    assert [(v.mount, v.name) for v in victims] == [(1, n(1)), (1, n(2))]
    assert policy.bytes_of(1) == 3 * B and policy.bytes_of(2) == B
    policy.set_quotas({1: B})
    assert names(policy.victims()) == [n(3), n(4)]  # probation first, then the protected n(0)
    policy.set_quotas({1: 0})
    assert names(policy.victims()) == [n(0)]
    assert policy.mounts() == {2: B}


def test_pinned_blocks_count_but_are_never_victims() -> None:
    policy = SLRU(3 * B)
    policy.add(1, n(0), B, pinned=True)
    policy.add(1, n(1), B)
    policy.add(1, n(2), B, pinned=True)
    policy.add(1, n(3), B)
    policy.add(1, n(4), B)
    assert policy.bytes_used == 5 * B
    assert names(policy.victims()) == [n(1), n(3)]
    # Nothing but pins left to give: victims stop short rather than evict them.
    assert names(policy.victims(10 * B)) == [n(4)]
    assert policy.bytes_used == 2 * B and len(policy) == 2


def test_a_quota_full_of_pins_is_left_alone() -> None:
    policy = SLRU(100 * B, quotas={1: B})
    policy.add(1, n(0), B, pinned=True)
    policy.add(1, n(1), B, pinned=True)
    assert policy.victims() == []


def test_pins_set_and_cleared_by_later_records() -> None:
    policy = SLRU(2 * B)
    policy.add(1, n(0), B)
    policy.add(1, n(1), B)
    policy.access(1, n(0), pinned=True)
    policy.add(1, n(2), B)
    assert names(policy.victims()) == [n(1)]
    policy.access(1, n(0))  # a use that says nothing of pins keeps it
    policy.add(1, n(3), B)
    assert names(policy.victims()) == [n(2)]
    policy.add(1, n(0), B, pinned=False)  # a fill that says not pinned clears it
    policy.add(1, n(4), B)
    assert names(policy.victims()) == [n(3)]
    assert names(policy.victims(B)) == [n(0)]  # back in probation, older than n(4)
    policy.add(1, n(5), B, pinned=True)
    policy.access(1, n(5), pinned=False)
    assert {(e[1], e[3]) for e in policy.entries()} == {(n(4), PROBATION), (n(5), PROTECTED)}


def test_free_needed_frees_at_least_that_many_bytes() -> None:
    policy = SLRU(100 * B)
    for i in range(10):
        policy.add(1, n(i), B)
    assert names(policy.victims(250)) == [n(0), n(1), n(2)]
    assert policy.victims() == []
    assert len(policy.victims(10_000 * B)) == 7


def test_a_smaller_capacity_evicts_down_to_it_and_shrinks_protected() -> None:
    policy = SLRU(10 * B)
    for i in range(10):
        policy.add(1, n(i), B)
        policy.access(1, n(i))
    assert policy.segment_bytes(PROTECTED) == 8 * B
    policy.set_capacity(4 * B)
    assert policy.segment_bytes(PROTECTED) <= int(4 * B * 0.8)
    victims = policy.victims()
    assert names(victims) == [n(i) for i in range(6)]
    assert policy.bytes_used == 4 * B


def test_add_is_idempotent_and_keeps_the_place() -> None:
    policy = SLRU(10 * B)
    for i in range(3):
        policy.add(1, n(i), B)
    policy.add(1, n(0), B)
    policy.add(1, n(0), 2 * B)  # a new size is taken, the place kept
    assert len(policy) == 3 and policy.bytes_used == 4 * B
    assert names(policy.victims(1)) == [n(0)]
    policy.access(1, n(99))  # unknown: ignored
    assert policy.remove(1, n(1)) and not policy.remove(1, n(1))
    assert not policy.remove(7, n(1))
    assert len(policy) == 1 and policy.bytes_used == B


def test_the_same_name_in_two_mounts_is_two_blocks() -> None:
    policy = SLRU(10 * B)
    policy.add(1, n(0), B)
    policy.add(2, n(0), B)
    assert len(policy) == 2 and policy.mounts() == {1: B, 2: B}
    assert policy.remove(2, n(0)) and (1, n(0)) in policy and (2, n(0)) not in policy


def test_entries_round_trip_restores_order_segments_and_pins() -> None:
    policy = SLRU(30 * B, quotas={2: 8 * B})
    for i in range(40):
        policy.add(i % 3, n(i), B + i, pinned=i % 7 == 0)
        if i % 4 == 0:
            policy.access((i // 2) % 3, n(i // 2))
    again = SLRU(30 * B, quotas={2: 8 * B})
    again.restore(policy.entries())

    assert list(again.entries()) == list(policy.entries())
    assert again.bytes_used == policy.bytes_used and len(again) == len(policy)
    assert again.mounts() == policy.mounts()
    assert again.victims(5000) == policy.victims(5000)
    assert {e[1] for e in again.entries() if e[3] == PINNED} == {n(i) for i in range(0, 40, 7)}
    # A new block is newer than every restored one: the last of probation to go.
    again.add(0, n(1000), B)
    in_probation = sum(1 for e in again.entries() if e[3] == PROBATION)
    assert names(again.victims(10**9))[in_probation - 1] == n(1000)


def test_restore_refuses_entries_no_policy_gave() -> None:
    with pytest.raises(ValueError):
        SLRU(B).restore([(1, n(0), B, PROBATION, 5), (1, n(1), B, PROBATION, 4)])
    with pytest.raises(ValueError):
        SLRU(B).restore([(1, n(0), B, PROBATION, 1), (1, n(0), B, PROBATION, 2)])
    policy = SLRU(B)
    policy.add(1, n(0), B)
    with pytest.raises(ValueError):
        policy.restore([])


def test_create_builds_the_policy_named_with_its_capacity_and_quotas() -> None:
    policy = create(3 * B, {2: B}, name="slru")
    assert isinstance(policy, SLRU)
    for i in range(3):
        policy.add(1, n(i), B)
    policy.add(2, n(10), B)
    policy.add(2, n(11), B)
    # Mount 2 over its quota loses its own oldest; then the oldest of all goes for capacity.
    assert names(policy.victims()) == [n(10), n(0)]
    held = policy.figures()
    assert (held.entries, held.bytes_used, held.mounts) == (3, 3 * B, {1: 2 * B, 2: B})


def test_an_unknown_policy_is_refused_by_name_before_a_janitor_runs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"'lfu'.*slru"):
        create(B, name="lfu")
    with pytest.raises(ValueError, match="'lfu'"):
        Janitor(str(tmp_path), B, 0, policy="lfu")
