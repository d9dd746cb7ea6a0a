"""S3's fields as botocore gives and takes them: an answer's headers in botocore's names, its
ObjectInfo, attributes and checksums as request arguments, the origin's clock."""

from __future__ import annotations

import base64
import contextlib
import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import format_datetime, parsedate_to_datetime
from typing import Any
from urllib.parse import quote, urlencode

from gateway.stores.base import ObjectInfo, WriteAttrs
from gateway.stores.etags import quoted
from gateway.stores.header_text import from_header, to_header

# Our checksum names -> S3's algorithm names; the first one a writer gives goes to the origin.
ALGORITHMS = {
    "sha256": "SHA256",
    "sha1": "SHA1",
    "crc64nvme": "CRC64NVME",
    "crc32c": "CRC32C",
    "crc32": "CRC32",
}


def attr_args(attrs: WriteAttrs) -> dict[str, Any]:
    # Metadata values that are not printable ASCII go as RFC 2047 words: botocore refuses any
    # other, and S3 itself keeps such a word as the text it encodes (info_of decodes it back).
    args: dict[str, Any] = {"Metadata": {k: to_header(v) for k, v in attrs.metadata.items()}}
    for name, value in (
        ("ContentType", attrs.content_type),
        ("ContentEncoding", attrs.content_encoding),
        ("ContentDisposition", attrs.content_disposition),
        ("ContentLanguage", attrs.content_language),
        ("CacheControl", attrs.cache_control),
    ):
        if value is not None:
            args[name] = value
    if attrs.expires is not None:
        # botocore takes only a date here; an unparsable Expires is as good as none to a cache.
        with contextlib.suppress(TypeError, ValueError):
            args["Expires"] = parsedate_to_datetime(attrs.expires)
    if attrs.tags:
        args["Tagging"] = urlencode(attrs.tags, quote_via=quote)
    if "customer_key_md5" in attrs.encryption:
        # Marked, so that the gateway refuses a read without the key whatever the origin
        # does with one (S3 refuses it itself; moto and some other origins serve it).
        args["Metadata"][CUSTOMER_KEY_MARK] = attrs.encryption["customer_key_md5"]
    return {**args, **encryption_args(attrs.encryption)}


# The user metadata name under which an object written with an SSE-C key keeps the key's MD5.
CUSTOMER_KEY_MARK = "s3gw-sse-c-key-md5"


# WriteAttrs.encryption's names -> botocore's arguments.
_ENCRYPTION_ARGS = {
    "algorithm": "ServerSideEncryption",
    "kms_key_id": "SSEKMSKeyId",
    "kms_context": "SSEKMSEncryptionContext",
    "customer_algorithm": "SSECustomerAlgorithm",
}


def encryption_args(encryption: Mapping[str, str], source: bool = False) -> dict[str, Any]:
    """Server-side encryption as botocore takes it; with `source`, the SSE-C key of a copy's
    source (CopySourceSSECustomer*). botocore base64-encodes the customer key and makes its
    MD5 itself, so it is given the key's bytes (the client's MD5 was checked already)."""
    args: dict[str, Any] = {}
    if not source:
        for name, arg in _ENCRYPTION_ARGS.items():
            if name in encryption:
                args[arg] = encryption[name]
        if "bucket_key" in encryption:
            args["BucketKeyEnabled"] = encryption["bucket_key"].lower() == "true"
    if "customer_key" in encryption:
        prefix = "CopySource" if source else ""
        args[f"{prefix}SSECustomerAlgorithm"] = encryption.get("customer_algorithm", "AES256")
        args[f"{prefix}SSECustomerKey"] = base64.b64decode(encryption["customer_key"])
    return args


def encryption_of(h: Mapping[str, Any]) -> dict[str, str]:
    """The encryption an origin's answer reports (ObjectInfo.encryption)."""
    found = {
        "algorithm": h.get("ServerSideEncryption"),
        "kms_key_id": h.get("SSEKMSKeyId"),
        "customer_algorithm": h.get("SSECustomerAlgorithm"),
        "customer_key_md5": h.get("SSECustomerKeyMD5"),
    }
    out = {k: str(v) for k, v in found.items() if v}
    bucket_key = h.get("BucketKeyEnabled")
    if bucket_key is not None and out.get("algorithm", "").startswith("aws:kms"):
        out["bucket_key"] = "true" if str(bucket_key).lower() == "true" else "false"
    return out


def tag_count_of(h: Mapping[str, Any]) -> int:
    """x-amz-tagging-count of an answer (botocore names it TagCount on a GET only)."""
    raw = h.get("TagCount")
    if raw is None:
        raw = h.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("x-amz-tagging-count")
    try:
        return int(raw) if raw is not None else 0
    except (TypeError, ValueError):
        return 0


def checksum_args(checksums: Mapping[str, str]) -> dict[str, str]:
    """One checksum for the origin to verify and keep (S3 takes one a request)."""
    for name, algorithm in ALGORITHMS.items():
        if name in checksums:
            return {"ChecksumAlgorithm": algorithm, f"Checksum{algorithm}": checksums[name]}
    return {}


