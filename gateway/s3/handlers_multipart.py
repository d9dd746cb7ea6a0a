"""Multipart upload operations: Create, UploadPart(Copy), Complete, Abort, ListParts,
ListMultipartUploads."""

from __future__ import annotations

from datetime import UTC, datetime

from gateway import errors
from gateway.s3 import xml, xml_in
from gateway.s3.handlers import Context, _encoding, _xml
from gateway.s3.handlers_write import (
    copy_conditions,
    copy_source,
    read_small_body,
    request_body,
    write_attrs,
)
from gateway.s3.http import Reply, S3Request
from gateway.service.conditions import ByteRange
from gateway.service.multipart import MAX_PART_SIZE, check_part_number


def _int_param(req: S3Request, name: str, default: int, cap: int) -> int:
    raw = req.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise errors.InvalidArgument(
            f"Provided {name} not an integer or within integer range",
            ArgumentName=name,
            ArgumentValue=raw,
        )
    return min(value, cap)


async def create_multipart_upload(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None and req.key is not None
    upload_id = await ctx.gateway.multipart.create(
        req.bucket, req.key, write_attrs(req), req.access_key
    )
    return _xml(xml.initiate_multipart(req.bucket, req.key, upload_id))


async def upload_part(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None and req.key is not None
    number = check_part_number(req.query.get("partNumber", ""))
    upload_id = req.query["uploadId"]
    if "x-amz-copy-source" in req.headers:
        return await _upload_part_copy(ctx, req, number, upload_id)
    ctx.gateway.writer.writable(req.bucket)
    body = request_body(req, MAX_PART_SIZE)
    part = await ctx.gateway.multipart.upload_part(
        req.bucket, req.key, upload_id, number, aiter(body), body.size
    )
    reply = Reply()
    reply.header("etag", part.etag)
    return reply


async def _upload_part_copy(ctx: Context, req: S3Request, number: int, upload_id: str) -> Reply:
    assert req.bucket is not None and req.key is not None
    src_bucket, src_key = copy_source(req)
    src_range: tuple[int, int] | None = None
    raw = req.headers.get("x-amz-copy-source-range")
    if raw is not None:
        rng = ByteRange.parse(raw)
        if rng is None or rng.first is None or rng.last is None:
            raise errors.InvalidArgument(
                "The x-amz-copy-source-range value must be of the form bytes=first-last"
                " where first and last are the zero-based offsets of the first and last"
                " bytes to copy",
                ArgumentName="x-amz-copy-source-range",
                ArgumentValue=raw,
            )
        src_range = (rng.first, rng.last + 1)
    _, part = await ctx.gateway.multipart.upload_part_copy(
        req.bucket, req.key, upload_id, number, src_bucket, src_key, src_range,
        copy_conditions(req),
    )  # fmt: skip
    return _xml(xml.copy_result(part.etag, datetime.now(UTC), part=True))


async def complete_multipart_upload(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None and req.key is not None
    upload_id = req.query["uploadId"]
    parts = xml_in.complete_multipart(await read_small_body(req))
    info = await ctx.gateway.multipart.complete(req.bucket, req.key, upload_id, parts)
    location = f"/{req.bucket}/{req.key}"
    return _xml(xml.complete_multipart(location, req.bucket, req.key, info.etag))


async def abort_multipart_upload(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None and req.key is not None
    await ctx.gateway.multipart.abort(req.bucket, req.key, req.query["uploadId"])
    return Reply(status=204)


async def list_parts(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None and req.key is not None
    upload_id = req.query["uploadId"]
    max_parts = _int_param(req, "max-parts", 1000, 1000)
    marker = _int_param(req, "part-number-marker", 0, 10_000)
    record, parts, truncated = await ctx.gateway.multipart.list_parts(
        req.bucket, req.key, upload_id, marker, max_parts
    )
    listed = [xml.ListedPart(p.part_number, p.uploaded_at, p.etag, p.size) for p in parts]
    return _xml(
        xml.list_parts(
            req.bucket, req.key, upload_id, marker, max_parts, listed, truncated,
            record.initiated_at,
        )
    )  # fmt: skip


async def list_multipart_uploads(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None
    q = req.query
    prefix, delimiter = q.get("prefix", ""), q.get("delimiter") or None
    key_marker, upload_id_marker = q.get("key-marker", ""), q.get("upload-id-marker", "")
    if not key_marker:
        upload_id_marker = ""  # S3 ignores an upload-id-marker without a key-marker
    max_uploads = _int_param(req, "max-uploads", 1000, 1000)
    encode = _encoding(req)
    listing = await ctx.gateway.multipart.list_uploads(
        req.bucket, prefix, delimiter, key_marker, upload_id_marker, max_uploads
    )
    uploads = [xml.ListedUpload(u.key, u.upload_id, u.initiated_at) for u in listing.uploads]
    return _xml(
        xml.list_uploads(
            req.bucket, prefix, delimiter, key_marker, upload_id_marker, max_uploads,
            uploads, listing.prefixes, listing.truncated, encode,
        )
    )  # fmt: skip
