"""The plan of a read: which spans of which blocks of a version a byte range is, in order, and
who holds each (this node, or the peers that own it). Pure: no I/O, no state."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gateway.cache import BlockKey
from gateway.cluster.placement import Node
from gateway.stores import ObjectInfo

Place = Callable[[int, BlockKey], tuple[Node, ...]]  # a block's holders; () for this node


@functools.lru_cache(maxsize=1 << 16)
def block_key(mount_id: int, key: str, etag: str, block_size: int, index: int) -> BlockKey:
    """The cache's name for a block: hashed once per hot block, not once per request."""
    return BlockKey(mount_id, key, etag, block_size, index)


@dataclass(frozen=True, slots=True)
class Span:
    """Bytes [start, end) of block `index` (`length` bytes, at `offset` in the object), and who
    holds it: this node's page store when `owners` is empty, else those peers, best first. A
    span with nothing to read (start == end) is a block to fetch ahead of the reader."""

    index: int
    key: BlockKey
    offset: int
    length: int
    start: int
    end: int
    owners: tuple[Node, ...] = ()

    @property
    def wanted(self) -> bool:
        return self.start < self.end


def plan(
    mount_id: int,
    info: ObjectInfo,
    block_size: int,
    start: int,
    end: int,
    ahead: int,
    place: Place,
) -> Iterator[Span]:
    """The spans of a read of bytes [start, end) of `info`, in order, then the blocks after
    them up to block `ahead`, to fetch ahead (spans with nothing to read). `place` names the
    holders of a block. Made as they are read: a large object's are not all made at once."""
    first, last = start // block_size, (end - 1) // block_size
    final = max(last, min(ahead, (info.size - 1) // block_size))
    for index in range(first, final + 1):
        offset = index * block_size
        length = min(block_size, info.size - offset)
        a = b = 0
        if index <= last:
            a, b = max(start, offset) - offset, min(end, offset + length) - offset
        bkey = block_key(mount_id, info.key, info.etag, block_size, index)
        yield Span(index, bkey, offset, length, a, b, place(index, bkey))


def here(index: int, bkey: BlockKey) -> tuple[Node, ...]:
    """The placement of a node alone: every block is its own."""
    return ()
