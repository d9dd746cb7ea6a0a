"""The local page store on SSD: objects cached as fixed-size blocks per version, shared by the
worker processes of one node (`PageStore`, storage), filled from the stores one fetch per block
on the node (`Fills`), and evicted by one janitor in the order of a policy chosen by name
(policy.py). Imports nothing from the rest of the gateway."""

from gateway.cache.checks import share as share_checks
from gateway.cache.figures import CacheFigures, MountFigures, PageStats
from gateway.cache.fills import Arrival, Fetch, Fills
from gateway.cache.janitor import JanitorStats
from gateway.cache.pages import (
    BlockKey,
    BlockWriter,
    FileRegion,
    FillFailed,
    PageStore,
)

__all__ = [
    "Arrival", "BlockKey", "BlockWriter", "CacheFigures", "Fetch", "FileRegion", "FillFailed",
    "Fills", "JanitorStats", "MountFigures", "PageStats", "PageStore", "share_checks",
]  # fmt: skip
