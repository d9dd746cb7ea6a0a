"""Which nodes own a key: weighted rendezvous (HRW) hashing over a fixed table of partitions.

Keys hash to one of `partitions` partitions; each partition's owners are ranked by HRW once per
membership change, so a lookup is one hash and one table index whatever the fleet's size.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import math
import sys
from array import array
from collections.abc import Iterable
from dataclasses import dataclass

# Every node of a fleet must use the same number, or they disagree on owners. Apache Ignite's
# default: enough that each node of a few hundred gets many partitions (even shares), few
# enough that ranking them all on a membership change stays cheap.
DEFAULT_PARTITIONS = 1024
DEFAULT_MAX_REPLICAS = 3

# Domain separation: the partition hash of a key and the HRW hash of a node never coincide by
# construction, and a new scheme (v2) can never be mistaken for this one.
_PARTITION_HASH = hashlib.blake2b(digest_size=8, person=b"gw.partition.v1")
_RANK_DOMAIN = b"gw.rank.v1\x00"
# The top 53 bits of a hash, plus one half, over 2**53: exactly representable in a double and
# strictly inside (0, 1), so ln() is finite and negative. (All 64 bits would round to 1.0.)
_FRACTION_BITS = 53
_FRACTION_SCALE = 1.0 / (1 << _FRACTION_BITS)

_OBJECT_TAG = b"k"  # "o" named a version (with its ETag) before block 0 was placed by key
_BLOCK_TAG = b"b"


@dataclass(frozen=True, slots=True)
class Node:
    """A member of the fleet: its id, how peers reach its internal API, its share, its zone."""

    id: str
    address: str  # "host:port" of the node's internal API
    weight: float = 1.0  # share of placement, relative to the others (the cache size, say)
    zone: str = ""  # replicas prefer distinct zones when the fleet has several

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("a node id must not be empty")
        if not (self.weight > 0 and math.isfinite(self.weight)):
            raise ValueError(
                f"node {self.id!r}: weight must be a positive number, not {self.weight}"
            )


def object_key(mount_id: int, key: str) -> bytes:
    """The placement key of an object's first block (all of an object below a block): the key
    alone, so that a node that does not know the version yet knows who opens it."""
    return _OBJECT_TAG + _encode(mount_id, key, "")


def block_key(mount_id: int, key: str, etag: str, block: int) -> bytes:
    """The placement key of one block of an object version: each block is placed on its own."""
    if block < 0:
        raise ValueError(f"block index must not be negative: {block}")
    return _BLOCK_TAG + _encode(mount_id, key, etag) + block.to_bytes(8, "big")


def owner_key(mount_id: int, key: str, etag: str, index: int) -> bytes:
    """The placement key of block `index` of a version: block 0 (all of an object below a
    block) by the key alone, the others each on its own. Nodes and clients alike look owners
    up by this."""
    return object_key(mount_id, key) if index == 0 else block_key(mount_id, key, etag, index)


def _encode(mount_id: int, key: str, etag: str) -> bytes:
    # Length prefixes make the encoding unambiguous whatever bytes a key or an ETag holds, and
    # the leading tag keeps an object's key apart from any of its blocks'.
    raw_key = key.encode("utf-8", "surrogatepass")
    raw_etag = etag.encode("utf-8", "surrogatepass")
    return b"".join(
        (
            mount_id.to_bytes(8, "big", signed=True),
            len(raw_key).to_bytes(4, "big"),
            raw_key,
            len(raw_etag).to_bytes(4, "big"),
            raw_etag,
        )
    )


def partition_of(key: bytes, partitions: int = DEFAULT_PARTITIONS) -> int:
    """The partition a placement key falls in: stable across processes, hosts and releases."""
    digest = _PARTITION_HASH.copy()
    digest.update(key)
    return int.from_bytes(digest.digest(), "big") % partitions


@functools.lru_cache(maxsize=2048)
def _scores(node_id: str, weight: float, partitions: int) -> array[float]:
    """The node's HRW score in every partition: -weight / ln(h), h = hash(node, partition).

    h is the partition's 8 bytes of SHAKE-256 output for the node: one C call yields all of a
    node's hashes, three times cheaper than a blake2b per partition in a Python loop. Memoized,
    since a membership change keeps most nodes: a rebuild then hashes only the newcomer.
    """
    raw = node_id.encode("utf-8", "surrogatepass")
    stream = hashlib.shake_256(_RANK_DOMAIN + len(raw).to_bytes(4, "big") + raw)
    hashes = array("Q", stream.digest(8 * partitions))
    if sys.byteorder == "big":
        hashes.byteswap()  # little-endian words on every host, so all hosts agree
    log = math.log
    shift = 64 - _FRACTION_BITS
    return array("d", [-weight / log(((h >> shift) + 0.5) * _FRACTION_SCALE) for h in hashes])


class Placement:
    """The owners of every partition for one membership: build once per change, look up often.

    Immutable after construction, so the request path may read it from any task or thread
    while the next one is being built.
    """

    def __init__(
        self,
        nodes: Iterable[Node],
        partitions: int = DEFAULT_PARTITIONS,
        max_replicas: int = DEFAULT_MAX_REPLICAS,
    ) -> None:
        if partitions < 1:
            raise ValueError(f"partitions must be at least 1, not {partitions}")
        if max_replicas < 1:
            raise ValueError(f"max_replicas must be at least 1, not {max_replicas}")
        # Sorted by id: the same members in any order give the same table.
        self.nodes: tuple[Node, ...] = tuple(sorted(nodes, key=lambda node: node.id))
        ids = [node.id for node in self.nodes]
        if len(set(ids)) != len(ids):
            raise ValueError(f"node ids must be distinct: {ids}")
        self.partitions = partitions
        self.max_replicas = max_replicas
        self._by_id = {node.id: node for node in self.nodes}
        self._table = self._rank()

    def owners(self, key: bytes, replicas: int = 1) -> tuple[Node, ...]:
        """The nodes that own `key`, best first: `replicas` distinct ones, or all if fewer.

        The first is where a request for the key goes; the next ones are where it falls back
        to, in order. Empty only when the placement has no nodes.
        """
        if not 1 <= replicas <= self.max_replicas:
            raise ValueError(f"replicas must be between 1 and {self.max_replicas}, not {replicas}")
        # partition_of(), inlined: this runs for every block of every request.
        digest = _PARTITION_HASH.copy()
        digest.update(key)
        owners = self._table[int.from_bytes(digest.digest(), "big") % self.partitions]
        return owners if replicas >= len(owners) else owners[:replicas]

    def partition_of(self, key: bytes) -> int:
        return partition_of(key, self.partitions)

    def partition_owners(self, partition: int) -> tuple[Node, ...]:
        """All `max_replicas` owners of one partition, best first (for rebalancing and tests)."""
        return self._table[partition]

    def node(self, node_id: str) -> Node | None:
        return self._by_id.get(node_id)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._by_id

    def __len__(self) -> int:
        return len(self.nodes)

    def __repr__(self) -> str:
        return (
            f"Placement({len(self.nodes)} nodes, partitions={self.partitions}, "
            f"max_replicas={self.max_replicas})"
        )

    def _rank(self) -> list[tuple[Node, ...]]:
        nodes = self.nodes
        if not nodes:
            return [()] * self.partitions
        want = min(self.max_replicas, len(nodes))
        # Node indices per zone, in id order. Ranking within each zone and merging the zones'
        # bests gives the same owners as ranking all nodes at once: no zone can place more than
        # its own best `want`.
        groups: dict[str, list[int]] = {}
        for index, node in enumerate(nodes):
            groups.setdefault(node.zone, []).append(index)
        if want == 1 or len(groups) == 1:
            groups = {"": list(range(len(nodes)))}
        columns = [_scores(node.id, node.weight, self.partitions) for node in nodes]
        # One row per partition per zone: the zone's scores in that partition.
        zone_rows = [
            (members, list(zip(*(columns[i] for i in members), strict=True)))
            for members in groups.values()
        ]
        zones = [node.zone for node in nodes]
        table: list[tuple[Node, ...]] = []
        for partition in range(self.partitions):
            ranked: list[tuple[float, int]] = []
            for members, rows in zone_rows:
                row = rows[partition]
                ranked += ((row[i], members[i]) for i in _top(row, want))
            if len(zone_rows) > 1:
                ranked.sort(key=lambda candidate: candidate[0], reverse=True)
                best = _spread([index for _, index in ranked], zones, want)
            else:
                best = [index for _, index in ranked]
            table.append(tuple(nodes[i] for i in best))
        return table


def _top(row: tuple[float, ...], want: int) -> list[int]:
    """Positions of the `want` highest scores of `row`, highest first; ties go to the lower
    position (the lower node id)."""
    values = heapq.nlargest(want, row)
    if len(set(values)) == len(values):
        # nlargest over plain floats and a C-level index() beat sorting positions by key
        # threefold on a 500-node row.
        return [row.index(value) for value in values]
    return sorted(range(len(row)), key=row.__getitem__, reverse=True)[:want]


def _spread(ranked: list[int], zones: list[str], want: int) -> list[int]:
    """The first `want` of the HRW order, chosen to span as many zones as they can.

    The best node of each zone comes first, in rank order, then the best of the rest. The
    primary owner is always the HRW winner, so spreading never moves a key's first owner.
    """
    picked: list[int] = []
    seen: set[str] = set()
    for index in ranked:
        if zones[index] not in seen:
            seen.add(zones[index])
            picked.append(index)
            if len(picked) == want:
                return picked
    chosen = set(picked)
    return picked + [index for index in ranked if index not in chosen][: want - len(picked)]
