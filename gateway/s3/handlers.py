"""The read operations, one function each, reading like the operation it implements."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass

from gateway import decimals, errors
from gateway.s3 import limits, sse, xml
from gateway.s3.http import Reply, S3Request
from gateway.service import (
    ByteRange,
    Conditions,
    ListQuery,
    ObjectInfo,
    ObjectResult,
    S3Service,
    check_part_number,
    http_date,
)

RESPONSE_OVERRIDES = {
    "response-content-type": "content-type",
    "response-content-language": "content-language",
    "response-expires": "expires",
    "response-cache-control": "cache-control",
    "response-content-disposition": "content-disposition",
    "response-content-encoding": "content-encoding",
}


@dataclass(frozen=True, slots=True)
class Context:
    service: S3Service
    region: str


# -- service -----------------------------------------------------------------------------


async def list_buckets(ctx: Context, req: S3Request) -> Reply:
    prefix = req.query.get("prefix")
    after = _bucket_token(req.query.get("continuation-token") or None)
    limit = _max_buckets(req)
    region = req.query.get("bucket-region")
    buckets = [
        b
        for b in sorted(ctx.service.list_buckets(req.caller), key=lambda b: b.name)
        if b.name.startswith(prefix or "") and (after is None or b.name > after)
    ]
    if region is not None and region != ctx.region:
        buckets = []
    page = buckets[:limit]
    more = len(buckets) > limit
    next_token = base64.urlsafe_b64encode(page[-1].name.encode()).decode() if more else None
    body = xml.list_buckets(((b.name, b.created_at) for b in page), ctx.region, next_token, prefix)
    return _xml(body)


def _max_buckets(req: S3Request) -> int:
    raw = req.query.get("max-buckets")
    if raw is None:
        return 10_000  # S3's most without pagination
    value = decimals.parse(raw, 10_000)
    if value is None or value < 1:
        raise errors.InvalidArgument(
            "Argument max-buckets must be an integer between 1 and 10000",
            ArgumentName="max-buckets",
            ArgumentValue=raw,
        )
    return value


def _bucket_token(token: str | None) -> str | None:
    """The last bucket name of the page a ListBuckets continuation token follows."""
    if token is None:
        return None
    try:
        return base64.urlsafe_b64decode(token.encode("ascii")).decode()
    except (ValueError, UnicodeError):
        raise errors.InvalidArgument(
            "The continuation token provided is incorrect",
            ArgumentName="continuation-token",
            ArgumentValue=token,
        ) from None


# -- bucket ------------------------------------------------------------------------------


async def head_bucket(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None
    ctx.service.head_bucket(req.bucket)
    reply = Reply()
    reply.header("x-amz-bucket-region", ctx.region)
    return reply


async def get_bucket_versioning(ctx: Context, req: S3Request) -> Reply:
    """A bucket's versioning is its store's: an S3 origin's bucket says its own; the other
    stores keep one version of a key (never enabled)."""
    assert req.bucket is not None
    ctx.service.head_bucket(req.bucket)
    return _xml(xml.versioning(await ctx.service.get_versioning(req.bucket)))


async def get_bucket_location(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None
    ctx.service.head_bucket(req.bucket)
    return _xml(xml.location(ctx.region))


def int_param(req: S3Request, name: str, default: int, cap: int) -> int:
    """A count from the query (max-keys, max-parts, ...): ASCII digits up to 2^31 - 1, as S3
    takes them (else InvalidArgument), then capped at what one page holds."""
    raw = req.query.get(name)
    if raw is None:
        return default
    value = decimals.parse(raw, decimals.INT32_MAX)
    if value is None:
        raise errors.InvalidArgument(
            f"Provided {name} not an integer or within integer range",
            ArgumentName=name,
            ArgumentValue=raw,
        )
    return min(value, cap)


def _max_keys(req: S3Request) -> int:
    raw = req.query.get("max-keys", "")
    if raw.startswith("-") and decimals.parse(raw[1:], decimals.INT32_MAX) is not None:
        raise errors.InvalidArgument(  # S3 words a negative count differently
            "Argument maxKeys must be an integer between 0 and 2147483647",
            ArgumentName="maxKeys",
            ArgumentValue=raw,
        )
    return int_param(req, "max-keys", 1000, 1000)


def _encoding(req: S3Request) -> bool:
    enc = req.query.get("encoding-type")
    if enc is None:
        return False
    if enc.lower() != "url":
        raise errors.InvalidArgument(
            "Invalid Encoding Method specified in Request",
            ArgumentName="encoding-type",
            ArgumentValue=enc,
        )
    return True


async def _list(
    ctx: Context, req: S3Request, token: str | None, start_after: str | None
) -> tuple[xml.Listing, str | None, str | None]:
    """The page, the store's next token, and the last key or prefix on the page."""
    assert req.bucket is not None
    prefix = req.query.get("prefix", "")
    delimiter = req.query.get("delimiter") or None
    max_keys = _max_keys(req)
    encode = _encoding(req)
    query = ListQuery(prefix, delimiter, token, start_after, max_keys)
    page = await ctx.service.list_objects(req.bucket, query)
    objects = [
        xml.ListedObject(o.key, o.last_modified, o.etag, o.size, o.storage_class)
        for o in page.objects
    ]
    listing = xml.Listing(
        req.bucket,
        prefix,
        delimiter,
        max_keys,
        encode,
        objects,
        page.common_prefixes,
        page.next_token is not None,
    )
    last = max([o.key for o in objects] + list(page.common_prefixes), default=None)
    return listing, page.next_token, last


