"""In-process object metadata with per-mount TTL: what keeps a hot hit off store and database."""

from __future__ import annotations

from collections import OrderedDict

from gateway.stores.base import ObjectInfo


class MetadataCache:
    """(mount id, key) -> (ObjectInfo, time checked), LRU-bounded by entry count."""

    def __init__(self, max_entries: int = 1_000_000) -> None:
        self._max = max_entries
        self._items: OrderedDict[tuple[int, str], tuple[ObjectInfo, float]] = OrderedDict()

    def fresh(self, mount_id: int, key: str, ttl: float, now: float) -> ObjectInfo | None:
        item = self._items.get((mount_id, key))
        if item is None:
            return None
        info, checked = item
        if ttl < 0 or now - checked < ttl:
            self._items.move_to_end((mount_id, key))
            return info
        return None

    def peek(self, mount_id: int, key: str) -> ObjectInfo | None:
        item = self._items.get((mount_id, key))
        return None if item is None else item[0]

    def put(self, mount_id: int, key: str, info: ObjectInfo, now: float) -> None:
        self._items[(mount_id, key)] = (info, now)
        self._items.move_to_end((mount_id, key))
        while len(self._items) > self._max:
            self._items.popitem(last=False)

    def forget(self, mount_id: int, key: str) -> None:
        self._items.pop((mount_id, key), None)

    def __len__(self) -> int:
        return len(self._items)
