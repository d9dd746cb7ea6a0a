"""The s3:// store: a bucket (and prefix) of any S3-compatible origin."""

from gateway.stores.s3.store import CHUNK_SIZE, S3Store, open_s3, parse_timestamp

__all__ = ["CHUNK_SIZE", "S3Store", "open_s3", "parse_timestamp"]
