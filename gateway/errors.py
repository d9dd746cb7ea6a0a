"""Every S3 error the gateway answers, in one table: code, HTTP status and default message.

Errors are raised deep (auth, service, stores mapped at the edge of the service) and
rendered once, by `gateway.s3.app`, as the XML body S3 clients parse.
"""

from __future__ import annotations

import re
from xml.sax.saxutils import escape

# Characters XML 1.0 cannot carry even as references (C0 controls but tab, CR and LF; lone
# surrogates; U+FFFE and U+FFFF). A key or header value echoed back may hold them.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_text(value: str) -> str:
    """`value` escaped for an XML text node, characters XML cannot hold shown as %XX."""
    if _NOT_XML.search(value):
        value = _NOT_XML.sub(lambda m: "".join(f"%{b:02X}" for b in _bytes(m.group())), value)
    return escape(value)


def _bytes(char: str) -> bytes:
    return char.encode("utf-8", "surrogatepass")


class S3Error(Exception):
    """Base of every error that reaches the client as an S3 error document."""

    code = "InternalError"
    status = 500
    message = "We encountered an internal error. Please try again."

    def __init__(self, message: str | None = None, **fields: str) -> None:
        super().__init__(message or self.message)
        self.detail = message or self.message
        # Extra elements S3 adds to some errors (e.g. <Key>, <BucketName>, <ArgumentName>).
        self.fields = fields
        self.headers: dict[str, str] = {}

    def to_xml(self, request_id: str, resource: str = "") -> bytes:
        extra = "".join(f"<{k}>{xml_text(v)}</{k}>" for k, v in self.fields.items())
        return (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{self.code}</Code><Message>{xml_text(self.detail)}</Message>"
            f"{extra}<Resource>{xml_text(resource)}</Resource>"
            f"<RequestId>{request_id}</RequestId></Error>"
        ).encode()


def _error(code: str, status: int, message: str) -> type[S3Error]:
    return type(code, (S3Error,), {"code": code, "status": status, "message": message})