async def list_objects_v2(ctx: Context, req: S3Request) -> Reply:
    given = req.query.get("continuation-token")
    token = given or None  # empty: none, as S3 takes it (and echoes it, empty)
    start_after = req.query.get("start-after") or None
    listing, next_token, _ = await _list(ctx, req, token, None if token else start_after)
    fetch_owner = req.query.get("fetch-owner", "").lower() == "true"
    return _xml(xml.list_v2(listing, given, next_token, start_after, fetch_owner))


async def list_objects_v1(ctx: Context, req: S3Request) -> Reply:
    marker = req.query.get("marker", "")
    listing, _, last = await _list(ctx, req, None, marker or None)
    return _xml(xml.list_v1(listing, marker, last if listing.truncated else None))


async def list_object_versions(ctx: Context, req: S3Request) -> Reply:
    """The store's versions where it keeps them (S3 origins); else each key's one version,
    "null", as S3 lists a bucket never versioned (tools' clean-up code and conformance suites
    list versions to delete them)."""
    assert req.bucket is not None
    key_marker = req.query.get("key-marker", "")
    version_marker = req.query.get("version-id-marker")
    if version_marker and not key_marker:
        raise errors.InvalidArgument(
            "A version-id marker cannot be specified without a key marker.",
            ArgumentName="version-id-marker", ArgumentValue=version_marker,
        )  # fmt: skip
    if not ctx.service.keeps_versions(req.bucket):
        if version_marker not in (None, "", "null"):
            raise errors.InvalidArgument(
                "Invalid version id specified", ArgumentName="version-id-marker",
                ArgumentValue=version_marker,
            )  # fmt: skip
        listing, _, last = await _list(ctx, req, None, key_marker or None)
        next_key = last if listing.truncated else None
        versions = [
            xml.ListedVersion(o.key, "null", True, o.last_modified, o.etag, o.size, o.storage_class)
            for o in listing.objects
        ]
        next_version = "null" if any(o.key == next_key for o in listing.objects) else None
        return _xml(
            xml.list_versions(listing, versions, key_marker, version_marker, next_key, next_version)
        )
    prefix = req.query.get("prefix", "")
    delimiter = req.query.get("delimiter") or None
    max_keys = _max_keys(req)
    page = await ctx.service.list_versions(
        req.bucket, prefix, delimiter, key_marker or None, version_marker or None, max_keys
    )
    versions = [
        xml.ListedVersion(
            e.info.key, e.info.version_id or "null", e.latest, e.info.last_modified,
            e.info.etag, e.info.size, e.info.storage_class, e.delete_marker,
        )
        for e in page.entries
    ]  # fmt: skip
    listing = xml.Listing(
        req.bucket, prefix, delimiter, max_keys, _encoding(req), [], page.common_prefixes,
        page.next_key_marker is not None,
    )  # fmt: skip
    body = xml.list_versions(
        listing, versions, key_marker, version_marker, page.next_key_marker,
        page.next_version_marker,
    )  # fmt: skip
    return _xml(body)


# -- object ------------------------------------------------------------------------------


def object_headers(reply: Reply, info: ObjectInfo, overrides: dict[str, str]) -> None:
    reply.header("etag", info.etag)
    reply.header("last-modified", http_date(info.last_modified))
    reply.header("accept-ranges", "bytes")
    plain = {
        "content-type": info.content_type or "binary/octet-stream",
        "content-encoding": info.content_encoding,
        "content-disposition": info.content_disposition,
        "content-language": info.content_language,
        "cache-control": info.cache_control,
        "expires": info.expires,
    }
    for name, value in plain.items():
        if name in overrides:
            value = overrides[name]  # checked by response_overrides
        elif value:
            value = _wire(value)
        if value:
            reply.header(name, value)
    if info.storage_class and info.storage_class != "STANDARD":
        reply.header("x-amz-storage-class", _wire(info.storage_class))
    for name, value in info.metadata.items():
        # S3 answers user metadata holding any non-ASCII character as one RFC 2047 word.
        safe = value.isascii() and limits.is_header_safe(value)
        reply.header(f"x-amz-meta-{name}", value if safe else _encoded_word(value))
    if info.tag_count:
        reply.header("x-amz-tagging-count", str(info.tag_count))
    version_id_header(reply, info)
    if info.encryption:
        for name, value in sse.response_headers(info.encryption).items():
            reply.header(name, value)


