"""What the file store keeps beside the bytes: an object's ETag and attributes in a user
extended attribute, and the names it reserves for its own internals."""

from __future__ import annotations

import errno
import json
import logging
import mimetypes
import os
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gateway.stores.base import ObjectInfo, StoreError, WriteAttrs

log = logging.getLogger("gateway.stores.local")

XATTR = "user.s3gw.meta"
UPLOADS_DIR = ".s3gw-uploads"
_TEMP_MARK = ".s3gw-"
_TEMP_SUFFIX = ".tmp"

# Errors that mean "this file system keeps no user xattrs", not "this file has none".
_UNSUPPORTED = {errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM}
_warned_unsupported = False

# mimetypes reports .gz & co. as an *encoding*; S3 would not set Content-Encoding on a stored
# archive (clients would decompress it on the fly), so such files get an archive type instead.
_ARCHIVE_TYPES = {
    "gzip": "application/gzip",
    "bzip2": "application/x-bzip2",
    "xz": "application/x-xz",
    "compress": "application/x-compress",
    "br": "application/x-brotli",
}

# WriteAttrs field -> short JSON key; short keys keep the xattr within one ext4 block.
_FIELDS = {
    "content_type": "ct",
    "content_encoding": "ce",
    "content_disposition": "cd",
    "content_language": "cl",
    "cache_control": "cc",
    "expires": "ex",
}


def is_internal(name: str) -> bool:
    """Whether a file or folder name is one of the store's own (never listed, never a key)."""
    if name.startswith(".s3gw"):
        return True
    return name.startswith(".") and name.endswith(_TEMP_SUFFIX) and _TEMP_MARK in name


def temp_name(name: str) -> str:
    """A fresh hidden name beside `name`; its stem is cut so the whole stays under NAME_MAX."""
    stem = name.encode("utf-8")[:64].decode("utf-8", "ignore")
    return f".{stem}{_TEMP_MARK}{secrets.token_urlsafe(9)}{_TEMP_SUFFIX}"


def synthetic_etag(s: os.stat_result) -> str:
    # Never 32 bare hex digits: clients (rclone, aws-cli) check those as an MD5 of the bytes.
    return f'"{s.st_mtime_ns:x}-{s.st_size:x}"'


def bare(etag: str) -> str:
    return etag.removeprefix("W/").strip('"')


@dataclass(frozen=True, slots=True)
class StoredMeta:
    """The ETag and attributes of one version of a file, known by the size and mtime it had."""

    etag: str
    size: int
    mtime_ns: int
    attrs: WriteAttrs


def encode(meta: StoredMeta) -> bytes:
    doc: dict[str, Any] = {"etag": meta.etag, "size": meta.size, "mtime_ns": meta.mtime_ns}
    for name, short in _FIELDS.items():
        value = getattr(meta.attrs, name)
        if value is not None:
            doc[short] = value
    if meta.attrs.metadata:
        doc["meta"] = dict(meta.attrs.metadata)
    if meta.attrs.checksums:
        doc["sums"] = dict(meta.attrs.checksums)
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _strings(value: object) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items()}


def decode(raw: bytes) -> StoredMeta | None:
    """The recorded meta, or None for anything that is not ours (written by hand, truncated)."""
    try:
        doc = json.loads(raw)
        etag, size, mtime_ns = doc["etag"], doc["size"], doc["mtime_ns"]
    except (ValueError, KeyError, TypeError):
        return None
    if not (isinstance(etag, str) and isinstance(size, int) and isinstance(mtime_ns, int)):
        return None
    fields = {name: doc.get(short) for name, short in _FIELDS.items()}
    attrs = WriteAttrs(
        **{k: v if isinstance(v, str) else None for k, v in fields.items()},
        metadata=_strings(doc.get("meta")),
        checksums=_strings(doc.get("sums")),
    )
    return StoredMeta(etag, size, mtime_ns, attrs)


def load(target: int | str, s: os.stat_result) -> StoredMeta | None:
    """The meta of a file (path or fd) if it still describes these bytes, else None.

    A file rewritten behind the gateway's back keeps a stale xattr only if its size and
    mtime_ns both stayed the same, which an in-place rewrite within one clock tick can do.
    """
    try:
        raw = os.getxattr(target, XATTR)
    except OSError:
        return None  # none recorded, xattrs unsupported, or the file went away
    meta = decode(raw)
    if meta is None or meta.size != s.st_size or meta.mtime_ns != s.st_mtime_ns:
        return None
    return meta


def save(fd: int, meta: StoredMeta) -> bool:
    """Record meta on an open file; False if the file system keeps no user xattrs."""
    global _warned_unsupported
    try:
        os.setxattr(fd, XATTR, encode(meta))
    except OSError as exc:
        if exc.errno in _UNSUPPORTED:
            if not _warned_unsupported:
                _warned_unsupported = True
                log.warning(
                    "file store: no user xattrs here (%s); ETags are synthetic and "
                    "attributes are not kept",
                    exc.strerror,
                )
            return False
        if exc.errno in (errno.E2BIG, errno.ENOSPC, errno.ERANGE):
            # Dropping them silently would lose part of an acknowledged write.
            raise StoreError(
                f"object attributes too large for this file system's xattrs ({exc.strerror})"
            ) from None
        raise
    return True


def guess_info(key: str, s: os.stat_result, content_type: str | None) -> ObjectInfo:
    """The info of a file the gateway knows nothing more of than its stat."""
    return ObjectInfo(
        key=key,
        size=s.st_size,
        etag=synthetic_etag(s),
        last_modified=datetime.fromtimestamp(s.st_mtime_ns / 1e9, UTC),
        content_type=content_type,
    )


def stored_info(key: str, s: os.stat_result, meta: StoredMeta) -> ObjectInfo:
    a = meta.attrs
    return ObjectInfo(
        key=key,
        size=s.st_size,
        etag=meta.etag,
        last_modified=datetime.fromtimestamp(s.st_mtime_ns / 1e9, UTC),
        content_type=a.content_type,
        content_encoding=a.content_encoding,
        content_disposition=a.content_disposition,
        content_language=a.content_language,
        cache_control=a.cache_control,
        expires=a.expires,
        metadata=dict(a.metadata),
        checksums=dict(a.checksums),
    )


def guess_type(key: str) -> str:
    ctype, encoding = mimetypes.guess_type(key, strict=False)
    if encoding is not None:
        return _ARCHIVE_TYPES.get(encoding, "application/octet-stream")
    return ctype or "application/octet-stream"


def info_of(key: str, s: os.stat_result, target: int | str) -> ObjectInfo:
    """Info of the file at `target` (path or fd): what the gateway recorded when it wrote
    these very bytes, else what the stat and the key's extension tell."""
    meta = load(target, s)
    return stored_info(key, s, meta) if meta else guess_info(key, s, guess_type(key))
