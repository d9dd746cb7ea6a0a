"""Which blocks of the page store to evict, and in what order: one interface (`Policy`), its
policies by name (`create`, as Alluxio's `CacheEvictor.create` picks an evictor by name), and
the one there is, a scan-resistant segmented LRU with per-mount quotas and pins under one byte
budget (`SLRU`). Bookkeeping only, no I/O.

A block is known by (mount, name): the mount is part of its file's path. In the SLRU new
blocks enter the probationary segment; a second use promotes one to the protected segment,
which holds at most `protected_fraction` of the capacity (its least recent blocks fall back to
probation). Victims come from probation first, so a one-off sweep of many blocks only ever
displaces itself.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol

PROBATION = 0
PROTECTED = 1
PINNED = 2

# The value of an entry is one int, tick << _SIZE_BITS | size: about 48 bytes a block where a
# slotted object with its own ints would take over 100. The tick orders blocks across mounts.
_SIZE_BITS = 40
_SIZE = (1 << _SIZE_BITS) - 1

# (mount, name, size, segment, tick): what entries() yields and restore() takes; a policy
# without segments or ticks of its own gives PROBATION and its order.
Entry = tuple[int, bytes, int, int, int]


class Victim(NamedTuple):
    mount: int
    name: bytes
    size: int


@dataclass(frozen=True, slots=True)
class PolicyFigures:
    """What a policy holds, for the janitor's published figures and its log."""

    entries: int
    bytes_used: int
    pinned_bytes: int  # never evicted, so not room for anything else
    protected_bytes: int  # of blocks the policy keeps over others (used twice, for the SLRU)
    mounts: dict[int, int]  # bytes per mount that holds any
    mount_pinned: dict[int, int]  # pinned bytes per mount that has any


class Policy(Protocol):
    """The index of every block of a node and the order to evict them in: what the janitor
    asks of an eviction policy. It is told of blocks as the journals tell the janitor (add,
    access, remove, the pins taken off), and answers which to evict (victims)."""

    def set_capacity(self, capacity: int) -> None:
        """Bytes in all; a smaller capacity takes effect in the next victims()."""

    def set_quotas(self, quotas: Mapping[int, int]) -> None:
        """Bytes per mount id; a mount missing here has no quota of its own."""

    def add(self, mount: int, name: bytes, size: int, pinned: bool = False) -> None:
        """A block was committed (a known one keeps its place)."""

    def access(self, mount: int, name: bytes, pinned: bool | None = None) -> None:
        """A use of a block; `pinned` True pins it, False unpins it, None leaves it."""

    def remove(self, mount: int, name: bytes) -> bool:
        """The block is gone; whether it was known."""

    def unpin(self, mount: int, name: bytes) -> int | None:
        """An operator's unpin: the block's size, or None when it was not pinned."""

    def unpin_mount(self, mount: int) -> list[int]:
        """unpin() of every pinned block of the mount; their sizes."""

    def victims(self, free_needed: int = 0) -> list[Victim]:
        """The blocks to evict, already forgotten: every mount within its quota, the total
        within the capacity, and at least `free_needed` bytes freed (pins allowing)."""

    def entries(self) -> Iterator[Entry]:
        """Every block, in an order restore() rebuilds exactly (the janitor's snapshot)."""

    def restore(self, entries: Iterable[Entry]) -> None:
        """Load what entries() gave into an empty policy; ValueError for what none gave."""

    def figures(self) -> PolicyFigures: ...

    def __contains__(self, key: object) -> bool:
        """`(mount, name) in policy`."""


def create(capacity: int, quotas: Mapping[int, int] | None = None, *, name: str = "slru") -> Policy:
    """The eviction policy called `name`, within `capacity` bytes and the mounts' `quotas`."""
    make = POLICIES.get(name)
    if make is None:
        raise ValueError(f"no eviction policy {name!r} (there are: {', '.join(sorted(POLICIES))})")
    return make(capacity, quotas)


