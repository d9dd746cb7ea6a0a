"""The wire forms of the GCS store: object resources as ObjectInfo and back (S3 attributes
that GCS has no field for travel in custom metadata), JSON answers, and bodies cut up for
uploads."""

from __future__ import annotations

import base64
import binascii
import json
import re
import secrets
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import Any

from gateway.stores.base import IncompleteBody, KeyTooLong, MetadataTooLarge, ObjectInfo, WriteAttrs

SLICE = 256 << 10  # bodies are handed to aiohttp in copies of this size
# GCS's limits: an object name's UTF-8 bytes, and an object's custom metadata, keys and values.
MAX_NAME, MAX_METADATA = 1024, 8 << 10

# Unfinished multipart uploads live under this folder of the mount, never listed or read.
HIDDEN = ".s3gw-uploads/"

# Custom metadata keys of our own. A user key with this prefix is stored escaped (USER_ESCAPE
# before it), so that no client can forge an ETag or a checksum through x-amz-meta-*.
INTERNAL = "s3gw-"
USER_ESCAPE = "s3gw-user-"
ETAG_KEY = "s3gw-etag"  # multipart uploads and copies: compose makes objects without an MD5
EXPIRES_KEY = "s3gw-expires"
CHECKSUM_PREFIX = "s3gw-checksum-"  # a writer's verified sha256/sha1/crc32/crc64nvme
KEY_KEY = "s3gw-key"  # an upload's marker: the key it is for
TAGS_KEY = "s3gw-tags"  # S3 object tags, as one JSON object (emulators keep a deleted key)

_FIELDS = (
    ("contentType", "content_type"),
    ("contentEncoding", "content_encoding"),
    ("contentDisposition", "content_disposition"),
    ("contentLanguage", "content_language"),
    ("cacheControl", "cache_control"),
)
_FRACTION = re.compile(r"\.(\d{6})\d+")


def etag_of(resource: Mapping[str, Any]) -> str:
    """The S3 ETag of an object: the one we kept with it, else its MD5 in hex; an object
    composed by another client has no MD5, and its generation stands in."""
    kept = (resource.get("metadata") or {}).get(ETAG_KEY)
    if kept:
        return str(kept)
    md5 = resource.get("md5Hash")
    if md5:
        try:
            return f'"{base64.b64decode(md5, validate=True).hex()}"'
        except (binascii.Error, ValueError):
            pass
    return f'"g{resource.get("generation", 0)}"'


def parse_time(value: str | None) -> datetime:
    """An RFC 3339 time as GCS writes it (fromisoformat takes at most microseconds)."""
    if not value:
        return datetime.fromtimestamp(0, UTC)
    moment = datetime.fromisoformat(_FRACTION.sub(r".\1", value))
    return moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)


def object_info(key: str, resource: Mapping[str, Any]) -> ObjectInfo:
    meta: Mapping[str, str] = resource.get("metadata") or {}
    user: dict[str, str] = {}
    checksums: dict[str, str] = {}
    tags: dict[str, str] = {}
    for name, value in meta.items():
        if name.startswith(USER_ESCAPE):
            user[name[len(USER_ESCAPE) :]] = value
        elif name.startswith(CHECKSUM_PREFIX):
            checksums[name[len(CHECKSUM_PREFIX) :]] = value
        elif name == TAGS_KEY:
            tags = _tags(value)
        elif not name.startswith(INTERNAL):
            user[name] = value
    if resource.get("crc32c"):
        # Base64 of the big-endian CRC32C, as x-amz-checksum-crc32c; a composed object's too.
        checksums["crc32c"] = str(resource["crc32c"])
    fields: dict[str, Any] = {ours: resource.get(theirs) for theirs, ours in _FIELDS}
    return ObjectInfo(
        key=key,
        size=int(resource.get("size") or 0),
        etag=etag_of(resource),
        last_modified=parse_time(resource.get("updated") or resource.get("timeCreated")),
        expires=meta.get(EXPIRES_KEY),
        metadata=user,
        storage_class=str(resource.get("storageClass") or "STANDARD"),
        checksums=checksums,
        tags=tags,
        tag_count=len(tags),
        **fields,
    )


def _tags(value: str) -> dict[str, str]:
    try:
        doc = json.loads(value)
    except ValueError:
        return {}
    if not isinstance(doc, dict):
        return {}
    return {str(k): str(v) for k, v in doc.items()}


def tags_value(tags: Mapping[str, str]) -> str:
    """The metadata value of TAGS_KEY; "{}" for none (a patch cannot remove a key from every
    emulator, and an empty object reads as no tags)."""
    return json.dumps(dict(tags), ensure_ascii=False, separators=(",", ":"))


