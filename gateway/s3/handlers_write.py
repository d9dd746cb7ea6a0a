"""The write operations: PutObject, CopyObject, DeleteObject(s), CreateBucket, DeleteBucket."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import replace
from urllib.parse import unquote

from gateway import errors
from gateway.s3 import limits, sse, tags, xml, xml_in
from gateway.s3.body import RequestBody
from gateway.s3.handlers import Context, _encoding, _xml, checksum_headers, version_id_header
from gateway.s3.http import Reply, S3Request
from gateway.service import (
    MAX_PUT_SIZE,
    Conditions,
    CopySource,
    DeleteEntry,
    Deletion,
    ObjectInfo,
    WriteAttrs,
    WriteConditions,
)

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


# Canned ACLs that grant no one but the owner anything: all an enforced bucket accepts.
OWNER_ONLY = frozenset({"private", "bucket-owner-full-control"})
_GRANT_HEADERS = (
    "x-amz-grant-read",
    "x-amz-grant-write",
    "x-amz-grant-read-acp",
    "x-amz-grant-write-acp",
    "x-amz-grant-full-control",
)


def check_acl_headers(headers: Mapping[str, str]) -> None:
    """Refuse a canned ACL or explicit grant that would grant anyone anything."""
    canned = headers.get("x-amz-acl")
    if canned is not None and canned.strip() not in OWNER_ONLY:
        raise errors.AccessControlListNotSupported()
    if any(h in headers for h in _GRANT_HEADERS):
        raise errors.AccessControlListNotSupported()


def write_attrs(req: S3Request, body: RequestBody | None = None) -> WriteAttrs:
    h = req.headers
    check_acl_headers(h)
    values = {name: h.get(name) or None for name in _ATTR_HEADERS}
    encoding = values["content-encoding"]
    if encoding:
        # aws-chunked describes the transfer, not the object: S3 drops it.
        kept = [e.strip() for e in encoding.split(",") if e.strip() and e.strip() != "aws-chunked"]
        values["content-encoding"] = ", ".join(kept) or None
    metadata = limits.user_metadata(h)
    return WriteAttrs(
        tags=tags.from_header(h.get("x-amz-tagging")),
        encryption=sse.requested(h),
        content_type=values["content-type"],
        content_encoding=values["content-encoding"],
        content_disposition=values["content-disposition"],
        content_language=values["content-language"],
        cache_control=values["cache-control"],
        expires=values["expires"],
        metadata=metadata,
        checksums=LiveChecksums(body) if body is not None else {},
    )


# A body sent with HTTP chunked framing and no length is read into memory to learn its length
# (the store wants it before the first byte); past this, it is refused.
UNSIZED_MAX = 64 << 20


def request_body(req: S3Request, max_size: int) -> RequestBody:
    assert req.receive is not None
    return RequestBody(req.receive, req.headers, req.auth, max_size=max_size)


async def sized(body: RequestBody) -> tuple[AsyncIterator[bytes], int]:
    """The body's bytes and its length, read first when only its framing knows it."""
    if body.size is not None:
        return aiter(body), body.size
    data = await body.read_unsized(UNSIZED_MAX)
    return _once(data), len(data)


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def read_small_body(req: S3Request, limit: int = xml_in.MAX_XML_BODY) -> bytes:
    body = request_body(req, limit)
    data = bytearray()
    async for chunk in body:
        data += chunk
    return bytes(data)


def write_conditions(req: S3Request) -> WriteConditions:
    inm = req.headers.get("if-none-match")
    if inm is not None and inm.strip() != "*":
        raise errors.NotImplementedError_("If-None-Match on writes accepts only '*'.")
    return WriteConditions(req.headers.get("if-match"), inm is not None)


def _etag_reply(
    etag: str, body: RequestBody | None = None, encryption: Mapping[str, str] | None = None
) -> Reply:
    reply = Reply()
    reply.header("etag", etag)
    if body is not None:
        checksum_headers(reply, body.checksums)
    for name, value in sse.response_headers(encryption or {}).items():
        reply.header(name, value)
    return reply