class _Mount:
    """One mount's blocks. Each ordered segment is oldest first and in tick order."""

    __slots__ = ("bytes", "pinned", "probation", "protected")

    def __init__(self) -> None:
        self.probation: OrderedDict[bytes, int] = OrderedDict()
        self.protected: OrderedDict[bytes, int] = OrderedDict()
        self.pinned: dict[bytes, int] = {}  # name -> size: pins have no order
        self.bytes = 0

    def ordered(self, segment: int) -> OrderedDict[bytes, int]:
        return self.probation if segment == PROBATION else self.protected

    def find(self, name: bytes) -> int | None:
        if name in self.probation:
            return PROBATION
        if name in self.protected:
            return PROTECTED
        if name in self.pinned:
            return PINNED
        return None

    def table(self, segment: int) -> dict[bytes, int]:
        return self.pinned if segment == PINNED else self.ordered(segment)


class SLRU:
    """The segmented LRU: the index of every block of a node and the order to evict them in.

    Each mount keeps its own orderings, so a mount's quota victims never pass over other
    mounts' blocks; a lazy heap of the mounts' oldest ticks finds the oldest block overall.
    Every operation is O(1) amortised, plus O(log mounts) for each block that victims() takes
    or that a promotion pushes out of the protected segment.
    """

    def __init__(
        self,
        capacity: int,
        *,
        protected_fraction: float = 0.8,
        quotas: Mapping[int, int] | None = None,
    ) -> None:
        if not 0.0 <= protected_fraction <= 1.0:
            raise ValueError("protected_fraction is a share between 0 and 1")
        self._fraction = protected_fraction
        self._capacity = 0
        self._protected_max = 0
        self._quotas: dict[int, int] = dict(quotas or {})
        self._mounts: dict[int, _Mount] = {}
        self._segment_bytes = [0, 0, 0]
        # Per ordered segment: (tick, mount) with a tick no newer than that mount's oldest.
        self._heads: tuple[list[tuple[int, int]], list[tuple[int, int]]] = ([], [])
        self._queued: tuple[set[int], set[int]] = (set(), set())
        self._tick = 0
        self._count = 0
        self.bytes_used = 0
        self.set_capacity(capacity)

    # -- settings -------------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def pinned_bytes(self) -> int:
        """Bytes of pinned blocks: never evicted, so not room for anything else."""
        return self._segment_bytes[PINNED]

    def set_capacity(self, capacity: int) -> None:
        """A smaller capacity takes effect in the next victims()."""
        if capacity < 0:
            raise ValueError("capacity must not be negative")
        self._capacity = capacity
        self._protected_max = int(capacity * self._fraction)
        self._rebalance()

    def set_quotas(self, quotas: Mapping[int, int]) -> None:
        """Bytes per mount id; a mount missing here has no quota of its own."""
        self._quotas = dict(quotas)

    # -- what the journals say ------------------------------------------------------------------

    def add(self, mount: int, name: bytes, size: int, pinned: bool = False) -> None:
        """A block was committed. A known block keeps its place (its size and pin may change):
        a block filled twice was not used twice."""
        if not 0 <= size <= _SIZE:
            raise ValueError(f"block size {size} out of range")
        m = self._mount(mount)
        segment = m.find(name)
        if segment is None:
            self._count += 1
        elif pinned == (segment == PINNED):
            table = m.table(segment)
            old = table[name]
            table[name] = (old & ~_SIZE) | size
            self._account(m, segment, size - (old & _SIZE))
            self._rebalance()
            return
        else:
            self._take(m, segment, name)
        self._put(mount, m, PINNED if pinned else PROBATION, name, size)

    def access(self, mount: int, name: bytes, pinned: bool | None = None) -> None:
        """A use of a block: the second one protects it. `pinned` True pins it, False unpins it
        (and counts as a use), None leaves its pin as it is. Unknown blocks are ignored."""
        m = self._mounts.get(mount)
        segment = m.find(name) if m is not None else None
        if m is None or segment is None:
            return
        if segment == PINNED:
            if pinned is False:
                self._put(mount, m, PROTECTED, name, self._take(m, PINNED, name))
                self._rebalance()
            return
        if pinned:
            self._put(mount, m, PINNED, name, self._take(m, segment, name))
            return
        if segment == PROBATION:
            self._put(mount, m, PROTECTED, name, self._take(m, PROBATION, name))
            self._rebalance()
        else:
            self._tick += 1
            m.protected.move_to_end(name)
            m.protected[name] = self._tick << _SIZE_BITS | (m.protected[name] & _SIZE)

    def unpin(self, mount: int, name: bytes) -> int | None:
        """An operator's unpin: a pinned block becomes the newest probationary one (its pin
        hid its uses, so it has earned no protection; its next use protects it). Its size, or
        None when it was not pinned (unknown, or an ordinary block: left where it is)."""
        m = self._mounts.get(mount)
        if m is None or name not in m.pinned:
            return None
        size = self._take(m, PINNED, name)
        self._put(mount, m, PROBATION, name, size)
        return size

    def unpin_mount(self, mount: int) -> list[int]:
        """unpin() of every pinned block of the mount; their sizes."""
        m = self._mounts.get(mount)
        if m is None:
            return []
        sizes = []
        for name in list(m.pinned):
            size = self._take(m, PINNED, name)
            self._put(mount, m, PROBATION, name, size)
            sizes.append(size)
        return sizes

    def remove(self, mount: int, name: bytes) -> bool:
        """The block is gone (dropped by a worker, or its file vanished)."""
        m = self._mounts.get(mount)
        segment = m.find(name) if m is not None else None
        if m is None or segment is None:
            return False
        self._take(m, segment, name)
        self._count -= 1
        return True

    # -- eviction -------------------------------------------------------------------------------

    def victims(self, free_needed: int = 0) -> list[Victim]:
        """The blocks to evict, already forgotten here: afterwards every mount is within its
        quota, the total within the capacity, and at least `free_needed` bytes were freed (as
        far as blocks that are not pinned allow)."""
        out: list[Victim] = []
        freed = 0
        for mount, quota in self._quotas.items():
            m = self._mounts.get(mount)
            while m is not None and m.bytes > quota:
                own = m.probation or m.protected
                if not own:
                    break
                name, value = own.popitem(last=False)
                size = value & _SIZE
                self._account(m, PROBATION if own is m.probation else PROTECTED, -size)
                out.append(Victim(mount, name, size))
                freed += size
        while self.bytes_used > self._capacity or freed < free_needed:
            victim = self._pop_oldest(PROBATION) or self._pop_oldest(PROTECTED)
            if victim is None:
                break
            out.append(victim)
            freed += victim.size
        self._count -= len(out)
        return out

    # -- state ----------------------------------------------------------------------------------

    def entries(self) -> Iterator[Entry]:
        """Every block, each mount's segments oldest first with their ticks: restore() on a new
        SLRU rebuilds this one's order exactly. Do not change the policy while iterating."""
        for mount, m in self._mounts.items():
            for segment in (PROBATION, PROTECTED):
                for name, value in m.ordered(segment).items():
                    yield mount, name, value & _SIZE, segment, value >> _SIZE_BITS
            for name, size in m.pinned.items():
                yield mount, name, size, PINNED, 0

    def restore(self, entries: Iterable[Entry]) -> None:
        """Load what entries() gave, into an empty policy (a snapshot's contents, at start).
        Raises ValueError for entries no SLRU could have given: a segment of one mount out of
        tick order, or a name twice in one segment."""
        if self._count:
            raise ValueError("restore() needs an empty policy")
        current: tuple[int, int] | None = None
        m = _Mount()
        table: dict[bytes, int] = {}
        last = -1
        records = 0
        for mount, name, size, segment, tick in entries:
            if (mount, segment) != current:
                m = self._mount(mount)
                table = m.table(segment)
                current = (mount, segment)
                last = next(reversed(table.values())) >> _SIZE_BITS if table else -1
                if segment != PINNED and not table:
                    self._queue(segment, mount, tick)
            if segment == PINNED:
                table[name] = size
            elif tick > last:
                table[name] = tick << _SIZE_BITS | size
                last = tick
            else:
                raise ValueError(f"mount {mount}: entries out of order at tick {tick}")
            self._account(m, segment, size)
            self._tick = max(self._tick, tick)
            records += 1
        self._count = sum(len(m.table(s)) for m in self._mounts.values() for s in range(3))
        if self._count != records:
            raise ValueError("a name twice in one segment")
        self._rebalance()

    def bytes_of(self, mount: int) -> int:
        m = self._mounts.get(mount)
        return m.bytes if m is not None else 0

    def mounts(self) -> dict[int, int]:
        """Bytes per mount that holds any."""
        return {mount: m.bytes for mount, m in self._mounts.items() if m.bytes}

    def pinned_mounts(self) -> dict[int, int]:
        """Bytes of pinned blocks per mount that has any (a sum over its pins: for the
        janitor's published figures, not for a hot path)."""
        pinned = {mount: sum(m.pinned.values()) for mount, m in self._mounts.items()}
        return {mount: n for mount, n in pinned.items() if n}

    def segment_bytes(self, segment: int) -> int:
        return self._segment_bytes[segment]

    def figures(self) -> PolicyFigures:
        return PolicyFigures(
            entries=self._count,
            bytes_used=self.bytes_used,
            pinned_bytes=self.pinned_bytes,
            protected_bytes=self._segment_bytes[PROTECTED],
            mounts=self.mounts(),
            mount_pinned=self.pinned_mounts(),
        )

    def __len__(self) -> int:
        return self._count

    def __contains__(self, key: object) -> bool:
        """`(mount, name) in policy`."""
        if not isinstance(key, tuple) or len(key) != 2:
            return False
        m = self._mounts.get(key[0])
        return m is not None and m.find(key[1]) is not None

    # -- internals ------------------------------------------------------------------------------

    def _mount(self, mount: int) -> _Mount:
        m = self._mounts.get(mount)
        if m is None:
            m = self._mounts[mount] = _Mount()
        return m

    def _account(self, m: _Mount, segment: int, delta: int) -> None:
        m.bytes += delta
        self.bytes_used += delta
        self._segment_bytes[segment] += delta

    def _put(self, mount: int, m: _Mount, segment: int, name: bytes, size: int) -> None:
        """Insert as the newest of `segment`."""
        if segment == PINNED:
            m.pinned[name] = size
        else:
            self._tick += 1
            ordered = m.ordered(segment)
            if not ordered:
                self._queue(segment, mount, self._tick)
            ordered[name] = self._tick << _SIZE_BITS | size
        self._account(m, segment, size)

    def _take(self, m: _Mount, segment: int, name: bytes) -> int:
        size = m.table(segment).pop(name) & _SIZE
        self._account(m, segment, -size)
        return size

    def _queue(self, segment: int, mount: int, tick: int) -> None:
        # A mount already queued has an entry no newer than `tick`: the heap stays valid.
        if mount not in self._queued[segment]:
            self._queued[segment].add(mount)
            heapq.heappush(self._heads[segment], (tick, mount))

    def _oldest_mount(self, segment: int) -> int | None:
        """The mount holding the oldest block of `segment`, fixing stale heap entries on the
        way: a head only ever gets newer, so a stale entry surfaces before the true minimum."""
        heap, queued = self._heads[segment], self._queued[segment]
        while heap:
            tick, mount = heap[0]
            ordered = self._mounts[mount].ordered(segment)
            if not ordered:
                heapq.heappop(heap)
                queued.discard(mount)
                continue
            head = next(iter(ordered.values())) >> _SIZE_BITS
            if head == tick:
                return mount
            heapq.heapreplace(heap, (head, mount))
        return None

    def _pop_oldest(self, segment: int) -> Victim | None:
        mount = self._oldest_mount(segment)
        if mount is None:
            return None
        m = self._mounts[mount]
        name, value = m.ordered(segment).popitem(last=False)
        size = value & _SIZE
        self._account(m, segment, -size)
        return Victim(mount, name, size)

    def _rebalance(self) -> None:
        """Demote the oldest protected blocks to the newest of probation while protected holds
        more than its share."""
        while self._segment_bytes[PROTECTED] > self._protected_max:
            victim = self._pop_oldest(PROTECTED)
            if victim is None:
                break
            mount, name, size = victim
            self._put(mount, self._mounts[mount], PROBATION, name, size)


# Policies by the name create() takes.
POLICIES: dict[str, Callable[[int, Mapping[int, int] | None], Policy]] = {
    "slru": lambda capacity, quotas: SLRU(capacity, quotas=quotas),
}
