"""The values that cross the cache's boundary: what is cached (CacheKey), where (CacheEntry),
how it is doing (CacheStats), and the errors it raises."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

# A distinct domain per layout, so the block page store that replaces this cache can share a
# root without its names ever colliding with whole-object names.
_NAME_DOMAIN = b"gateway.cache.object.v1\x00"


@dataclass(frozen=True, slots=True)
class CacheKey:
    """One version of one object: a new ETag is a new key, so stale bytes are never found."""

    mount_id: int
    key: str
    etag: str
    _name: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Computed once: a hit looks the name up, and sha256 of a key costs ~1 µs each time.
        digest = hashlib.sha256(_NAME_DOMAIN)
        for part in (str(self.mount_id), self.key, self.etag):
            # Length prefixes make the encoding unambiguous whatever bytes a key or ETag holds.
            raw = part.encode("utf-8", "surrogatepass")
            digest.update(len(raw).to_bytes(8, "big"))
            digest.update(raw)
        object.__setattr__(self, "_name", digest.hexdigest())

    @property
    def name(self) -> str:
        """sha256 hex of the three fields; also the file name of the cached object."""
        return self._name


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """A committed object: read it with ObjectCache.read or ObjectCache.stream."""

    key_name: str
    size: int
    path: Path


@dataclass(frozen=True, slots=True)
class CacheStats:
    entries: int
    bytes_used: int
    hits: int
    misses: int
    evictions: int
    memory_bytes_used: int
    memory_entries: int
    memory_hits: int


class CacheError(Exception):
    """Base of the cache's own errors."""


class CacheMiss(CacheError):
    """The entry's file is gone or short (removed behind the cache's back); the index forgot it."""


class FillSizeError(CacheError):
    """A fill received fewer or more bytes than announced; it was aborted, nothing was kept."""


class FillAborted(CacheError):
    """The fill was aborted (by its leader, an error, or the cache closing) and keeps nothing."""