async def put_object(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None and req.key is not None
    if "x-amz-copy-source" in req.headers:
        return await copy_object(ctx, req)
    ctx.service.check_writable(req.bucket)  # refuse before reading a byte of the body
    attrs = write_attrs(req)  # refused before a byte of the body is read
    body = request_body(req, MAX_PUT_SIZE)
    data, size = await sized(body)
    attrs = replace(attrs, checksums=LiveChecksums(body))
    info = await ctx.service.put_object(
        req.bucket, req.key, data, size, attrs, write_conditions(req)
    )
    reply = _etag_reply(info.etag, body, info.encryption or attrs.encryption)
    version_header(reply, info)
    return reply


def source_version_header(reply: Reply, source: ObjectInfo) -> None:
    """x-amz-copy-source-version-id: the version a copy read, where its store keeps versions."""
    version_id_header(reply, source, "x-amz-copy-source-version-id")


def version_header(reply: Reply, info: ObjectInfo) -> None:
    """x-amz-version-id of a write to a store that keeps versions: the version it made."""
    version_id_header(reply, info)


def copy_source(req: S3Request) -> CopySource:
    raw = req.headers["x-amz-copy-source"]
    path, _, query = raw.partition("?")
    version_id = _source_version(raw, query)
    if not path.isascii():  # raw UTF-8 rather than percent-escapes: the header came as latin-1
        path = path.encode("latin-1").decode("utf-8", "replace")
    bucket, sep, key = unquote(path).lstrip("/").partition("/")
    if not bucket or not sep or not key:
        raise errors.InvalidArgument(
            "Copy Source must mention the source bucket and key: sourcebucket/sourcekey",
            ArgumentName="x-amz-copy-source",
            ArgumentValue=raw,
        )
    limits.check_key(key)
    return CopySource(bucket, key, _copy_conditions(req), version_id=version_id)


def _source_version(raw: str, query: str) -> str | None:
    """The version a copy source names (`?versionId=`), None for none; 400 for a query that
    names it more than once or empty, 501 for any other parameter."""
    if not query:
        return None
    # SDKs send the id as it is (botocore does not escape it), and S3's ids may hold "+" and
    # "/": percent-escapes are decoded, "+" is not a space.
    pairs = [param.partition("=") for param in query.split("&")]
    if any(name != "versionId" for name, _, _ in pairs):
        raise errors.NotImplementedError_(
            "A copy source with a query other than versionId is not implemented."
        )
    version = unquote(pairs[0][2])
    if len(pairs) != 1 or not version:
        raise errors.InvalidArgument(
            "The copy source may name one version, by a versionId that is not empty.",
            ArgumentName="x-amz-copy-source", ArgumentValue=raw,
        )  # fmt: skip
    return version


def _copy_conditions(req: S3Request) -> Conditions:
    h = req.headers
    return Conditions(
        h.get("x-amz-copy-source-if-match"),
        h.get("x-amz-copy-source-if-none-match"),
        h.get("x-amz-copy-source-if-modified-since"),
        h.get("x-amz-copy-source-if-unmodified-since"),
    )


async def copy_object(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None and req.key is not None
    check_acl_headers(req.headers)
    source = copy_source(req)
    directive = req.headers.get("x-amz-metadata-directive", "COPY").upper()
    if directive not in ("COPY", "REPLACE"):
        raise errors.InvalidArgument(
            "Unknown metadata directive.", ArgumentName="x-amz-metadata-directive"
        )
    attrs = write_attrs(req) if directive == "REPLACE" else None
    tagging = req.headers.get("x-amz-tagging-directive", "COPY").upper()
    if tagging not in ("COPY", "REPLACE"):
        raise errors.InvalidArgument(
            "Unknown tagging directive.", ArgumentName="x-amz-tagging-directive"
        )
    new_tags = tags.from_header(req.headers.get("x-amz-tagging")) if tagging == "REPLACE" else None
    encryption = sse.requested(req.headers)
    if sse.copy_source_key(req.headers):
        raise errors.NotImplementedError_(
            "Copying an object encrypted with a customer key (SSE-C) is not implemented by"
            " this gateway.",
            Header="x-amz-copy-source-server-side-encryption-customer-key",
        )
    if attrs is not None:
        attrs = replace(attrs, tags={}, encryption={})  # given apart, below
    src, new = await ctx.service.copy_object(
        source, req.bucket, req.key, attrs, new_tags, encryption, req.caller
    )
    reply = _xml(xml.copy_result(new.etag, new.last_modified))
    version_header(reply, new)
    source_version_header(reply, src)
    for name, value in sse.response_headers(new.encryption or encryption).items():
        reply.header(name, value)
    return reply


async def put_object_tagging(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None and req.key is not None
    ctx.service.check_writable(req.bucket)
    new = tags.check(xml_in.tagging(await read_small_body(req, 64 << 10)))
    version = req.query.get("versionId")
    await ctx.service.put_object_tagging(req.bucket, req.key, new, version)
    return _named_version(Reply(), version)


async def delete_object_tagging(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None and req.key is not None
    version = req.query.get("versionId")
    await ctx.service.put_object_tagging(req.bucket, req.key, {}, version)
    return _named_version(Reply(status=204), version)


def _named_version(reply: Reply, version: str | None) -> Reply:
    if version is not None:
        reply.header("x-amz-version-id", version)
    return reply


async def delete_object(ctx: Context, req: S3Request) -> Reply:
    """Without versionId, the key's object (on a versioned origin, a delete marker made,
    which the answer names); with it, that version removed for good."""
    assert req.bucket is not None and req.key is not None
    version = req.query.get("versionId")
    if version is None:
        deleted = await ctx.service.delete_object(req.bucket, req.key)
    else:
        deleted = await ctx.service.delete_version(req.bucket, req.key, version)
    reply = Reply(status=204)
    if deleted is not None:
        if deleted.version_id is not None:
            reply.header("x-amz-version-id", deleted.version_id)
        if deleted.delete_marker:
            reply.header("x-amz-delete-marker", "true")
    return reply


async def put_bucket_versioning(ctx: Context, req: S3Request) -> Reply:
    """Passed to an S3 origin whose bucket the mount is whole; 501 for any other store (they
    keep one version of a key) and for a mount of a prefix (versioning is the bucket's)."""
    assert req.bucket is not None
    status, mfa = xml_in.versioning(await read_small_body(req, 64 << 10))
    if mfa == "Enabled":
        raise errors.NotImplementedError_("MFA delete is not implemented by this gateway.")
    if status is not None:
        await ctx.service.put_versioning(req.bucket, status)
    return Reply()


async def delete_objects(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None
    h = req.headers
    integrity = ("content-md5", "x-amz-sdk-checksum-algorithm", "x-amz-trailer")
    if not any(k in h for k in integrity) and not any(k.startswith("x-amz-checksum-") for k in h):
        raise errors.InvalidRequest(
            "Missing required header for this request: Content-MD5 or x-amz-checksum-*"
        )
    ctx.service.check_writable(req.bucket)
    objects, quiet = xml_in.delete_objects(await read_small_body(req))
    # An entry S3 would refuse is that entry's error, not the batch's, and is not sent on.
    refused: list[Deletion] = []
    kept: list[DeleteEntry] = []
    for key, version in objects:
        entry = DeleteEntry(key, version)
        try:
            limits.check_key(key)
            if version == "":
                raise errors.InvalidArgument("Version id cannot be the empty string")
        except errors.S3Error as exc:
            refused.append(Deletion(entry, error=exc))
        else:
            kept.append(entry)
    outcome = [*refused, *await ctx.service.delete_objects(req.bucket, kept, req.caller)]
    deleted = [] if quiet else [_deleted(d) for d in outcome if d.error is None]
    failed = [
        xml.FailedObject(d.entry.key, d.entry.version_id, d.error.code, d.error.detail)
        for d in outcome
        if d.error is not None
    ]
    return _xml(xml.delete_result(deleted, failed, _encoding(req)))


def _deleted(d: Deletion) -> xml.DeletedObject:
    """A <Deleted> as S3 words it: the version id the entry named; the delete marker made
    (no id named) or removed (its id named), with its id."""
    key, version = d.entry.key, d.entry.version_id
    marker = d.done is not None and d.done.delete_marker
    if version is not None:
        return xml.DeletedObject(key, version, marker, version if marker else None)
    marker_id = d.done.version_id if d.done is not None and marker else None
    return xml.DeletedObject(key, None, marker, marker_id)


async def create_bucket(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None
    try:
        check_acl_headers(req.headers)
    except errors.S3Error:
        # AWS's answer to a new bucket asked with ACLs, its ownership being enforced.
        raise errors.InvalidBucketAclWithObjectOwnership() from None
    xml_in.create_bucket(await read_small_body(req, 64 << 10))
    created = await ctx.service.create_bucket(req.bucket, req.caller)
    if not created and ctx.region != "us-east-1":
        # S3 answers us-east-1's CreateBucket of one's own bucket with 200, for old clients.
        raise errors.BucketAlreadyOwnedByYou(BucketName=req.bucket)
    reply = Reply()
    reply.header("location", f"/{req.bucket}")
    return reply


async def delete_bucket(ctx: Context, req: S3Request) -> Reply:
    assert req.bucket is not None
    await ctx.service.delete_bucket(req.bucket)
    return Reply(status=204)
