"""The memory tier: small hot objects kept as bytes in an LRU, so their hits need no thread hop."""

from __future__ import annotations

from collections import OrderedDict


class MemoryTier:
    """An LRU of whole objects bounded by total bytes; objects over `object_max` never enter."""

    def __init__(self, capacity_bytes: int, object_max: int) -> None:
        self._capacity = capacity_bytes
        self._object_max = min(object_max, capacity_bytes)
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self.bytes_used = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items

    @property
    def object_max(self) -> int:
        return self._object_max

    def accepts(self, size: int) -> bool:
        return size <= self._object_max

    def get(self, name: str) -> bytes | None:
        data = self._items.get(name)
        if data is not None:
            self._items.move_to_end(name)
        return data

    def put(self, name: str, data: bytes) -> None:
        if not self.accepts(len(data)):
            return
        self.discard(name)
        self._items[name] = data
        self.bytes_used += len(data)
        while self.bytes_used > self._capacity:
            _, old = self._items.popitem(last=False)
            self.bytes_used -= len(old)

    def discard(self, name: str) -> None:
        old = self._items.pop(name, None)
        if old is not None:
            self.bytes_used -= len(old)

    def clear(self) -> None:
        self._items.clear()
        self.bytes_used = 0