def plain_object_head(info: ObjectInfo) -> bytes | None:
    """object_headers()'s lines for a version with no overrides, as bytes, when the version
    carries nothing but its ETag, date and content type (a dataset's objects, nearly always):
    one formatting where object_headers() builds and walks its fields (~10 us of a hit of a
    version the edge has not rendered before). None for any other version: object_headers()
    renders it. tests/unit/test_plain_head.py holds the two byte-equal."""
    if (
        info.content_encoding
        or info.content_disposition
        or info.content_language
        or info.cache_control
        or info.expires
        or info.metadata
        or info.tag_count
        or info.encryption
        or info.version_id is not None
        or info.store_version is not None
        or (info.storage_class and info.storage_class != "STANDARD")
    ):
        return None
    content_type = info.content_type or "binary/octet-stream"
    if not (content_type.isascii() and content_type.isprintable()):
        return None  # _wire()'s other cases
    return b"etag: %s\r\nlast-modified: %s\r\naccept-ranges: bytes\r\ncontent-type: %s\r\n" % (
        info.etag.encode("latin-1"),
        http_date(info.last_modified).encode("latin-1"),
        content_type.encode("latin-1"),
    )


def version_id_header(reply: Reply, info: ObjectInfo, name: str = "x-amz-version-id") -> None:
    """The version's id where its store keeps versions: the one a request named, or the id
    the store gave the key's current version (none on stores that keep one version)."""
    version = info.version_id or info.store_version
    if version is not None:
        reply.header(name, version)


def checksum_headers(reply: Reply, checksums: Mapping[str, str]) -> None:
    for algorithm, value in checksums.items():
        reply.header(f"x-amz-checksum-{algorithm}", value)


def _wire(value: str) -> str:
    """A value from the store as a header can carry it: as it is, or, when it holds what
    HTTP/1.1 cannot (non-latin-1 text, control characters), as one RFC 2047 word, as S3
    answers non-ASCII metadata. Never folded: a line break would end the header."""
    return value if limits.is_header_safe(value) else _encoded_word(value)


def _encoded_word(value: str) -> str:
    return f"=?UTF-8?B?{base64.b64encode(value.encode('utf-8', 'surrogatepass')).decode()}?="


def response_overrides(req: S3Request) -> dict[str, str]:
    """The response-* query parameters as the headers they set. Values go back verbatim, so
    one HTTP/1.1 cannot carry (non-latin-1, or a control character such as CR or LF, which
    would split the header) is InvalidArgument, not a header."""
    overrides = {}
    for param, header in RESPONSE_OVERRIDES.items():
        value = req.query.get(param)
        if value is None:
            continue
        if not limits.is_header_safe(value):
            raise errors.InvalidArgument(
                "Header value cannot be represented using ISO-8859-1.",
                ArgumentName=param,
                ArgumentValue=value,
            )
        overrides[header] = value
    return overrides


def _conditions(req: S3Request) -> Conditions:
    h = req.headers
    return Conditions(
        h.get("if-match"), h.get("if-none-match"), h.get("if-modified-since"),
        h.get("if-unmodified-since"),
    )  # fmt: skip


