"""A bucket's CORS: Put/Get/DeleteBucketCors, the preflight OPTIONS (answered without
authentication, as S3 does) and the Access-Control-* headers of actual answers."""

from __future__ import annotations

from gateway import errors
from gateway.s3 import cors
from gateway.s3.handlers import Context, _xml
from gateway.s3.handlers_write import read_small_body
from gateway.s3.http import Reply, S3Request


async def get_bucket_cors(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None
    kept = ctx.service.bucket_cors(req.bucket)
    rules = cors.from_json(kept) if kept else ()
    if not rules:
        raise errors.NoSuchCORSConfiguration(BucketName=req.bucket)
    return _xml(cors.to_xml(rules))


async def put_bucket_cors(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None
    ctx.service.bucket_cors(req.bucket)  # NoSuchBucket before the body is read
    rules = cors.parse(await read_small_body(req, cors.MAX_BODY + 1))
    await ctx.service.set_bucket_cors(req.bucket, cors.to_json(rules))
    return Reply()


async def delete_bucket_cors(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None
    await ctx.service.set_bucket_cors(req.bucket, None)
    return Reply(status=204)


def preflight(ctx: Context, req: S3Request) -> Reply:
    """OPTIONS on a bucket or an object: the bucket's rules decide; no signature needed."""
    if req.bucket is None:
        raise errors.BadRequest("Insufficient information. Origin request header needed.")
    if not ctx.service.has_bucket(req.bucket):
        raise errors.NoSuchBucket(BucketName=req.bucket)
    kept = ctx.service.cors_rules_if_mounted(req.bucket)
    reply = Reply()
    for name, value in cors.preflight(cors.from_json(kept) if kept else None, req.headers):
        reply.header(name, value)
    return reply


def add_headers(ctx: Context, req: S3Request, reply: Reply) -> None:
    """The Access-Control-* headers of an answer to a request with an Origin, where a rule of
    its bucket allows the origin and the method."""
    origin = req.headers.get("origin")
    if not origin or req.bucket is None:
        return
    kept = ctx.service.cors_rules_if_mounted(req.bucket)
    if not kept:
        return
    for name, value in cors.actual(cors.from_json(kept), origin, req.method):
        reply.header(name, value)
