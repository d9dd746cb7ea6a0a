"""The read operations, one function each, reading like the operation it implements."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway import errors
from gateway.s3 import xml
from gateway.s3.http import Reply, S3Request
from gateway.service.conditions import ByteRange, Conditions, http_date
from gateway.service.gateway import Gateway, ObjectResult
from gateway.stores import ObjectInfo

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
    gateway: Gateway
    region: str


# -- service -----------------------------------------------------------------------------


async def list_buckets(ctx: Context, req: S3Request) -> Reply:
    mounts = ctx.gateway.list_buckets()
    body = xml.list_buckets(((m.bucket, m.mount.created_at) for m in mounts), ctx.region)
    return _xml(body)


# -- bucket ------------------------------------------------------------------------------


async def head_bucket(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None
    ctx.gateway.mount(req.bucket)
    reply = Reply()
    reply.header("x-amz-bucket-region", ctx.region)
    return reply


async def get_bucket_location(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None
    ctx.gateway.mount(req.bucket)
    return _xml(xml.location(ctx.region))


def _max_keys(req: S3Request) -> int:
    raw = req.query.get("max-keys", "1000")
    try:
        value = int(raw)
    except ValueError:
        raise errors.InvalidArgument(
            "Provided max-keys not an integer or within integer range",
            ArgumentName="max-keys",
            ArgumentValue=raw,
        ) from None
    if value < 0:
        raise errors.InvalidArgument(
            "Argument maxKeys must be an integer between 0 and 2147483647",
            ArgumentName="maxKeys",
            ArgumentValue=raw,
        )
    return min(value, 1000)


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
    page = await ctx.gateway.list_objects(
        req.bucket, prefix, delimiter, token, start_after, max_keys
    )
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
    token = req.query.get("continuation-token")
    if token is not None and not token:
        raise errors.InvalidArgument(
            "The continuation token provided is incorrect",
            ArgumentName="continuation-token",
        )
    start_after = req.query.get("start-after") or None
    listing, next_token, _ = await _list(ctx, req, token, None if token else start_after)
    fetch_owner = req.query.get("fetch-owner", "").lower() == "true"
    return _xml(xml.list_v2(listing, token, next_token, start_after, fetch_owner))


async def list_objects_v1(ctx: Context, req: S3Request) -> Reply:
    marker = req.query.get("marker", "")
    listing, _, last = await _list(ctx, req, None, marker or None)
    return _xml(xml.list_v1(listing, marker, last if listing.truncated else None))


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
    plain.update(overrides)
    for name, value in plain.items():
        if value:
            reply.header(name, value)
    if info.storage_class and info.storage_class != "STANDARD":
        reply.header("x-amz-storage-class", info.storage_class)
    for name, value in info.metadata.items():
        reply.header(f"x-amz-meta-{name}", _latin1(value))


def checksum_headers(reply: Reply, checksums: Mapping[str, str]) -> None:
    for algorithm, value in checksums.items():
        reply.header(f"x-amz-checksum-{algorithm}", value)


def _latin1(value: str) -> str:
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        # Non-latin-1 metadata goes out RFC 2047-encoded, as S3 does.
        import email.header

        return email.header.Header(value, "utf-8").encode()
    return value


def _conditions(req: S3Request) -> Conditions:
    h = req.headers
    return Conditions(
        h.get("if-match"), h.get("if-none-match"), h.get("if-modified-since"),
        h.get("if-unmodified-since"),
    )  # fmt: skip


async def get_object(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None and req.key is not None
    rng = ByteRange.parse(req.headers.get("range"))
    cond = _conditions(req)
    gw = ctx.gateway
    try:
        if req.method == "HEAD":
            result = await gw.head_object(req.bucket, req.key, rng, cond)
        else:
            result = await gw.get_object(req.bucket, req.key, rng, cond)
    except errors.InvalidRange as exc:
        exc.headers["content-range"] = f"bytes */{exc.fields.get('ActualObjectSize', '*')}"
        raise
    return _object_reply(req, result)


def _object_reply(req: S3Request, result: ObjectResult) -> Reply:
    overrides = {
        header: req.query[param]
        for param, header in RESPONSE_OVERRIDES.items()
        if param in req.query
    }
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
