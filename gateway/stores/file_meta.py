"""What the stores of folder trees (file://, hdfs://) keep beside the bytes: an object's ETag
and attributes in a user extended attribute, and the names they reserve for their internals
(uploads included)."""

from __future__ import annotations

import errno
import json
import logging
import mimetypes
import os
import re
import secrets
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from gateway.stores.base import MetadataTooLarge, ObjectInfo, UploadNotFound, WriteAttrs

log = logging.getLogger(__name__)

XATTR = "user.s3gw.meta"
UPLOADS_DIR = ".s3gw-uploads"
# Inside a folder `a`: the object of the key `a/` (a directory marker, as pyarrow and console
# tools make them), and the object of the key `a` itself when keys below `a/` made it a folder.
DIR_MARKER = ".s3gw-dir"
FOLDER_SELF = ".s3gw-self"
WRITES_DIR = ".s3gw-writes"  # markers of the temp files being written (local.files.Temp)
_TEMP_MARK = ".s3gw-"
_TEMP_SUFFIX = ".tmp"
# Upload ids are ours (token_urlsafe); anything else could name a path outside UPLOADS_DIR.
_UPLOAD_ID = re.compile(r"[A-Za-z0-9_-]{16,64}\Z")

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


def new_upload_id() -> str:
    """The id of a new upload: the name of its folder under UPLOADS_DIR."""
    return secrets.token_urlsafe(24)


def upload_id_checked(upload_id: str) -> str:
    """`upload_id` if it can be one of ours; UploadNotFound else."""
    if not _UPLOAD_ID.match(upload_id):
        raise UploadNotFound(upload_id)
    return upload_id


def synthetic_etag(s: os.stat_result) -> str:
    # Never 32 bare hex digits: clients (rclone, aws-cli) check those as an MD5 of the bytes.
    return f'"{s.st_mtime_ns:x}-{s.st_size:x}"'


@dataclass(frozen=True, slots=True)
class StoredMeta:
    """The ETag and attributes of one version of a file, known by the size and mtime it had."""

    etag: str
    size: int
    mtime_ns: int
    attrs: WriteAttrs
    parts: tuple[int, ...] = ()  # the sizes of the parts it was uploaded in (partNumber)


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
    if meta.attrs.tags:
        doc["tags"] = dict(meta.attrs.tags)
    if meta.parts:
        doc["parts"] = list(meta.parts)
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
    strings: dict[str, Any] = {k: v if isinstance(v, str) else None for k, v in fields.items()}
    attrs = WriteAttrs(
        **strings,
        metadata=_strings(doc.get("meta")),
        checksums=_strings(doc.get("sums")),
        tags=_strings(doc.get("tags")),
    )
    raw_parts = doc.get("parts")
    parts: tuple[int, ...] = ()
    if isinstance(raw_parts, list) and all(isinstance(n, int) for n in raw_parts):
        parts = tuple(raw_parts)
    return StoredMeta(etag, size, mtime_ns, attrs, parts)


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
    raw = encode(meta)
    try:
        os.setxattr(fd, XATTR, raw)
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
            raise MetadataTooLarge(
                f"as stored they take {len(raw)} bytes, more than this file system keeps with a"
                " file (ext4: about 4 KB)"
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
        tags={},
    )


def with_tags(
    meta: StoredMeta | None, tags: dict[str, str], size: int, mtime_ns: int, info: ObjectInfo
) -> StoredMeta:
    """The meta of a file with its tags replaced: the recorded one, or, for a file the gateway
    recorded nothing of, what its stat told (`info`: its synthetic ETag becomes the recorded
    one, the same string). Tags live in the meta's own xattr, so they follow the bytes: a new
    version written over the file has none, and so has a file changed behind our back."""
    if meta is None:
        meta = StoredMeta(info.etag, size, mtime_ns, WriteAttrs(content_type=info.content_type))
    return replace(meta, attrs=replace(meta.attrs, tags=tags))


def stored_info(key: str, s: os.stat_result, meta: StoredMeta) -> ObjectInfo:
    modified = datetime.fromtimestamp(s.st_mtime_ns / 1e9, UTC)
    return recorded_info(key, s.st_size, modified, meta)


def recorded_info(key: str, size: int, modified: datetime, meta: StoredMeta) -> ObjectInfo:
    """The info of a file whose ETag and attributes the gateway recorded (`meta`)."""
    return meta.attrs.info(key, size, meta.etag, modified)


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
