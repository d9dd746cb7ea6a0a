"""ACLs as AWS answers them under Object Ownership "bucket owner enforced", its default since
2023: the owner has FULL_CONTROL and ACLs grant nothing. Reads answer that; writes and the
canned-ACL headers of PUT, copy, CreateMultipartUpload and CreateBucket accept `private` and
`bucket-owner-full-control` (what a client that sends an ACL by default sends) and refuse any
other grant with 400 AccessControlListNotSupported. Access is the IAM policies' and the bucket
policies' (docs/tenants.md)."""

from __future__ import annotations

from gateway import errors
from gateway.s3 import xml, xml_in
from gateway.s3.handlers import Context, _xml
from gateway.s3.handlers_write import check_acl_headers, read_small_body
from gateway.s3.http import Reply, S3Request
from gateway.service import Conditions


async def _check_acl_body(req: S3Request) -> None:
    check_acl_headers(req.headers)
    data = await read_small_body(req, 64 << 10)
    if not data.strip():
        if "x-amz-acl" not in req.headers:
            raise errors.MissingSecurityHeader(MissingHeaderName="x-amz-acl")
        return
    for permission, kind, ident in xml_in.acl_grants(data):
        if permission != "FULL_CONTROL" or kind != "CanonicalUser" or ident != xml.OWNER_ID:
            raise errors.AccessControlListNotSupported()


async def get_bucket_acl(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None
    ctx.service.head_bucket(req.bucket)
    return _xml(xml.acl())


async def put_bucket_acl(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None
    ctx.service.head_bucket(req.bucket)
    await _check_acl_body(req)
    return Reply()


async def get_object_acl(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None and req.key is not None
    await ctx.service.head_object(req.bucket, req.key, None, Conditions())
    return _xml(xml.acl())


async def put_object_acl(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None and req.key is not None
    ctx.service.check_writable(req.bucket)
    await _check_acl_body(req)
    await ctx.service.head_object(req.bucket, req.key, None, Conditions())
    return Reply()
