"""What the cache holds and how it answered, for one node and per mount: the figures operators
read in `gateway status`, the console and /metrics (one value, built by gateway/admin/metrics
from every worker's counts and the janitor's last pass)."""

from __future__ import annotations

from dataclasses import dataclass


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
