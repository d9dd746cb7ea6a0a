"""Under-stores behind one small async interface (see `base.Store`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import unquote, urlsplit

from gateway.stores.base import (
    ListPage,
    ObjectInfo,
    ObjectNotFound,
    Store,
    StoreAccessDenied,
    StoreError,
    StoreUnavailable,
    VersionChanged,
)

__all__ = [
    "ListPage",
    "ObjectInfo",
    "ObjectNotFound",
    "Store",
    "StoreAccessDenied",
    "StoreError",
    "StoreUnavailable",
    "VersionChanged",
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
