"""The gs:// store: a bucket (and prefix) of Google Cloud Storage."""

from gateway.stores.gcs.store import CHUNK_SIZE, GcsStore, open_gcs

__all__ = ["CHUNK_SIZE", "GcsStore", "open_gcs"]