# 3xx / 4xx / 5xx in the order of S3's own error table.
NotModified = _error("NotModified", 304, "Not Modified")
AccessDenied = _error("AccessDenied", 403, "Access Denied")
AccessForbidden = _error("AccessForbidden", 403, "CORSResponse: This CORS request is not allowed.")
BadRequest = _error("BadRequest", 400, "Bad Request")
AuthorizationHeaderMalformed = _error(
    "AuthorizationHeaderMalformed", 400, "The authorization header is malformed."
)
AuthorizationQueryParametersError = _error(
    "AuthorizationQueryParametersError",
    400,
    "Query-string authentication version 4 requires the X-Amz-Algorithm, X-Amz-Credential,"
    " X-Amz-Signature, X-Amz-Date, X-Amz-SignedHeaders, and X-Amz-Expires parameters.",
)
BucketAlreadyExists = _error(
    "BucketAlreadyExists",
    409,
    "The requested bucket name is not available. The bucket namespace is shared by all users"
    " of the system. Please select a different name and try again.",
)
BucketAlreadyOwnedByYou = _error(
    "BucketAlreadyOwnedByYou",
    409,
    "Your previous request to create the named bucket succeeded and you already own it.",
)
ConditionalRequestConflict = _error(
    "ConditionalRequestConflict",
    409,
    "A conflicting operation occurred. If using PutObject you can retry the request. If using"
    " multipart upload you should initiate another CreateMultipartUpload request and re-upload"
    " each part.",
)
BucketNotEmpty = _error("BucketNotEmpty", 409, "The bucket you tried to delete is not empty")
EntityTooSmall = _error(
    "EntityTooSmall",
    400,
    "Your proposed upload is smaller than the minimum allowed object size.",
)
InvalidPart = _error(
    "InvalidPart",
    400,
    "One or more of the specified parts could not be found. The part might not have been"
    " uploaded, or the specified entity tag might not have matched the part's entity tag.",
)
InvalidPartOrder = _error(
    "InvalidPartOrder",
    400,
    "The list of parts was not in ascending order. The parts list must be specified in"
    " order by part number.",
)
BadDigest = _error(
    "BadDigest", 400, "The Content-MD5 or checksum value that you specified did not match."
)
EntityTooLarge = _error(
    "EntityTooLarge", 400, "Your proposed upload exceeds the maximum allowed object size."
)
IncompleteBody = _error(
    "IncompleteBody", 400, "You did not provide the number of bytes specified by the header."
)
InvalidAccessKeyId = _error(
    "InvalidAccessKeyId",
    403,
    "The AWS Access Key Id you provided does not exist in our records.",
)
InvalidArgument = _error("InvalidArgument", 400, "Invalid Argument")
InvalidURI = _error("InvalidURI", 400, "Couldn't parse the specified URI.")
InvalidBucketName = _error("InvalidBucketName", 400, "The specified bucket is not valid.")
# S3 answers 403 for this one (observed; a 400 would be more natural).
InvalidChunkSizeError = _error(
    "InvalidChunkSizeError",
    403,
    "Only the last chunk is allowed to have a size less than 8192 bytes",
)
InvalidDigest = _error("InvalidDigest", 400, "The Content-MD5 you specified is not valid.")
InvalidPartNumber = _error("InvalidPartNumber", 416, "The requested partnumber is not satisfiable")
InvalidRange = _error("InvalidRange", 416, "The requested range is not satisfiable")
InvalidRequest = _error("InvalidRequest", 400, "Invalid Request")
InvalidTag = _error("InvalidTag", 400, "The tag provided was not a valid tag.")
InvalidEncryptionAlgorithmError = _error(
    "InvalidEncryptionAlgorithmError",
    400,
    "The encryption request you specified is not valid. The valid value is AES256.",
)
NoSuchCORSConfiguration = _error(
    "NoSuchCORSConfiguration", 404, "The CORS configuration does not exist"
)
NoSuchTagSet = _error("NoSuchTagSet", 404, "The TagSet does not exist")
InvalidPolicyDocument = _error(
    "InvalidPolicyDocument",
    400,
    "The content of the form does not meet the conditions specified in the policy document.",
)
KeyTooLongError = _error("KeyTooLongError", 400, "Your key is too long")
MalformedXML = _error(
    "MalformedXML",
    400,
    "The XML you provided was not well-formed or did not validate against our published schema.",
)
MalformedPOSTRequest = _error(
    "MalformedPOSTRequest",
    400,
    "The body of your POST request is not well-formed multipart/form-data.",
)
MalformedPolicy = _error(
    "MalformedPolicy", 400, "Policies must be valid JSON and the first byte must be '{'"
)
MalformedTrailerError = _error(
    "MalformedTrailerError",
    400,
    "The request contained trailing data that was not well-formed or did not conform to our"
    " published schema.",
)
AccessControlListNotSupported = _error(
    "AccessControlListNotSupported", 400, "The bucket does not allow ACLs"
)
InvalidBucketAclWithObjectOwnership = _error(
    "InvalidBucketAclWithObjectOwnership",
    400,
    "Bucket cannot have ACLs set with ObjectOwnership's BucketOwnerEnforced setting",
)
MaxPostPreDataLengthExceeded = _error(
    "MaxPostPreDataLengthExceededError",
    400,
    "Your POST request fields preceding the upload file were too large.",
)
MetadataTooLarge = _error(
    "MetadataTooLarge", 400, "Your metadata headers exceed the maximum allowed metadata size."
)
MethodNotAllowed = _error(
    "MethodNotAllowed", 405, "The specified method is not allowed against this resource."
)
MissingContentLength = _error(
    "MissingContentLength", 411, "You must provide the Content-Length HTTP header."
)
MissingSecurityHeader = _error(
    "MissingSecurityHeader", 400, "Your request is missing a required header."
)
NoSuchBucketPolicy = _error("NoSuchBucketPolicy", 404, "The bucket policy does not exist")
NoSuchBucket = _error("NoSuchBucket", 404, "The specified bucket does not exist")
NoSuchKey = _error("NoSuchKey", 404, "The specified key does not exist.")
NoSuchVersion = _error(
    "NoSuchVersion",
    404,
    "The specified version does not exist.",
)
NoSuchUpload = _error(
    "NoSuchUpload",
    404,
    "The specified multipart upload does not exist. The upload ID might be invalid,"
    " or the multipart upload might have been aborted or completed.",
)
NotImplementedError_ = _error(
    "NotImplemented",
    501,
    "A header or query you provided implies functionality that is not implemented.",
)
PreconditionFailed = _error(
    "PreconditionFailed", 412, "At least one of the pre-conditions you specified did not hold"
)
RequestTimeTooSkewed = _error(
    "RequestTimeTooSkewed",
    403,
    "The difference between the request time and the server's time is too large.",
)
SignatureDoesNotMatch = _error(
    "SignatureDoesNotMatch",
    403,
    "The request signature we calculated does not match the signature you provided."
    " Check your key and signing method.",
)
XAmzContentSHA256Mismatch = _error(
    "XAmzContentSHA256Mismatch",
    400,
    "The provided 'x-amz-content-sha256' header does not match what was computed.",
)
InternalError = _error("InternalError", 500, "We encountered an internal error. Please try again.")
ServiceUnavailable = _error("ServiceUnavailable", 503, "Please reduce your request rate.")
SlowDown = _error("SlowDown", 503, "Please reduce your request rate.")
# Answered by the HTTP edge (gateway/edge.py) before a request reaches the S3 layer. S3 uses
# 400 for RequestHeaderSectionTooLarge and RequestTimeout and has no code for a long URI; the
# edge answers with the precise HTTP status and an S3-style code.
RequestHeaderSectionTooLarge = _error(
    "RequestHeaderSectionTooLarge",
    431,
    "Your request header section exceeds the maximum allowed size.",
)
RequestURITooLong = _error(
    "RequestURITooLong", 414, "Your request's URI exceeds the maximum allowed size."
)
RequestTimeout = _error(
    "RequestTimeout",
    408,
    "Your socket connection to the server was not read from or written to within the timeout"
    " period.",
)
