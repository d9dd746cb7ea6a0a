"""Under-stores behind one small async interface (see `base.Store`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

import anyio.to_thread

from gateway.stores.base import (
    ContainerExists,
    ContainerNotEmpty,
    ContainerNotFound,
    IncompleteBody,
    InvalidPart,
    ListPage,
    ObjectInfo,
    ObjectNotFound,
    PartInfo,
    PreconditionFailed,
    Store,
    StoreAccessDenied,
    StoreError,
    StoreUnavailable,
    UnsupportedKey,
    UploadNotFound,
    VersionChanged,
    WriteAttrs,
)

if TYPE_CHECKING:
    from gateway.stores.local import LocalStore
    from gateway.stores.s3 import S3Store

__all__ = [
    "ContainerExists",
    "ContainerNotEmpty",
    "ContainerNotFound",
    "IncompleteBody",
    "InvalidPart",
    "ListPage",
    "ObjectInfo",
    "ObjectNotFound",
    "PartInfo",
    "PreconditionFailed",
    "Store",
    "StoreAccessDenied",
    "StoreError",
    "StoreUnavailable",
    "UnsupportedKey",
    "UploadNotFound",
    "VersionChanged",
    "WriteAttrs",
    "create_bucket",
    "delete_bucket",
    "open_store",
]


def open_store(uri: str, options: Mapping[str, str]) -> Store:
    """The store a mount's URI names: `file:///abs/path` or `s3://bucket[/prefix]`.

    Raises ValueError for an unknown scheme or a malformed URI. No I/O happens here: a missing
    folder or bucket shows as StoreUnavailable on first use.
    """
    try:
        parts = urlsplit(uri)
    except ValueError as exc:
        raise ValueError(f"malformed store URI: {exc}") from None
    if parts.username is not None or parts.password is not None:
        # Not echoed: the URI may carry a secret.
        raise ValueError("store URIs carry no credentials; put them in the mount options")
    if parts.query or parts.fragment:
        raise ValueError(f"store URI {uri!r} must have no query or fragment")
    scheme = parts.scheme.lower()
    if scheme == "file":
        from gateway.stores.local import LocalStore

        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"file URI {uri!r} names a host; use file:///absolute/path")
        path = unquote(parts.path)
        if not path.startswith("/") or "\0" in path:
            raise ValueError(f"file URI {uri!r} needs an absolute path: file:///absolute/path")
        if options:
            raise ValueError(f"file stores take no options, got {', '.join(sorted(options))}")
        return LocalStore(os.path.normpath(path))
    if scheme == "s3":
        from gateway.stores.s3 import S3Store

        bucket = parts.netloc
        if not bucket or ":" in bucket:
            raise ValueError(f"s3 URI {uri!r} needs a bucket name: s3://bucket[/prefix]")
        return S3Store(bucket, unquote(parts.path), options)
    raise ValueError(f"unknown store scheme {parts.scheme!r} in {uri!r}; expected file:// or s3://")


async def create_bucket(uri: str, options: Mapping[str, str]) -> None:
    """Create the container a URI names: `file:///abs/dir` (a folder, parents as needed) or
    `s3://bucket` (no prefix). ContainerExists if it is there already."""
    from gateway.stores.local_files import create_folder
    from gateway.stores.s3 import S3Store

    store = _container(uri, options)
    try:
        if isinstance(store, S3Store):
            await store.create_container(options.get("region"))
        else:
            await anyio.to_thread.run_sync(create_folder, store.root)
    finally:
        await store.close()


async def delete_bucket(uri: str, options: Mapping[str, str]) -> None:
    """Delete the container a URI names, if it holds no objects (ContainerNotEmpty else;
    the file store's internals and empty folders do not count). ContainerNotFound if none."""
    from gateway.stores.local_files import delete_folder
    from gateway.stores.s3 import S3Store

    store = _container(uri, options)
    try:
        if isinstance(store, S3Store):
            await store.delete_container()
        else:
            await anyio.to_thread.run_sync(delete_folder, store.root)
    finally:
        await store.close()


def _container(uri: str, options: Mapping[str, str]) -> LocalStore | S3Store:
    from gateway.stores.local import LocalStore
    from gateway.stores.s3 import S3Store

    store = open_store(uri, options)
    if isinstance(store, S3Store):
        if store.prefix:
            raise ValueError(f"a bucket URI names no prefix: s3://{store.bucket}, not {uri!r}")
        return store
    if isinstance(store, LocalStore):
        if store.root == "/":
            raise ValueError("the file system's root is no bucket")
        return store
    raise ValueError(f"{uri!r} names no store that has buckets")
