"""Multipart upload operations: Create, UploadPart(Copy), Complete, Abort, ListParts,
ListMultipartUploads."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from gateway import errors
from gateway.s3 import sse, xml, xml_in
from gateway.s3.handlers import Context, _encoding, _xml, int_param
from gateway.s3.handlers_write import (
    copy_source,
    read_small_body,
    request_body,
    sized,
    source_version_header,
    version_header,
    write_attrs,
    write_conditions,
)
from gateway.s3.http import Reply, S3Request
from gateway.service import MAX_PART_SIZE, ByteRange, UploadsQuery, check_part_number


async def create_multipart_upload(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None and req.key is not None
    attrs = write_attrs(req)
    _no_customer_key(req)
    upload_id = await ctx.service.create_multipart_upload(
        req.bucket, req.key, attrs, req.access_key
    )
    reply = _xml(xml.initiate_multipart(req.bucket, req.key, upload_id))
    for name, value in sse.response_headers(attrs.encryption).items():
        reply.header(name, value)
    return reply


def _no_customer_key(req: S3Request) -> None:
    """Multipart uploads with an SSE-C key are refused rather than stored unencrypted: the
    key would have to be kept with the upload, and the gateway keeps no client's key."""
    if sse.customer_key(req.headers):
        raise errors.NotImplementedError_(
            "Multipart uploads encrypted with a customer key (SSE-C) are not implemented by"
            " this gateway.",
            Header="x-amz-server-side-encryption-customer-key",
        )


async def upload_part(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None and req.key is not None
    number = check_part_number(req.query.get("partNumber", ""))
    upload_id = req.query["uploadId"]
    _no_customer_key(req)
    if "x-amz-copy-source" in req.headers:
        return await _upload_part_copy(ctx, req, number, upload_id)
    ctx.service.check_writable(req.bucket)
    body = request_body(req, MAX_PART_SIZE)
    data, size = await sized(body)
    part = await ctx.service.upload_part(req.bucket, req.key, upload_id, number, data, size)
    reply = Reply()
    reply.header("etag", part.etag)
    return reply


async def _upload_part_copy(ctx: Context, req: S3Request, number: int, upload_id: str) -> Reply:
    assert req.bucket is not None and req.key is not None
    source = copy_source(req)
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
        source = replace(source, range=(rng.first, rng.last + 1))
    src, part = await ctx.service.upload_part_copy(
        req.bucket, req.key, upload_id, number, source, req.caller
    )
    reply = _xml(xml.copy_result(part.etag, datetime.now(UTC), part=True))
    source_version_header(reply, src)
    return reply


async def complete_multipart_upload(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None and req.key is not None
    upload_id = req.query["uploadId"]
    cond = write_conditions(req)
    parts = xml_in.complete_multipart(await read_small_body(req))
    info = await ctx.service.complete_multipart_upload(req.bucket, req.key, upload_id, parts, cond)
    location = f"/{req.bucket}/{req.key}"
    reply = _xml(xml.complete_multipart(location, req.bucket, req.key, info.etag))
    version_header(reply, info)
    return reply


async def abort_multipart_upload(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None and req.key is not None
    await ctx.service.abort_multipart_upload(req.bucket, req.key, req.query["uploadId"])
    return Reply(status=204)


async def list_parts(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None and req.key is not None
    upload_id = req.query["uploadId"]
    max_parts = int_param(req, "max-parts", 1000, 1000)
    marker = int_param(req, "part-number-marker", 0, 10_000)
    listing = await ctx.service.list_parts(req.bucket, req.key, upload_id, marker, max_parts)
    listed = [xml.ListedPart(p.part_number, p.uploaded_at, p.etag, p.size) for p in listing.parts]
    return _xml(
        xml.list_parts(
            req.bucket, req.key, upload_id, marker, max_parts, listed, listing.truncated,
            listing.initiated_at,
        )
    )  # fmt: skip


async def list_multipart_uploads(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None
    q = req.query
    prefix, delimiter = q.get("prefix", ""), q.get("delimiter") or None
    key_marker, upload_id_marker = q.get("key-marker", ""), q.get("upload-id-marker", "")
    if not key_marker:
        upload_id_marker = ""  # S3 ignores an upload-id-marker without a key-marker
    max_uploads = int_param(req, "max-uploads", 1000, 1000)
    encode = _encoding(req)
    query = UploadsQuery(prefix, delimiter, key_marker, upload_id_marker, max_uploads)
    listing = await ctx.service.list_multipart_uploads(req.bucket, query)
    uploads = [xml.ListedUpload(u.key, u.upload_id, u.initiated_at) for u in listing.uploads]
    return _xml(
        xml.list_uploads(
            req.bucket, prefix, delimiter, key_marker, upload_id_marker, max_uploads,
            uploads, listing.prefixes, listing.truncated, encode,
        )
    )  # fmt: skip
