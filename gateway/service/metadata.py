"""In-process object metadata with per-mount TTL: what keeps a hot hit off store and database.

With several worker processes, what a worker remembers of a key holds only while no sibling
has written it since (generations.py): a write through any worker is read new through all.
"""

from __future__ import annotations

from collections import OrderedDict

from gateway.service.generations import Generations
from gateway.stores.base import ObjectInfo

_ASKED_MAX = 65_536  # keys looked up and not yet answered, whose generation is kept


class MetadataCache:
    """(mount id, key) -> (ObjectInfo, time checked, generation), LRU-bounded by entry count.
    `generations`: the node's shared change counters when it has several workers (None:
    one worker, nothing to hear of)."""

    def __init__(
        self, max_entries: int = 1_000_000, generations: Generations | None = None
    ) -> None:
        self._max = max_entries
        self._items: OrderedDict[tuple[int, str], tuple[ObjectInfo, float, int]] = OrderedDict()
        self._generations = generations
        # The generation of a key when it was found unknown or stale here: what the answer of
        # the lookup that follows is remembered under, so that a sibling's write landing
        # while that lookup is under way still counts as newer than its answer.
        self._asked: dict[tuple[int, str], int] = {}

    def fresh(self, mount_id: int, key: str, ttl: float, now: float) -> ObjectInfo | None:
        item = self._items.get((mount_id, key))
        gens = self._generations
        if item is not None:
            info, checked, generation = item
            if gens is not None and gens.current(gens.slot(mount_id, key)) != generation:
                del self._items[(mount_id, key)]  # a sibling worker wrote the key
            elif ttl < 0 or now - checked < ttl:
                self._items.move_to_end((mount_id, key))
                return info
        if gens is not None and (mount_id, key) not in self._asked:
            if len(self._asked) >= _ASKED_MAX:
                del self._asked[next(iter(self._asked))]
            self._asked[(mount_id, key)] = gens.current(gens.slot(mount_id, key))
        return None

    def peek(self, mount_id: int, key: str) -> ObjectInfo | None:
        """The last version known, however old: a hint (the read checks it with the store)."""
        item = self._items.get((mount_id, key))
        return None if item is None else item[0]

    def put(self, mount_id: int, key: str, info: ObjectInfo, now: float) -> None:
        generation = 0
        gens = self._generations
        if gens is not None:
            asked = self._asked.pop((mount_id, key), None)
            generation = gens.current(gens.slot(mount_id, key)) if asked is None else asked
        self._items[(mount_id, key)] = (info, now, generation)
        self._items.move_to_end((mount_id, key))
        while len(self._items) > self._max:
            self._items.popitem(last=False)

    def forget(self, mount_id: int, key: str) -> None:
        """Drop the key here, and tell the node's other workers it changed."""
        self._items.pop((mount_id, key), None)
        gens = self._generations
        if gens is not None:
            self._asked.pop((mount_id, key), None)
            gens.bump(gens.slot(mount_id, key))

    def close(self) -> None:
        if self._generations is not None:
            self._generations.close()
            self._generations = None

    def __len__(self) -> int:
        return len(self._items)