def check_name(name: str) -> None:
    """KeyTooLong for an object name longer than GCS holds (reads and writes alike)."""
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME:
        raise KeyTooLong(
            f"with the mount's prefix it is {size} bytes, and GCS holds object names of at"
            f" most {MAX_NAME} bytes"
        )


def resource_for(
    name: str, attrs: WriteAttrs, extra: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The object resource a write sends: attributes, and custom metadata (escaped user
    keys, Expires, the writer's checksums, and `extra` of our own)."""
    meta = {USER_ESCAPE + k if k.startswith(INTERNAL) else k: v for k, v in attrs.metadata.items()}
    if attrs.expires is not None:
        meta[EXPIRES_KEY] = attrs.expires
    for algorithm, value in attrs.checksums.items():
        if algorithm != "crc32c":  # GCS keeps its own, of the same bytes
            meta[CHECKSUM_PREFIX + algorithm] = value
    if attrs.tags:
        meta[TAGS_KEY] = tags_value(attrs.tags)
    meta.update(extra or {})
    size = sum(len(k.encode("utf-8")) + len(v.encode("utf-8")) for k, v in meta.items())
    if size > MAX_METADATA:
        raise MetadataTooLarge(
            f"as stored they take {size} bytes, and GCS keeps at most {MAX_METADATA} with an object"
        )
    resource: dict[str, Any] = {"name": name, "metadata": meta}
    for theirs, ours in _FIELDS:
        value = getattr(attrs, ours)
        if value is not None:
            resource[theirs] = value
    if "crc32c" in attrs.checksums:
        resource["crc32c"] = attrs.checksums["crc32c"]  # GCS verifies it against the bytes
    return resource


def persisted(header: str | None) -> int:
    """How many bytes a session holds, from a 308's 'Range: bytes=0-N' (none: nothing)."""
    if not header or "-" not in header:
        return 0
    return int(header.rpartition("-")[2]) + 1


def json_object(body: bytes) -> dict[str, Any]:
    """A JSON object answer; {} for an empty body, or one that is no JSON object."""
    try:
        value = json.loads(body)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode("ascii")


async def gather(body: AsyncIterator[bytes], size: int, key: str) -> bytearray:
    """The whole (small) body; IncompleteBody unless it has exactly `size` bytes."""
    data = bytearray()
    async for chunk in body:
        data += chunk
        if len(data) > size:
            raise IncompleteBody(f"{key}: the body is longer than its declared {size} bytes")
    if len(data) != size:
        raise IncompleteBody(f"{key}: the body ended after {len(data)} of {size} bytes")
    return data


async def pieces(
    body: AsyncIterator[bytes], size: int, piece_size: int, key: str
) -> AsyncGenerator[bytearray, None]:
    """The body in pieces of piece_size bytes, the last one shorter or equal. The last piece
    comes only once the body has ended cleanly with exactly `size` bytes: it is the one
    that completes an upload, so a body that fails, even after its last byte, completes none."""
    buf = bytearray()
    taken = 0
    async for chunk in body:
        taken += len(chunk)
        if taken > size:
            raise IncompleteBody(f"{key}: the body is longer than its declared {size} bytes")
        buf += chunk
        while len(buf) > piece_size or (len(buf) == piece_size and taken < size):
            # The piece keeps the buffer; only the bytes past it are copied out.
            piece, buf = buf, buf[piece_size:]
            del piece[piece_size:]
            yield piece
    if taken != size:
        raise IncompleteBody(f"{key}: the body ended after {taken} of {size} bytes")
    yield buf


async def slices(*blocks: bytes | bytearray, start: int = 0) -> AsyncGenerator[bytes, None]:
    """The blocks (the first from `start`) in copies of SLICE bytes: no view of a block
    outlives the request, so a piece can be freed (cleared) as soon as it is sent."""
    for block in blocks:
        for at in range(start, len(block), SLICE):
            yield bytes(block[at : at + SLICE])
        start = 0


def related(resource: Mapping[str, Any], data_size: int) -> tuple[dict[str, str], bytes, bytes]:
    """Headers, head and tail of a multipart/related upload: the resource, then the media.
    The media goes between head and tail unjoined, so a body is never copied whole."""
    boundary = secrets.token_hex(16)
    media_type = resource.get("contentType") or "application/octet-stream"
    head = (
        f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n"
        f"{json.dumps(resource)}\r\n--{boundary}\r\nContent-Type: {media_type}\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    headers = {
        "Content-Type": f"multipart/related; boundary={boundary}",
        "Content-Length": str(len(head) + data_size + len(tail)),
    }
    return headers, head, tail
