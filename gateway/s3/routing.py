"""Which S3 operation a request is: by target (service, bucket, object), method and the query
parameter that names a sub-resource. Anything not in the table answers NotImplemented rather
than a wrong answer; a query parameter an operation does not know does too."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import parse_qsl

from gateway import errors
from gateway.s3 import handlers as r
from gateway.s3 import handlers_acl as a
from gateway.s3 import handlers_cors as c
from gateway.s3 import handlers_multipart as m
from gateway.s3 import handlers_policy as p
from gateway.s3 import handlers_write as w
from gateway.s3.handlers import RESPONSE_OVERRIDES, Context
from gateway.s3.http import Reply, S3Request

Handler = Callable[[Context, S3Request], Awaitable[Reply]]

# Parameters of authentication and SDK bookkeeping, allowed on every operation.
AUTH_PARAMS = frozenset(
    {
        "x-id", "AWSAccessKeyId", "Expires", "Signature", "X-Amz-Algorithm",
        "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires", "X-Amz-SignedHeaders",
        "X-Amz-Signature", "X-Amz-Security-Token", "X-Amz-Content-Sha256",
    }
)  # fmt: skip
# A version of an object may be named by id ("null": the one of a bucket never versioned).
_VERSION = ("versionId",)
# The operations that address any version of a store that keeps them (the service checks the
# id); the others take "null" only.
_VERSIONED = frozenset(
    {
        "GetObject", "HeadObject", "DeleteObject", "GetObjectTagging", "PutObjectTagging",
        "DeleteObjectTagging", "GetObjectAttributes",
    }
)  # fmt: skip
_LIST = {"prefix", "delimiter", "max-keys", "encoding-type"}


# The IAM action each operation is authorized as (docs/tenants.md), where it is not
# "s3:" + the operation's name: policies speak of actions, and several operations share one.
ACTIONS = {
    "ListBuckets": "s3:ListAllMyBuckets",
    "HeadBucket": "s3:ListBucket",
    "ListObjects": "s3:ListBucket",
    "ListObjectsV2": "s3:ListBucket",
    "ListObjectVersions": "s3:ListBucketVersions",
    "ListMultipartUploads": "s3:ListBucketMultipartUploads",
    "ListParts": "s3:ListMultipartUploadParts",
    "HeadObject": "s3:GetObject",
    "CreateMultipartUpload": "s3:PutObject",
    "UploadPart": "s3:PutObject",
    "UploadPartCopy": "s3:PutObject",
    "CompleteMultipartUpload": "s3:PutObject",
    "CopyObject": "s3:PutObject",
    "DeleteObjects": "s3:DeleteObject",
    "GetBucketCors": "s3:GetBucketCORS",
    "PutBucketCors": "s3:PutBucketCORS",
    "DeleteBucketCors": "s3:PutBucketCORS",
    "DeleteBucketTagging": "s3:PutBucketTagging",
}
# The IAM action of an operation that names a version (any versionId, "null" too), as AWS
# authorizes it: a policy that allows s3:DeleteObject does not let a version be removed.
VERSION_ACTIONS = {
    "GetObject": "s3:GetObjectVersion",
    "HeadObject": "s3:GetObjectVersion",
    "DeleteObject": "s3:DeleteObjectVersion",
    "GetObjectTagging": "s3:GetObjectVersionTagging",
    "PutObjectTagging": "s3:PutObjectVersionTagging",
    "DeleteObjectTagging": "s3:DeleteObjectVersionTagging",
    "GetObjectAttributes": "s3:GetObjectVersionAttributes",
    "GetObjectAcl": "s3:GetObjectVersionAcl",
    "PutObjectAcl": "s3:PutObjectVersionAcl",
}


@dataclass(frozen=True, slots=True)
class Operation:
    name: str
    handler: Handler
    read_only: bool = True
    selector: str | None = None  # the query parameter that picks this operation
    params: frozenset[str] = frozenset()  # other query parameters it accepts
    action: str = ""  # the IAM action it is authorized as; "" for the gateway's own
    version_action: str = ""  # the action when the request names a version (versionId)

    def action_for(self, query: dict[str, str]) -> str:
        """The IAM action this request is authorized as."""
        if self.version_action and "versionId" in query:
            return self.version_action
        return self.action


def _op(
    name: str, handler: Handler, read_only: bool, selector: str | None = None, *params: str
) -> Operation:
    allowed = frozenset(params) | ({selector} if selector else set())
    action = ACTIONS.get(name, f"s3:{name}")
    return Operation(
        name, handler, read_only, selector, allowed, action, VERSION_ACTIONS.get(name, "")
    )


# Most specific first: an operation with a selector wins over the plain one.
TABLE: dict[tuple[str, str], list[Operation]] = {
    ("service", "GET"): [
        _op("ListBuckets", r.list_buckets, True, None,
            "max-buckets", "continuation-token", "prefix", "bucket-region"),
    ],
    ("bucket", "GET"): [
        _op("GetBucketPolicy", p.get_bucket_policy, True, "policy"),
        _op("GetBucketAcl", a.get_bucket_acl, True, "acl"),
        _op("GetBucketLocation", r.get_bucket_location, True, "location"),
        _op("GetBucketVersioning", r.get_bucket_versioning, True, "versioning"),
        _op("GetBucketCors", c.get_bucket_cors, False, "cors"),
        _op("ListMultipartUploads", m.list_multipart_uploads, True, "uploads",
            "prefix", "delimiter", "key-marker", "upload-id-marker", "max-uploads",
            "encoding-type"),
        _op("ListObjectsV2", r.list_objects_v2, True, "list-type",
            *_LIST, "continuation-token", "start-after", "fetch-owner"),
        _op("ListObjectVersions", r.list_object_versions, True, "versions",
            *_LIST, "key-marker", "version-id-marker"),
        _op("ListObjects", r.list_objects_v1, True, None, *_LIST, "marker"),
    ],
    ("bucket", "HEAD"): [_op("HeadBucket", r.head_bucket, True)],
    ("bucket", "PUT"): [
        _op("PutBucketCors", c.put_bucket_cors, False, "cors"),
        _op("PutBucketPolicy", p.put_bucket_policy, False, "policy"),
        _op("PutBucketAcl", a.put_bucket_acl, False, "acl"),
        _op("PutBucketVersioning", w.put_bucket_versioning, False, "versioning"),
        _op("CreateBucket", w.create_bucket, False),
    ],
    ("bucket", "DELETE"): [
        _op("DeleteBucketCors", c.delete_bucket_cors, False, "cors"),
        _op("DeleteBucketPolicy", p.delete_bucket_policy, False, "policy"),
        _op("DeleteBucket", w.delete_bucket, False),
    ],
    ("bucket", "POST"): [_op("DeleteObjects", w.delete_objects, False, "delete")],
    ("object", "GET"): [
        _op("ListParts", m.list_parts, True, "uploadId", "max-parts", "part-number-marker"),
        _op("GetObjectAttributes", r.get_object_attributes, True, "attributes", *_VERSION),
        _op("GetObjectTagging", r.get_object_tagging, True, "tagging", *_VERSION),
        _op("GetObjectAcl", a.get_object_acl, True, "acl", *_VERSION),
        _op("GetObject", r.get_object_part, True, "partNumber", *RESPONSE_OVERRIDES, *_VERSION),
        _op("GetObject", r.get_object, True, None, *RESPONSE_OVERRIDES, *_VERSION),
    ],
    ("object", "HEAD"): [
        _op("HeadObject", r.get_object_part, True, "partNumber", *RESPONSE_OVERRIDES, *_VERSION),
        _op("HeadObject", r.get_object, True, None, *RESPONSE_OVERRIDES, *_VERSION),
    ],
    ("object", "PUT"): [
        _op("UploadPart", m.upload_part, False, "uploadId", "partNumber"),
        _op("PutObjectTagging", w.put_object_tagging, False, "tagging", *_VERSION),
        _op("PutObjectAcl", a.put_object_acl, False, "acl", *_VERSION),
        _op("PutObject", w.put_object, False),
    ],
    ("object", "DELETE"): [
        _op("AbortMultipartUpload", m.abort_multipart_upload, False, "uploadId"),
        _op("DeleteObjectTagging", w.delete_object_tagging, False, "tagging", *_VERSION),
        _op("DeleteObject", w.delete_object, False, None, *_VERSION),
    ],
    ("object", "POST"): [
        _op("CreateMultipartUpload", m.create_multipart_upload, False, "uploads"),
        _op("CompleteMultipartUpload", m.complete_multipart_upload, False, "uploadId"),
    ],
}  # fmt: skip
_METHODS = {"GET", "HEAD", "PUT", "POST", "DELETE"}
# The operation a request with no query parameters is, where there is one: a plain GET needs
# no walk past the sub-resources.
_PLAIN = {
    target: plain[0]
    for target, ops in TABLE.items()
    if (plain := [op for op in ops if op.selector is None])
}


def route(req: S3Request) -> Operation:
    target = "service" if req.bucket is None else "bucket" if req.key is None else "object"
    if not req.query:
        plain = _PLAIN.get((target, req.method))
        if plain is not None:
            return plain
    for op in TABLE.get((target, req.method), ()):
        if op.selector is not None and op.selector not in req.query:
            continue
        if op.name == "ListObjectsV2" and req.query.get("list-type") != "2":
            continue
        unknown = [p for p in req.query if p not in op.params and p not in AUTH_PARAMS]
        if unknown:
            raise errors.NotImplementedError_(
                f"{op.name} with ?{unknown[0]} is not implemented by this gateway."
            )
        version = req.query.get("versionId")
        if version is not None:
            if not version:
                raise errors.InvalidArgument(
                    "Version id cannot be the empty string", ArgumentName="versionId",
                    ArgumentValue=version,
                )  # fmt: skip
            if _repeated(req.query_string, "versionId"):
                # Which one was meant? Never "the last one wins" on a version to read or remove.
                raise errors.InvalidArgument(
                    "The versionId parameter may be given once.", ArgumentName="versionId",
                    ArgumentValue=version,
                )  # fmt: skip
            if version != "null" and op.name not in _VERSIONED:
                raise errors.InvalidArgument(
                    "Invalid version id specified", ArgumentName="versionId", ArgumentValue=version
                )
        return op
    if req.method not in _METHODS:
        raise errors.MethodNotAllowed(Method=req.method, ResourceType=target.upper())
    extra = [p for p in req.query if p not in AUTH_PARAMS]
    what = f"{req.method} with ?{extra[0]}" if extra else f"{req.method} on this resource"
    raise errors.NotImplementedError_(f"{what} is not implemented by this gateway.")


def _repeated(query_string: str, name: str) -> bool:
    """Whether the query names the parameter more than once (the parsed query keeps one)."""
    pairs = parse_qsl(query_string, keep_blank_values=True)
    return sum(1 for n, _ in pairs if n == name) > 1
