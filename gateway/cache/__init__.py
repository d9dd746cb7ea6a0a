"""The local page store on SSD: objects cached as fixed-size blocks per version, shared by the
worker processes of one node, evicted by one janitor. Imports nothing from the rest of the
gateway."""

from gateway.cache.pages import (
    BlockKey,
    BlockWriter,
    FileRegion,
    FillFailed,
    PageStats,
    PageStore,
)

__all__ = ["BlockKey", "BlockWriter", "FileRegion", "FillFailed", "PageStats", "PageStore"]
