"""PutBucketPolicy, GetBucketPolicy, DeleteBucketPolicy: S3's JSON policy document, neither
XML in nor out (docs/tenants.md)."""

from __future__ import annotations

from gateway.s3.handlers import Context
from gateway.s3.handlers_write import read_small_body
from gateway.s3.http import Reply, S3Request

MAX_POLICY = 20 * 1024  # S3's limit on a bucket policy


async def put_bucket_policy(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None
    ctx.service.head_bucket(req.bucket)
    document = await read_small_body(req, MAX_POLICY)
    await ctx.service.put_bucket_policy(req.bucket, document)
    return Reply(status=204)


async def get_bucket_policy(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None
    reply = Reply(body=ctx.service.get_bucket_policy(req.bucket).encode())
    reply.header("content-type", "application/json")
    return reply


async def delete_bucket_policy(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None
    await ctx.service.delete_bucket_policy(req.bucket)
    return Reply(status=204)
