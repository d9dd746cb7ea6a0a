"""The local cache of whole objects on SSD, with a memory tier for small hot ones.

Imports nothing from the rest of the gateway. A block page store replaces it later behind the
same seams: CacheKey names a version, a Fill writes one, ObjectCache finds and reads them.
"""

from gateway.cache.disk import ObjectCache
from gateway.cache.fill import Fill
from gateway.cache.keys import (
    CacheEntry,
    CacheError,
    CacheKey,
    CacheMiss,
    CacheStats,
    FillAborted,
    FillSizeError,
)

__all__ = [
    "CacheEntry",
    "CacheError",
    "CacheKey",
    "CacheMiss",
    "CacheStats",
    "Fill",
    "FillAborted",
    "FillSizeError",
    "ObjectCache",
]
