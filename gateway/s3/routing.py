"""Which S3 operation a request is: by target (service, bucket, object), method and the query
parameter that names a sub-resource. Anything not in the table answers NotImplemented rather
than a wrong answer; a query parameter an operation does not know does too."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gateway import errors
from gateway.s3 import handlers as r
from gateway.s3 import handlers_multipart as m
from gateway.s3 import handlers_write as w
from gateway.s3.handlers import RESPONSE_OVERRIDES, Context
from gateway.s3.http import Reply, S3Request

Handler = Callable[[Context, S3Request], Awaitable[Reply]]

# Parameters of authentication and SDK bookkeeping, allowed on every operation.
_ANY = frozenset(
    {
        "x-id", "AWSAccessKeyId", "Expires", "Signature", "X-Amz-Algorithm",
        "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires", "X-Amz-SignedHeaders",
        "X-Amz-Signature", "X-Amz-Security-Token", "X-Amz-Content-Sha256",
    }
)  # fmt: skip
_LIST = {"prefix", "delimiter", "max-keys", "encoding-type"}


@dataclass(frozen=True, slots=True)
class Operation:
    name: str
    handler: Handler
    read_only: bool = True
    selector: str | None = None  # the query parameter that picks this operation
    params: frozenset[str] = frozenset()  # other query parameters it accepts


def _op(
    name: str, handler: Handler, read_only: bool, selector: str | None = None, *params: str
) -> Operation:
    allowed = frozenset(params) | ({selector} if selector else set())
    return Operation(name, handler, read_only, selector, allowed)


# Most specific first: an operation with a selector wins over the plain one.
TABLE: dict[tuple[str, str], list[Operation]] = {
    ("service", "GET"): [_op("ListBuckets", r.list_buckets, True)],
    ("bucket", "GET"): [
        _op("GetBucketLocation", r.get_bucket_location, True, "location"),
        _op("ListMultipartUploads", m.list_multipart_uploads, True, "uploads",
            "prefix", "delimiter", "key-marker", "upload-id-marker", "max-uploads",
            "encoding-type"),
        _op("ListObjectsV2", r.list_objects_v2, True, "list-type",
            *_LIST, "continuation-token", "start-after", "fetch-owner"),
        _op("ListObjects", r.list_objects_v1, True, None, *_LIST, "marker"),
    ],
    ("bucket", "HEAD"): [_op("HeadBucket", r.head_bucket, True)],
    ("bucket", "PUT"): [_op("CreateBucket", w.create_bucket, False)],
    ("bucket", "DELETE"): [_op("DeleteBucket", w.delete_bucket, False)],
    ("bucket", "POST"): [_op("DeleteObjects", w.delete_objects, False, "delete")],
    ("object", "GET"): [
        _op("ListParts", m.list_parts, True, "uploadId", "max-parts", "part-number-marker"),
        _op("GetObject", r.get_object, True, None, *RESPONSE_OVERRIDES),
    ],
    ("object", "HEAD"): [_op("HeadObject", r.get_object, True, None, *RESPONSE_OVERRIDES)],
    ("object", "PUT"): [
        _op("UploadPart", m.upload_part, False, "uploadId", "partNumber"),
        _op("PutObject", w.put_object, False),
    ],
    ("object", "DELETE"): [
        _op("AbortMultipartUpload", m.abort_multipart_upload, False, "uploadId"),
        _op("DeleteObject", w.delete_object, False),
    ],
    ("object", "POST"): [
        _op("CreateMultipartUpload", m.create_multipart_upload, False, "uploads"),
        _op("CompleteMultipartUpload", m.complete_multipart_upload, False, "uploadId"),
    ],
}  # fmt: skip
_METHODS = {"GET", "HEAD", "PUT", "POST", "DELETE"}


def route(req: S3Request) -> Operation:
    target = "service" if req.bucket is None else "bucket" if req.key is None else "object"
    for op in TABLE.get((target, req.method), ()):
        if op.selector is not None and op.selector not in req.query:
            continue
        if op.name == "ListObjectsV2" and req.query.get("list-type") != "2":
            continue
        unknown = [p for p in req.query if p not in op.params and p not in _ANY]
        if unknown:
            raise errors.NotImplementedError_(
                f"{op.name} with ?{unknown[0]} is not implemented by this gateway."
            )
        return op
    if req.method not in _METHODS:
        raise errors.MethodNotAllowed(Method=req.method, ResourceType=target.upper())
    extra = [p for p in req.query if p not in _ANY]
    what = f"{req.method} with ?{extra[0]}" if extra else f"{req.method} on this resource"
    raise errors.NotImplementedError_(f"{what} is not implemented by this gateway.")
