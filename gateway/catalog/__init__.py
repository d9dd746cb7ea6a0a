"""The catalog: the keys of `catalog=on` mounts in the gateway's database, filled by a crawl,
kept fresh by writes through the gateway, re-crawls and the store's change notifications,
and answering listings, HEADs and the metadata half of cold GETs (docs/catalog.md). The keys'
rows are the table of object versions (gateway.meta.versions, gateway.service.versions)."""

from .catalog import Catalog
from .crawl import SyncBusy, SyncProgress, SyncState, run_owner, sync, sync_states
from .options import OPTIONS, CatalogOptions, catalog_options
from .parallel import sync_parallel

__all__ = [
    "OPTIONS",
    "Catalog",
    "CatalogOptions",
    "SyncBusy",
    "SyncProgress",
    "SyncState",
    "catalog_options",
    "run_owner",
    "sync",
    "sync_parallel",
    "sync_states",
]
