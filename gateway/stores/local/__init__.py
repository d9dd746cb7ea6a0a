"""The file:// store: a folder tree of this machine seen as a bucket."""

from gateway.stores.local.store import CHUNK_SIZE, LocalStore, open_local

__all__ = ["CHUNK_SIZE", "LocalStore", "open_local"]
