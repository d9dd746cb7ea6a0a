"""Placement: weighted rendezvous hashing over partitions gives distinct owners, shares in
proportion to weight, moves only what a membership change must, and agrees across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from gateway.cluster import Node, Placement, block_key, object_key, partition_of

KEYS = [block_key(1, f"datasets/train/shard-{i:05d}.tar", '"etag"', i % 7) for i in range(20000)]


def fleet(count: int) -> list[Node]:
    return [Node(f"node-{i}", f"10.0.0.{i}:9001") for i in range(count)]


def primaries(placement: Placement) -> list[str]:
    return [placement.owners(key)[0].id for key in KEYS]


def test_owners_are_distinct_and_best_first() -> None:
    placement = Placement(fleet(7))
    for key in KEYS[:2000]:
        three = placement.owners(key, 3)
        assert len({node.id for node in three}) == 3
        assert placement.owners(key, 1) == three[:1]
        assert placement.owners(key, 2) == three[:2]


def test_a_small_fleet_gives_every_node_and_no_more() -> None:
    nodes = fleet(2)
    placement = Placement(nodes)
    for key in KEYS[:200]:
        assert sorted(node.id for node in placement.owners(key, 3)) == ["node-0", "node-1"]


def test_weights_give_proportional_shares() -> None:
    nodes = [Node(f"n{w}", f"h{w}:1", float(w)) for w in (1, 2, 3, 4)]
    # Many partitions, so that the test measures the hashing and not the partition count's
    # granularity: each share should be within 10% of weight / total weight.
    placement = Placement(nodes, partitions=8192)
    counts = Counter(placement.owners(key)[0].id for key in KEYS * 5)
    total = sum(counts.values())
    for node in nodes:
        expected = node.weight / 10
        assert counts[node.id] / total == pytest.approx(expected, rel=0.10), counts


def test_partitions_share_out_evenly_at_the_default_count() -> None:
    placement = Placement(fleet(10))
    counts = Counter(placement.partition_owners(p)[0].id for p in range(placement.partitions))
    assert set(counts) == {f"node-{i}" for i in range(10)}
    assert all(70 <= n <= 140 for n in counts.values()), counts  # 102.4 each on average


def test_adding_a_node_moves_its_share_and_only_to_it() -> None:
    nodes = fleet(10)
    before = Placement(nodes)
    newcomer = Node("node-new", "10.0.1.1:9001")
    after = Placement([*nodes, newcomer])
    moved = 0
    for key in KEYS:
        old, new = before.owners(key, 3), after.owners(key, 3)
        if old[0] != new[0]:
            moved += 1
            assert new[0] == newcomer
        # Replica sets change only by taking in the newcomer.
        assert set(new) <= set(old) | {newcomer}
    assert moved / len(KEYS) == pytest.approx(1 / 11, rel=0.3)


def test_removing_a_node_moves_only_its_keys() -> None:
    nodes = fleet(10)
    before = Placement(nodes)
    gone = nodes[3]
    after = Placement([node for node in nodes if node != gone])
    orphaned = 0
    for key in KEYS:
        old, new = before.owners(key)[0], after.owners(key)[0]
        if old == gone:
            orphaned += 1
            # The next replica takes over: a replicated key stays cached somewhere.
            assert new == before.owners(key, 2)[1]
        else:
            assert new == old
    assert orphaned / len(KEYS) == pytest.approx(1 / 10, rel=0.3)


def test_replicas_spread_across_zones_without_moving_primaries() -> None:
    zoned = [Node(f"n{i}", f"h{i}:1", 1.0, zone=f"z{i % 3}") for i in range(9)]
    flat = [Node(n.id, n.address, n.weight) for n in zoned]
    by_zone, plain = Placement(zoned), Placement(flat)
    for key in KEYS[:3000]:
        owners = by_zone.owners(key, 3)
        assert len({node.zone for node in owners}) == 3
        assert owners[0].id == plain.owners(key)[0].id


def test_more_replicas_than_zones_fill_from_the_best_of_the_rest() -> None:
    nodes = [Node(f"n{i}", f"h{i}:1", 1.0, zone="a" if i < 4 else "b") for i in range(6)]
    placement = Placement(nodes)
    for key in KEYS[:1000]:
        owners = placement.owners(key, 3)
        assert len(set(owners)) == 3
        assert {node.zone for node in owners[:2]} == {"a", "b"}


def test_member_order_does_not_matter() -> None:
    nodes = [Node(f"node-{i}", f"10.0.0.{i}:9001", 1.0 + i % 3) for i in range(12)]
    assert primaries(Placement(nodes)) == primaries(Placement(list(reversed(nodes))))


def test_placement_is_the_same_in_another_process() -> None:
    code = (
        "import json, sys\n"
        "from gateway.cluster import Node, Placement, block_key\n"
        "p = Placement([Node(f'node-{i}', 'h:1', 1.0 + i) for i in range(5)])\n"
        "keys = [block_key(1, f'k{i}', 'e', 0) for i in range(500)]\n"
        "print(json.dumps([[n.id for n in p.owners(k, 3)] for k in keys]))\n"
    )
    # A different str hash seed: nothing may depend on Python's hash().
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    here = Placement([Node(f"node-{i}", "h:1", 1.0 + i) for i in range(5)])
    keys = [block_key(1, f"k{i}", "e", 0) for i in range(500)]
    assert json.loads(out.stdout) == [[n.id for n in here.owners(k, 3)] for k in keys]


def test_placement_is_stable_across_releases() -> None:
    # Nodes of two releases share a fleet during an upgrade; they must agree on owners. A
    # change of these values is a change of the placement scheme, and needs a new domain.
    assert partition_of(object_key(1, "a.txt")) == 125
    assert partition_of(block_key(7, "big.bin", '"e"', 3)) == 453
    placement = Placement(fleet(5))
    assert [n.id for n in placement.partition_owners(0)] == ["node-1", "node-0", "node-3"]
    assert [n.id for n in placement.partition_owners(1023)] == ["node-0", "node-4", "node-2"]


def test_placement_keys_are_unambiguous() -> None:
    keys = [
        object_key(1, "ab"),
        object_key(1, "a"),
        object_key(2, "ab"),
        block_key(1, "ab", "c", 0),
        block_key(1, "ab", "c", 1),
        block_key(1, "a", "bc", 0),
    ]
    assert len(set(keys)) == len(keys)
    assert object_key(1, "ab") == object_key(1, "ab")


def test_an_empty_placement_owns_nothing() -> None:
    assert Placement([]).owners(KEYS[0], 2) == ()


@pytest.mark.parametrize(
    "make",
    [
        lambda: Node("a", "h:1", 0.0),
        lambda: Node("a", "h:1", float("nan")),
        lambda: Node("", "h:1"),
        lambda: Placement([Node("a", "h:1"), Node("a", "h:2")]),
        lambda: Placement([Node("a", "h:1")]).owners(b"k", 4),
        lambda: Placement([Node("a", "h:1")]).owners(b"k", 0),
        lambda: block_key(1, "k", "e", -1),
    ],
)
def test_bad_input_is_refused(make: object) -> None:
    with pytest.raises(ValueError):
        make()  # type: ignore[operator]
