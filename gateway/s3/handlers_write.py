"""The write operations: PutObject, CopyObject, DeleteObject(s), CreateBucket, DeleteBucket."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from urllib.parse import unquote

from gateway import errors
from gateway.s3 import xml, xml_in
from gateway.s3.body import RequestBody
from gateway.s3.handlers import Context, _encoding, _xml, checksum_headers
from gateway.s3.http import Reply, S3Request
from gateway.service.conditions import Conditions
from gateway.service.writes import MAX_PUT_SIZE, WriteConditions
from gateway.stores import WriteAttrs

_ATTR_HEADERS = (
    "content-type",
    "content-encoding",
    "content-disposition",
    "content-language",
    "cache-control",
    "expires",
)


class LiveChecksums(Mapping[str, str]):
    """The body's verified checksums, read when the store asks (after the last byte)."""

    def __init__(self, body: RequestBody) -> None:
        self._body = body

    def __getitem__(self, name: str) -> str:
        return self._body.checksums[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._body.checksums)

    def __len__(self) -> int:
        return len(self._body.checksums)


def write_attrs(req: S3Request, body: RequestBody | None = None) -> WriteAttrs:
    h = req.headers
    values = {name: h.get(name) or None for name in _ATTR_HEADERS}
    encoding = values["content-encoding"]
    if encoding:
        # aws-chunked describes the transfer, not the object: S3 drops it.
        kept = [e.strip() for e in encoding.split(",") if e.strip() and e.strip() != "aws-chunked"]
        values["content-encoding"] = ", ".join(kept) or None
    metadata = {k[len("x-amz-meta-") :]: v for k, v in h.items() if k.startswith("x-amz-meta-")}
    return WriteAttrs(
        content_type=values["content-type"],
        content_encoding=values["content-encoding"],
        content_disposition=values["content-disposition"],
        content_language=values["content-language"],
        cache_control=values["cache-control"],
        expires=values["expires"],
        metadata=metadata,
        checksums=LiveChecksums(body) if body is not None else {},
    )


def request_body(req: S3Request, max_size: int) -> RequestBody:
    assert req.receive is not None
    return RequestBody(req.receive, req.headers, req.auth, max_size=max_size)


async def read_small_body(req: S3Request, limit: int = xml_in.MAX_XML_BODY) -> bytes:
    body = request_body(req, limit)
    data = bytearray()
    async for chunk in body:
        data += chunk
    return bytes(data)


def _write_conditions(req: S3Request) -> WriteConditions:
    inm = req.headers.get("if-none-match")
    if inm is not None and inm.strip() != "*":
        raise errors.NotImplementedError_("If-None-Match on writes accepts only '*'.")
    return WriteConditions(req.headers.get("if-match"), inm is not None)


def _etag_reply(etag: str, body: RequestBody | None = None) -> Reply:
    reply = Reply()
    reply.header("etag", etag)
    if body is not None:
        checksum_headers(reply, body.checksums)
    return reply


async def put_object(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None and req.key is not None
    if "x-amz-copy-source" in req.headers:
        return await copy_object(ctx, req)
    ctx.gateway.writer.writable(req.bucket)  # refuse before reading a byte of the body
    body = request_body(req, MAX_PUT_SIZE)
    info = await ctx.gateway.writer.put(
        req.bucket, req.key, aiter(body), body.size, write_attrs(req, body), _write_conditions(req)
    )
    return _etag_reply(info.etag, body)


def copy_source(req: S3Request) -> tuple[str, str]:
    raw = req.headers["x-amz-copy-source"]
    path, _, query = raw.partition("?")
    if query and query not in ("versionId=null",):
        raise errors.NotImplementedError_("Copying a specific version is not implemented.")
    bucket, sep, key = unquote(path).lstrip("/").partition("/")
    if not bucket or not sep or not key:
        raise errors.InvalidArgument(
            "Copy Source must mention the source bucket and key: sourcebucket/sourcekey",
            ArgumentName="x-amz-copy-source",
            ArgumentValue=raw,
        )
    return bucket, key


def copy_conditions(req: S3Request) -> Conditions:
    h = req.headers
    return Conditions(
        h.get("x-amz-copy-source-if-match"),
        h.get("x-amz-copy-source-if-none-match"),
        h.get("x-amz-copy-source-if-modified-since"),
        h.get("x-amz-copy-source-if-unmodified-since"),
    )


async def copy_object(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None and req.key is not None
    src_bucket, src_key = copy_source(req)
    directive = req.headers.get("x-amz-metadata-directive", "COPY").upper()
    if directive not in ("COPY", "REPLACE"):
        raise errors.InvalidArgument(
            "Unknown metadata directive.", ArgumentName="x-amz-metadata-directive"
        )
    attrs = write_attrs(req) if directive == "REPLACE" else None
    _, new = await ctx.gateway.writer.copy(
        src_bucket, src_key, req.bucket, req.key, attrs, copy_conditions(req)
    )
    return _xml(xml.copy_result(new.etag, new.last_modified))


async def delete_object(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None and req.key is not None
    await ctx.gateway.writer.delete(req.bucket, req.key)
    return Reply(status=204)


async def delete_objects(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None
    h = req.headers
    integrity = ("content-md5", "x-amz-sdk-checksum-algorithm", "x-amz-trailer")
    if not any(k in h for k in integrity) and not any(k.startswith("x-amz-checksum-") for k in h):
        raise errors.InvalidRequest(
            "Missing required header for this request: Content-MD5 or x-amz-checksum-*"
        )
    ctx.gateway.writer.writable(req.bucket)
    keys, quiet = xml_in.delete_objects(await read_small_body(req))
    outcome = await ctx.gateway.writer.delete_many(req.bucket, keys)
    deleted = [] if quiet else [k for k, err in outcome if err is None]
    failed = [(k, err.code, err.detail) for k, err in outcome if err is not None]
    return _xml(xml.delete_result(deleted, failed, _encoding(req)))


async def create_bucket(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None
    xml_in.create_bucket(await read_small_body(req, 64 << 10))
    await ctx.gateway.buckets.create(req.bucket)
    reply = Reply()
    reply.header("location", f"/{req.bucket}")
    return reply


async def delete_bucket(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None
    await ctx.gateway.buckets.delete(req.bucket)
    return Reply(status=204)