async def get_object(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None and req.key is not None
    overrides = response_overrides(req)
    rng = ByteRange.parse(req.headers.get("range"))
    cond = _conditions(req)
    service = ctx.service
    key = sse.customer_key(req.headers)
    version = req.query.get("versionId")
    try:
        if key:  # SSE-C: with the client's key, from the store, never cached
            if version not in (None, "null"):
                raise errors.NotImplementedError_(
                    "A version id with an SSE-C key is not implemented by this gateway."
                )
            head = req.method == "HEAD"
            result = await service.get_encrypted_object(req.bucket, req.key, rng, cond, key, head)
        elif req.method == "HEAD":
            result = await service.head_object(req.bucket, req.key, rng, cond, version)
        else:
            result = await service.get_object(
                req.bucket, req.key, rng, cond, version, zero_copy=req.zero_copy
            )
    except errors.InvalidRange as exc:
        exc.headers["content-range"] = f"bytes */{exc.fields.get('ActualObjectSize', '*')}"
        raise
    except errors.MethodNotAllowed as exc:
        if version is not None and "x-amz-delete-marker" in exc.headers:
            exc.headers["x-amz-version-id"] = version  # the delete marker asked for, as S3
        raise
    return _object_reply(req, result, overrides)


async def get_object_part(ctx: Context, req: S3Request) -> Reply:
    """GET or HEAD with ?partNumber=N. An object not uploaded in parts is one part, the whole
    object, as S3 has it; the parts of one that was are not known to the gateway."""
    assert req.bucket is not None and req.key is not None
    number = check_part_number(req.query["partNumber"])
    if sse.customer_key(req.headers):
        raise errors.NotImplementedError_(
            "partNumber with an SSE-C key is not implemented by this gateway.",
            Header="x-amz-server-side-encryption-customer-key",
        )
    if "range" in req.headers:
        raise errors.InvalidRequest(
            "Cannot specify both Range header and partNumber query parameter"
        )
    overrides = response_overrides(req)
    cond = _conditions(req)
    version = req.query.get("versionId")
    info = (await ctx.service.head_object(req.bucket, req.key, None, cond, version)).info
    count = parts_count(info.etag)
    # The version just looked at, and all of it (a range of an empty object is no range).
    pinned = Conditions(info.etag, None, None, None)
    rng = ByteRange(0, None) if info.size else None
    if count is not None:
        if number > count:
            raise errors.InvalidPartNumber(
                PartNumberRequested=str(number), ActualPartCount=str(count)
            )
        span = None
        if info.version_id is None:  # the store's parts are asked of its current version
            span = await ctx.service.part_range(req.bucket, req.key, info, number)
        if span is None:
            raise errors.NotImplementedError_(
                "partNumber on an object uploaded in parts is not implemented by this gateway"
                " for this bucket's store: it does not keep its parts' sizes."
            )
        start, end = span
        rng = ByteRange(start, end - 1) if end > start else None
    elif number != 1:
        raise errors.InvalidPartNumber(PartNumberRequested=str(number), ActualPartCount="1")
    if req.method == "HEAD":
        result = await ctx.service.head_object(req.bucket, req.key, rng, pinned, version)
    else:
        result = await ctx.service.get_object(
            req.bucket, req.key, rng, pinned, version, zero_copy=req.zero_copy
        )
    reply = _object_reply(req, result, overrides)
    if count is not None:
        reply.header("x-amz-mp-parts-count", str(count))
    return reply


def parts_count(etag: str) -> int | None:
    """N of a multipart ETag ("<md5>-N"); None for an object not uploaded in parts."""
    _, dash, count = etag.strip('"').rpartition("-")
    return decimals.parse(count, 10_000) if dash else None


_ATTRIBUTES = frozenset({"ETag", "Checksum", "ObjectParts", "StorageClass", "ObjectSize"})


async def get_object_attributes(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None and req.key is not None
    raw = req.headers.get("x-amz-object-attributes", "")
    asked = {a.strip() for a in raw.split(",") if a.strip()}
    if not asked or not asked <= _ATTRIBUTES:
        raise errors.InvalidArgument(
            "Invalid attribute name specified.",
            ArgumentName="x-amz-object-attributes",
            ArgumentValue=raw,
        )
    version = req.query.get("versionId")
    cond = _conditions(req)
    info = (await ctx.service.head_object(req.bucket, req.key, None, cond, version)).info
    checksums = {name.upper(): value for name, value in info.checksums.items()}
    body = xml.object_attributes(
        info.etag.strip('"') if "ETag" in asked else None,
        checksums if "Checksum" in asked else None,
        parts_count(info.etag) if "ObjectParts" in asked else None,
        (info.storage_class or "STANDARD") if "StorageClass" in asked else None,
        info.size if "ObjectSize" in asked else None,
    )
    reply = _xml(body)
    reply.header("last-modified", http_date(info.last_modified))
    version_id_header(reply, info)
    return reply


def _object_reply(req: S3Request, result: ObjectResult, overrides: dict[str, str]) -> Reply:
    reply = Reply(status=206 if result.partial else 200)
    object_headers(reply, result.info, overrides)
    if result.partial:
        reply.header("content-range", f"bytes {result.start}-{result.end - 1}/{result.info.size}")
    if (
        not result.partial
        and result.info.checksums
        and req.headers.get("x-amz-checksum-mode", "").upper() == "ENABLED"
    ):
        checksum_headers(reply, result.info.checksums)
    reply.header("x-cache", result.cache)
    reply.cache = result.cache
    length = result.end - result.start
    reply.body = b"" if result.body is None else result.body  # None: HEAD
    reply.length = length
    return reply


def _xml(body: bytes) -> Reply:
    reply = Reply(body=body)
    reply.header("content-type", "application/xml")
    return reply


async def get_object_tagging(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None and req.key is not None
    version = req.query.get("versionId")
    tags = await ctx.service.get_object_tagging(req.bucket, req.key, version)
    reply = _xml(xml.tagging(tags.items()))
    if version is not None:
        reply.header("x-amz-version-id", version)
    return reply
