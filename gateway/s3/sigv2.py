"""AWS Signature Version 2 (HMAC-SHA1) for S3: the Authorization header `AWS AK:sig` and the
query form `AWSAccessKeyId`, `Expires`, `Signature`.

Still what boto3's generate_presigned_url produces by default for an S3 client with a custom
endpoint, and what older tools (s3cmd's default, many SDKs of the 2010s) send; refusing it
would break users who change nothing but the endpoint URL.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime
from urllib.parse import unquote

from gateway import decimals, errors
from gateway.s3.sigv4 import AuthResult

# The query parameters S3 counts as sub-resources in the string to sign.
SUBRESOURCES = frozenset(
    {
        "accelerate", "acl", "analytics", "cors", "delete", "inventory", "lifecycle",
        "location", "logging", "metrics", "notification", "object-lock", "partNumber",
        "policy", "replication", "requestPayment", "response-cache-control",
        "response-content-disposition", "response-content-encoding",
        "response-content-language", "response-content-type", "response-expires", "restore",
        "select", "select-type", "storageClass", "tagging", "torrent", "uploadId", "uploads",
        "versionId", "versioning", "versions", "website",
    }
)  # fmt: skip


def is_sigv2(headers: Mapping[str, str], query_string: str) -> bool:
    if headers.get("authorization", "").startswith("AWS "):
        return True
    return "AWSAccessKeyId=" in query_string and "Signature=" in query_string


def canonical_resource(raw_path: str, bucket_from_host: str | None) -> str:
    """The path part of S3's CanonicalizedResource: the path exactly as sent, percent-escapes
    and all (S3 signs it "literally as it appears in the HTTP request"), behind "/bucket" for
    a virtual-host request; a bucket's own resource is "/bucket/" however the request line
    writes it.

    Exactly one resource per request: a signature for `/b/a%20b` (the key "a b") does not
    verify `/b/a%2520b` (the key "a%20b"), as it would if a decoded form were tried too.
    """
    path = raw_path.split("?", 1)[0] or "/"
    if not path.isascii():  # raw UTF-8 on the request line: the client signed the characters
        path = path.encode("latin-1").decode("utf-8", "replace")
    if bucket_from_host:
        return f"/{bucket_from_host}{path}"
    if path.count("/") == 1 and len(path) > 1:  # "/bucket"
        return path + "/"
    return path


def _with_subresources(resource: str, query_string: str) -> str:
    subs = []
    for part in query_string.split("&") if query_string else ():
        name, eq, value = part.partition("=")
        if name in SUBRESOURCES:
            subs.append((name, unquote(value) if eq else None))
    if not subs:
        return resource
    subs.sort(key=lambda nv: nv[0])
    return resource + "?" + "&".join(n if v is None else f"{n}={v}" for n, v in subs)


def _amz_headers(headers: Mapping[str, str]) -> str:
    # Repeated headers arrive joined by ',' (each value trimmed), which is S3's combined
    # form; a comma inside one value ("x-amz-date: Tue, 01 Dec ...") is the value's own.
    amz = sorted((k, v) for k, v in headers.items() if k.startswith("x-amz-"))
    return "".join(f"{k}:{v.strip()}\n" for k, v in amz)


class SigV2Verifier:
    def __init__(
        self,
        lookup_secret: Callable[[str], str | None],
        *,
        max_skew: float = 900.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._lookup = lookup_secret
        self._max_skew = max_skew
        self._clock = clock

    def verify(
        self,
        method: str,
        raw_path: str,
        query_string: str,
        headers: Mapping[str, str],
        bucket_from_host: str | None,
    ) -> AuthResult:
        """Check a SigV2 request; `bucket_from_host` for virtual-host style requests."""
        header = headers.get("authorization", "")
        if header:
            access_key, sep, signature = header[4:].strip().rpartition(":")
            if not sep or not access_key or not signature:
                raise errors.AuthorizationHeaderMalformed(
                    "The authorization header is malformed; expected AWS AccessKeyId:Signature."
                )
            date = "" if "x-amz-date" in headers else headers.get("date", "")
            self._check_skew(headers.get("x-amz-date") or headers.get("date"))
            presigned = False
        else:
            params = dict(
                (p.partition("=")[0], unquote(p.partition("=")[2])) for p in query_string.split("&")
            )
            access_key, signature = params.get("AWSAccessKeyId", ""), params.get("Signature", "")
            date = params.get("Expires", "")
            self._check_expires(date)
            presigned = True
        secret = self._lookup(access_key)
        if secret is None:
            raise errors.InvalidAccessKeyId(AWSAccessKeyId=access_key)
        head = "\n".join(
            (method, headers.get("content-md5", ""), headers.get("content-type", ""), date)
        )
        resource = canonical_resource(raw_path, bucket_from_host)
        to_sign = f"{head}\n{_amz_headers(headers)}{_with_subresources(resource, query_string)}"
        digest = hmac.new(secret.encode(), to_sign.encode("utf-8"), hashlib.sha1).digest()
        if hmac.compare_digest(base64.b64encode(digest).decode(), signature):
            return AuthResult(access_key, "UNSIGNED-PAYLOAD", presigned, signature, "", "", b"")
        raise errors.SignatureDoesNotMatch(AWSAccessKeyId=access_key, StringToSign=to_sign)

    def verify_policy(self, access_key: str, policy: str, signature: str) -> AuthResult:
        """A browser form signed with SigV2 (POST Object's `AWSAccessKeyId` and `signature`
        fields): the HMAC-SHA1 of its base64 policy document itself. The policy's own
        expiration, not a skew, bounds its life."""
        secret = self._lookup(access_key)
        if secret is None:
            raise errors.InvalidAccessKeyId(AWSAccessKeyId=access_key)
        digest = hmac.new(secret.encode(), policy.encode("utf-8"), hashlib.sha1).digest()
        if signature.isascii() and hmac.compare_digest(
            base64.b64encode(digest).decode(), signature
        ):
            return AuthResult(access_key, "UNSIGNED-PAYLOAD", False, signature, "", "", b"")
        raise errors.SignatureDoesNotMatch(
            AWSAccessKeyId=access_key, StringToSign=policy, SignatureProvided=signature
        )

    def _check_expires(self, value: str) -> None:
        if not value:
            raise errors.AccessDenied("Query-string authentication requires Expires.")
        expires = decimals.parse(value, decimals.INT64_MAX)
        if expires is None:
            raise errors.AccessDenied("Invalid date (should be seconds since epoch)", Expires=value)
        if expires < self._clock():
            raise errors.AccessDenied("Request has expired", Expires=value)

    def _check_skew(self, value: str | None) -> None:
        if not value:
            raise errors.AccessDenied(
                "AWS authentication requires a valid Date or x-amz-date header"
            )
        try:
            when = parsedate_to_datetime(value).timestamp()
        except (TypeError, ValueError, IndexError, OverflowError):
            raise errors.AccessDenied(
                "AWS authentication requires a valid Date or x-amz-date header"
            ) from None
        if abs(when - self._clock()) > self._max_skew:
            raise errors.RequestTimeTooSkewed(RequestTime=value)
