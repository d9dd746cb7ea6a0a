"""A map of at most a given number of entries that forgets the oldest first: the request
targets, rendered heads, signatures and versions the hot paths remember.

A plain dict kept to a size by popping `next(iter(d))` costs O(n) once it churns: each pop
leaves a dead slot at the front of the dict's entry table that the next `iter` walks past,
until the table is rebuilt (3.6 µs a put at 4,096 entries here, against 0.23 µs for
OrderedDict's linked list; a warm epoch of distinct presigned URLs paid it three or four
times a request).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Bounded(OrderedDict[K, V]):
    """At most `limit` entries; `put` forgets the oldest (first put) when a new key finds the
    map full. Reads, `pop` and `del` are OrderedDict's."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def put(self, key: K, value: V) -> None:
        if len(self) >= self.limit and key not in self:
            self.popitem(last=False)
        self[key] = value