def checksums_of(response: Mapping[str, Any]) -> dict[str, str]:
    """The full-object checksums in an origin's answer; a multipart's composite ones are not."""
    if response.get("ChecksumType") == "COMPOSITE":
        return {}
    found = {n: response.get(f"Checksum{a}") for n, a in ALGORITHMS.items()}
    return {n: v for n, v in found.items() if isinstance(v, str) and "-" not in v}


def answered_at(response: Mapping[str, Any]) -> datetime:
    """The origin's clock at its answer: S3 gives no Last-Modified to a PUT."""
    date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    with contextlib.suppress(TypeError, ValueError):
        return parsedate_to_datetime(date).astimezone(UTC)
    return datetime.now(UTC)


_META = "x-amz-meta-"
_CHECKSUMS = {
    "x-amz-checksum-crc32": "ChecksumCRC32",
    "x-amz-checksum-crc32c": "ChecksumCRC32C",
    "x-amz-checksum-crc64nvme": "ChecksumCRC64NVME",
    "x-amz-checksum-sha1": "ChecksumSHA1",
    "x-amz-checksum-sha256": "ChecksumSHA256",
}
_PLAIN = {
    "content-type": "ContentType",
    "content-encoding": "ContentEncoding",
    "content-disposition": "ContentDisposition",
    "content-language": "ContentLanguage",
    "cache-control": "CacheControl",
    "content-range": "ContentRange",
    "etag": "ETag",
    "x-amz-version-id": "VersionId",
    "x-amz-storage-class": "StorageClass",
    "x-amz-checksum-type": "ChecksumType",
    "x-amz-tagging-count": "TagCount",
    "x-amz-server-side-encryption": "ServerSideEncryption",
    "x-amz-server-side-encryption-aws-kms-key-id": "SSEKMSKeyId",
    "x-amz-server-side-encryption-bucket-key-enabled": "BucketKeyEnabled",
    "x-amz-server-side-encryption-customer-algorithm": "SSECustomerAlgorithm",
    "x-amz-server-side-encryption-customer-key-md5": "SSECustomerKeyMD5",
}


def answer_fields(headers: list[tuple[str, str]]) -> dict[str, Any]:
    """A GET or HEAD answer's headers as botocore's GetObject/HeadObject output names them
    (values decoded as Latin-1, as botocore's http.client does). KeyError, ValueError or
    TypeError for an answer without the fields every object has."""
    out: dict[str, Any] = {"Metadata": {}}
    for name, value in headers:
        lower = name.lower()
        if lower.startswith(_META):
            out["Metadata"][name[len(_META) :]] = value  # the name as sent, as botocore has it
        elif lower in _PLAIN:
            out[_PLAIN[lower]] = value
        elif lower in _CHECKSUMS:
            out[_CHECKSUMS[lower]] = value
        elif lower == "content-length":
            out["ContentLength"] = int(value)
        elif lower == "x-amz-mp-parts-count":
            out["PartsCount"] = int(value)
        elif lower == "last-modified":
            out["LastModified"] = parsedate_to_datetime(value).astimezone(UTC)
        elif lower == "expires":
            out["ExpiresString"] = value
            with contextlib.suppress(TypeError, ValueError):
                out["Expires"] = parsedate_to_datetime(value).astimezone(UTC)
    for needed in ("ContentLength", "ETag", "LastModified"):
        if needed not in out:
            raise KeyError(needed)
    if not isinstance(out["LastModified"], datetime):
        raise TypeError("Last-Modified")
    return out


def customer_key_headers(encryption: Mapping[str, str]) -> dict[str, str]:
    """The SSE-C key of a read (encryption's customer_key, base64) as S3's headers."""
    key = base64.b64decode(encryption["customer_key"])
    return {
        "x-amz-server-side-encryption-customer-algorithm": encryption.get(
            "customer_algorithm", "AES256"
        ),
        "x-amz-server-side-encryption-customer-key": base64.b64encode(key).decode(),
        "x-amz-server-side-encryption-customer-key-MD5": base64.b64encode(
            hashlib.md5(key).digest()
        ).decode(),
    }


def info_of(key: str, h: Mapping[str, Any]) -> ObjectInfo:
    """The info in a HeadObject or GetObject answer."""
    expires = h.get("ExpiresString")
    if expires is None and isinstance(h.get("Expires"), datetime):
        expires = format_datetime(utc(h["Expires"]), usegmt=True)
    metadata = {k: from_header(v) for k, v in (h.get("Metadata") or {}).items()}
    encryption = encryption_of(h)
    mark = metadata.pop(CUSTOMER_KEY_MARK, None)
    if mark is not None:
        encryption.setdefault("customer_algorithm", "AES256")
        encryption["customer_key_md5"] = mark
    return ObjectInfo(
        key=key,
        size=int(h["ContentLength"]),
        etag=quoted(h["ETag"]),
        last_modified=utc(h["LastModified"]),
        content_type=h.get("ContentType"),
        content_encoding=h.get("ContentEncoding"),
        content_disposition=h.get("ContentDisposition"),
        content_language=h.get("ContentLanguage"),
        cache_control=h.get("CacheControl"),
        expires=expires,
        metadata=metadata,
        storage_class=h.get("StorageClass") or "STANDARD",
        checksums=checksums_of(h),
        tag_count=tag_count_of(h),
        encryption=encryption,
        store_version=str(h["VersionId"]) if h.get("VersionId") else None,
    )


def utc(value: datetime) -> datetime:
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
