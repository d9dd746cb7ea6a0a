"""How S3's attributes, metadata and ETags sit in an Azure blob's headers and metadata."""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import quote, urlencode
from xml.etree import ElementTree

from defusedxml import ElementTree as DefusedET

from gateway.stores.base import MetadataTooLarge, ObjectInfo, WriteAttrs
from gateway.stores.header_text import from_header, to_header

# Metadata names are C# identifiers to Azure. Ours start with "s3gw_"; user names that are
# not lowercase identifiers, or could be taken for ours, are kept hex-encoded.
ETAG = "s3gw_etag"  # the multipart ETag, which Azure cannot compute
EXPIRES = "s3gw_expires"  # Azure has no Expires property
SUM = "s3gw_sum_"  # + algorithm: the full-object checksums the writer gave, verified
ENCODED = "s3gwx_"
_PLAIN_NAME = re.compile(r"[a-z_][a-z0-9_]*\Z")
_MULTIPART = re.compile(r'"[0-9a-f]{32}-[0-9]+"\Z')
_CHECKSUMS = ("crc32", "crc32c", "crc64nvme", "sha1", "sha256")
# Names and values of a blob's metadata together, at most (Azure's limit).
MAX_METADATA = 8 << 10


@dataclass(frozen=True, slots=True)
class Found:
    """One blob as a HEAD or GET answered: our view of it, and Azure's own ETag for If-Match."""

    info: ObjectInfo
    azure_etag: str


# -- attributes <-> headers --------------------------------------------------------------------


def attr_headers(attrs: WriteAttrs, etag: str | None = None) -> dict[str, str]:
    """x-ms-blob-* properties and x-ms-meta-* names for a new blob (Put Blob, Put Block List)."""
    h: dict[str, str] = {}
    for name, value in (
        ("x-ms-blob-content-type", attrs.content_type),
        ("x-ms-blob-content-encoding", attrs.content_encoding),
        ("x-ms-blob-content-language", attrs.content_language),
        ("x-ms-blob-content-disposition", attrs.content_disposition),
        ("x-ms-blob-cache-control", attrs.cache_control),
    ):
        if value is not None:
            h[name] = to_header(value)
    if attrs.tags:
        h["x-ms-tags"] = tags_header(attrs.tags)
    return h | metadata_headers(attrs, etag)


# -- index tags --------------------------------------------------------------------------------


def tags_header(tags: Mapping[str, str]) -> str:
    """x-ms-tags: the tags as a URL-encoded query string."""
    return urlencode(tags, quote_via=quote, safe="")


def tags_xml(tags: Mapping[str, str]) -> bytes:
    """The body of Set Blob Tags."""
    root = ElementTree.Element("Tags")
    tag_set = ElementTree.SubElement(root, "TagSet")
    for k, v in tags.items():
        tag = ElementTree.SubElement(tag_set, "Tag")
        ElementTree.SubElement(tag, "Key").text = k
        ElementTree.SubElement(tag, "Value").text = v
    return ElementTree.tostring(root, encoding="utf-8", xml_declaration=True)


def read_tags(body: bytes) -> dict[str, str]:
    """The tags in Get Blob Tags' answer."""
    root = DefusedET.fromstring(body)
    return {t.findtext("Key") or "": t.findtext("Value") or "" for t in root.iterfind("TagSet/Tag")}


def metadata_headers(attrs: WriteAttrs, etag: str | None = None) -> dict[str, str]:
    meta: dict[str, str] = {}
    for name, value in attrs.metadata.items():
        name = name.lower()
        plain = _PLAIN_NAME.match(name) and not name.startswith("s3gw")
        meta[name if plain else ENCODED + name.encode("utf-8", "surrogatepass").hex()] = value
    if attrs.expires is not None:
        meta[EXPIRES] = attrs.expires
    for algorithm, value in attrs.checksums.items():
        if algorithm in _CHECKSUMS:
            meta[SUM + algorithm] = value
    if etag is not None and _MULTIPART.match(etag):
        meta[ETAG] = etag
    headers = {f"x-ms-meta-{k}": to_header(v) for k, v in meta.items()}
    size = sum(len(k) - len("x-ms-meta-") + len(v) for k, v in headers.items())
    if size > MAX_METADATA:
        raise MetadataTooLarge(
            f"as stored they take {size} bytes, and Azure keeps at most {MAX_METADATA} with a blob"
        )
    return headers


def read_metadata(meta: Mapping[str, str]) -> tuple[dict[str, str], str | None, dict[str, str]]:
    """User metadata, Expires and checksums from a blob's metadata (names without x-ms-meta-)."""
    user: dict[str, str] = {}
    checksums: dict[str, str] = {}
    expires = None
    for raw, value in meta.items():
        name, value = raw.lower(), from_header(value)
        if name == ETAG:
            continue
        if name == EXPIRES:
            expires = value
        elif name.startswith(SUM) and name[len(SUM) :] in _CHECKSUMS:
            checksums[name[len(SUM) :]] = value
        elif name.startswith(ENCODED):
            try:
                user[bytes.fromhex(name[len(ENCODED) :]).decode("utf-8")] = value
            except (ValueError, UnicodeDecodeError):
                user[name] = value
        else:
            user[name] = value
    return user, expires, checksums


def etag_of(meta: Mapping[str, str], md5_b64: str | None, azure_etag: str) -> str:
    """S3's ETag of a blob: the multipart form we kept, else its MD5 (Azure keeps Content-MD5
    in base64), else, for a blob written elsewhere without one, Azure's own ETag."""
    for name, value in meta.items():
        if name.lower() == ETAG and _MULTIPART.match(value):
            return value
    if md5_b64:
        try:
            digest = base64.b64decode(md5_b64, validate=True)
        except binascii.Error:
            digest = b""
        if len(digest) == 16:
            return f'"{digest.hex()}"'
    return azure_etag if azure_etag.startswith('"') else f'"{azure_etag}"'


def multipart_etag(md5s: Sequence[bytes]) -> str:
    return f'"{hashlib.md5(b"".join(md5s)).hexdigest()}-{len(md5s)}"'


def same_etag(a: str, b: str) -> bool:
    return a.strip('"') == b.strip('"')
