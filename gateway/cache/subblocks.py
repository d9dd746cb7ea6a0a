"""Sub-blocks: aligned pieces of a block, cached apart for readers of small random ranges.

A block of `length` bytes is cut into sub-blocks of `size` bytes (the last one shorter). A
reader that is not sequential and wants less than half a block reads only the sub-blocks that
cover its range; each is an entry of the page store of its own (a block file with the same
trailer, its own name, claim, single-flight fill and janitor accounting). A whole-block fill
later takes the sub-blocks already there and fetches only the rest, then drops them.

Named "sub-blocks", not "pieces": a piece is the 16 KiB unit of a block file's checksum table.
This module is the arithmetic and the names; the fills are fills.py's.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

_SUB_DOMAIN = b"gateway.cache.sub.v1\x00"


@dataclass(frozen=True, slots=True)
class SubKey:
    """Sub-block `index` of the block whose name's digest is `block`."""

    mount_id: int
    block: bytes  # the block's sha256 digest (BlockKey.digest)
    index: int
    digest: bytes = field(init=False, repr=False, compare=False)
    name: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        raw = hashlib.sha256(_SUB_DOMAIN + self.block + self.index.to_bytes(8, "big")).digest()
        object.__setattr__(self, "digest", raw)
        object.__setattr__(self, "name", raw.hex())


def count(length: int, size: int) -> int:
    """How many sub-blocks a block of `length` bytes has."""
    return max(1, -(-length // size))


def bounds(length: int, size: int, index: int) -> tuple[int, int]:
    """Bytes [lo, hi) of the block that sub-block `index` holds."""
    lo = index * size
    if not 0 <= lo < max(length, 1):
        raise ValueError(f"no sub-block {index} in a block of {length} bytes")
    return lo, min(lo + size, length)


def covering(start: int, end: int, size: int) -> range:
    """The indices of the sub-blocks that hold bytes [start, end) of a block."""
    if not 0 <= start < end:
        raise ValueError(f"empty or negative range [{start}, {end})")
    return range(start // size, (end - 1) // size + 1)


def applies(length: int, start: int, end: int, size: int) -> bool:
    """Whether a non-sequential read of bytes [start, end) of a block of `length` bytes reads
    sub-blocks rather than the whole block: sub-blocks are on (`size` > 0), the block has more
    than two of them, and the range's sub-blocks cover at most half of the block."""
    if size <= 0 or length <= 2 * size or not 0 <= start < end <= length:
        return False
    first, last = start // size, (end - 1) // size
    return 2 * (min((last + 1) * size, length) - first * size) <= length


def runs(indices: list[int]) -> list[tuple[int, int]]:
    """Consecutive runs of sorted indices, as (first, last) pairs: one store request each."""
    out: list[tuple[int, int]] = []
    for i in indices:
        if out and out[-1][1] + 1 == i:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out
