"""What the cache holds and how it answered, for one node and per mount: the figures operators
read in `gateway status`, the console and /metrics (one value, built by gateway/admin/metrics
from every worker's counts and the janitor's last pass), and the counts of one process they
are summed from (PageStats: its page store's reads and its fills')."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class MountFigures:
    """One mount's share of a node's cache. `capacity_bytes`: its quota, else the node's."""

    mount_id: int
    cache_bytes: int = 0
    pinned_bytes: int = 0
    capacity_bytes: int = 0
    hits: int = 0  # clients' block reads answered from the cache
    misses: int = 0  # clients' block reads that fetched, or waited for a fetch
    preload_fills: int = 0  # blocks preload (gateway load) fetched: not the clients' misses

    @property
    def hit_ratio(self) -> float | None:
        """The clients' hits over their lookups; None before the first lookup."""
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else None


@dataclass(frozen=True, slots=True)
class CacheFigures:
    """A node's cache: bytes held and pinned, its budget, the clients' hits and misses and the
    preload's fills (counted apart), and the same per mount that holds or read anything."""

    cache_bytes: int = 0
    pinned_bytes: int = 0
    capacity_bytes: int = 0
    hits: int = 0
    misses: int = 0
    preload_fills: int = 0
    mounts: tuple[MountFigures, ...] = ()

    @property
    def hit_ratio(self) -> float | None:
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else None


@dataclass(slots=True)
class MountCounts:
    """One mount's block reads, as PageStats counts them for the whole process."""

    hits: int = 0
    misses: int = 0
    preload_hits: int = 0
    preload_fills: int = 0


@dataclass(slots=True)
class PageStats:
    hits: int = 0  # block reads of clients answered from memory or disk
    memory_hits: int = 0
    misses: int = 0  # block reads of clients that had to fetch, or wait for a fetch
    # Preload (gateway load) reads its blocks through the same paths; counted apart, so that
    # a preload's fills are not the clients' misses (a hit ratio of 0% after a preload) and its
    # looks at blocks already cached are not their hits.
    preload_hits: int = 0
    preload_fills: int = 0
    joins: int = 0  # misses that joined a fill in flight instead of fetching again
    hit_bytes: int = 0
    fills: int = 0  # fills this process led to the end and kept
    fill_failures: int = 0
    prefetches: int = 0
    corrupt: int = 0  # damaged block files found and dropped
    written: int = 0  # blocks entered by write-through
    unkept: int = 0  # blocks served from the store but not kept: the disk failed (full...)
    zero_copy: int = 0  # block reads handed over as file regions, to be sent unread
    rechecks: int = 0  # of those, the ones whose block was read and checked first
    sealed: int = 0  # of those, the ones of a sealed file (fs-verity): never rechecked
    # Of those, the ones read in from the disk (and checked) on a thread before their send:
    # not in the page cache when asked for (peek_sendable)
    disk_sends: int = 0
    thread_claims: int = 0  # fills claimed on a thread: no spare listed, or another filler
    # Keys' records put back for a block 0 found on disk without one (PageStore.keep_record)
    records_kept: int = 0
    mounts: dict[int, MountCounts] = field(default_factory=dict)  # the four counts by mount

    def mount(self, mount_id: int) -> MountCounts:
        counts = self.mounts.get(mount_id)
        if counts is None:
            counts = self.mounts[mount_id] = MountCounts()
        return counts

    def hit(self, mount_id: int, preload: bool) -> None:
        """One block read answered from the cache, by a client or by a preload."""
        if preload:
            self.preload_hits += 1
            self.mount(mount_id).preload_hits += 1
        else:
            self.hits += 1
            self.mount(mount_id).hits += 1

    def miss(self, mount_id: int, preload: bool) -> None:
        """One block read that fetched, or waited for a fetch: a client's miss, or a preload's
        fill."""
        if preload:
            self.preload_fills += 1
            self.mount(mount_id).preload_fills += 1
        else:
            self.misses += 1
            self.mount(mount_id).misses += 1
