"""Under-stores behind one small async interface (see `base.Store`)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from urllib.parse import urlsplit

from gateway.stores.base import (
    ContainerExists,
    ContainerNotEmpty,
    ContainerNotFound,
    IncompleteBody,
    InvalidPart,
    InvalidVersionId,
    IsDeleteMarker,
    KeyTooLong,
    ListPage,
    MarkedDeleted,
    MetadataTooLarge,
    NoJournal,
    NoSuchVersion,
    ObjectInfo,
    ObjectNotFound,
    PartInfo,
    PreconditionFailed,
    Store,
    StoreAccessDenied,
    StoreError,
    StoreMissing,
    StoreRejected,
    StoreUnavailable,
    Swept,
    UnsupportedKey,
    UploadJournal,
    UploadNotFound,
    VersionChanged,
    VersionDeleted,
    VersionEntry,
    VersionsPage,
    WriteAttrs,
    WriteConflict,
)

__all__ = [
    "ContainerExists",
    "ContainerNotEmpty",
    "ContainerNotFound",
    "IncompleteBody",
    "InvalidPart",
    "InvalidVersionId",
    "IsDeleteMarker",
    "KeyTooLong",
    "ListPage",
    "MarkedDeleted",
    "MetadataTooLarge",
    "NoJournal",
    "NoSuchVersion",
    "ObjectInfo",
    "ObjectNotFound",
    "PartInfo",
    "PreconditionFailed",
    "Store",
    "StoreAccessDenied",
    "StoreError",
    "StoreMissing",
    "StoreRejected",
    "StoreUnavailable",
    "Swept",
    "UnsupportedKey",
    "UploadJournal",
    "UploadNotFound",
    "VersionChanged",
    "VersionDeleted",
    "VersionEntry",
    "VersionsPage",
    "WriteAttrs",
    "WriteConflict",
    "create_bucket",
    "delete_bucket",
    "open_store",
]


# scheme -> "module:function" building the store from (parsed URI, options); imported on use.
OPENERS: dict[str, str] = {
    "file": "gateway.stores.local:open_local",
    "s3": "gateway.stores.s3:open_s3",
    "gs": "gateway.stores.gcs:open_gcs",
    "az": "gateway.stores.azure:open_azure",
    "abfs": "gateway.stores.azure:open_azure",
    "abfss": "gateway.stores.azure:open_azure",
    "wasb": "gateway.stores.azure:open_azure",
    "wasbs": "gateway.stores.azure:open_azure",
    "hdfs": "gateway.stores.hdfs:open_hdfs",
    "webhdfs": "gateway.stores.hdfs:open_hdfs",
}


_CONTAINER_AT_HOST = frozenset({"abfs", "abfss", "wasb", "wasbs"})


def open_store(uri: str, options: Mapping[str, str]) -> Store:
    """The store a mount's URI names (file, s3, gs, az/abfs/wasbs, hdfs).

    Raises ValueError for an unknown scheme or a malformed URI. No I/O happens here: a missing
    folder or bucket shows as StoreUnavailable on first use.
    """
    try:
        parts = urlsplit(uri)
    except ValueError as exc:
        raise ValueError(f"malformed store URI: {exc}") from None
    # abfs://container@account... and wasb://container@account... name the container there.
    hadoop_form = parts.scheme.lower() in _CONTAINER_AT_HOST and parts.password is None
    if (parts.username is not None and not hadoop_form) or parts.password is not None:
        # Not echoed: the URI may carry a secret.
        raise ValueError("store URIs carry no credentials; put them in the mount options")
    if parts.query or parts.fragment:
        raise ValueError(f"store URI {uri!r} must have no query or fragment")
    target = OPENERS.get(parts.scheme.lower())
    if target is None:
        known = ", ".join(f"{s}://" for s in OPENERS)
        raise ValueError(f"unknown store scheme {parts.scheme!r} in {uri!r}; expected {known}")
    module, _, function = target.partition(":")
    try:
        opener = getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError):
        raise ValueError(f"{parts.scheme}:// stores are not available in this build") from None
    store: Store = opener(parts, options)
    return store


async def create_bucket(uri: str, options: Mapping[str, str]) -> None:
    """Create the container a URI names (a folder, an S3 bucket, ...); ContainerExists if it
    is there already."""
    store = open_store(uri, options)
    try:
        await store.create_container()
    finally:
        await store.close()


async def delete_bucket(uri: str, options: Mapping[str, str]) -> None:
    """Delete the container a URI names, if it holds no objects (ContainerNotEmpty else;
    the file store's internals and empty folders do not count). ContainerNotFound if none."""
    store = open_store(uri, options)
    try:
        await store.delete_container()
    finally:
        await store.close()
