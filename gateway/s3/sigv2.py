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

from gateway import errors
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


def _canonical_resource(resource_path: str, query_string: str) -> str:
    subs = []
    for part in query_string.split("&") if query_string else ():
        name, eq, value = part.partition("=")
        if name in SUBRESOURCES:
            subs.append((name, unquote(value) if eq else None))
    if not subs:
        return resource_path
    subs.sort(key=lambda nv: nv[0])
    return resource_path + "?" + "&".join(n if v is None else f"{n}={v}" for n, v in subs)


def _amz_headers(headers: Mapping[str, str]) -> str:
    amz = sorted((k, v) for k, v in headers.items() if k.startswith("x-amz-"))
    return "".join(f"{k}:{','.join(p.strip() for p in v.split(','))}\n" for k, v in amz)


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
            if not date.isdigit():
                raise errors.AccessDenied("Query-string authentication requires Expires.")
            if int(date) < self._clock():
                raise errors.AccessDenied("Request has expired", Expires=date)
            presigned = True
        secret = self._lookup(access_key)
        if secret is None:
            raise errors.InvalidAccessKeyId(AWSAccessKeyId=access_key)
        path = raw_path.split("?", 1)[0]
        if bucket_from_host:
            path = f"/{bucket_from_host}{path}"
        head = "\n".join(
            (method, headers.get("content-md5", ""), headers.get("content-type", ""), date)
        )
        amz = _amz_headers(headers)
        # Clients sign the path as they send it, some decoded; the resource of a bucket is
        # "/bucket/" even when the request line says "/bucket". Accept each.
        candidates = [path, unquote(path)]
        if path.count("/") == 1:
            candidates.append(path + "/")
        for candidate in dict.fromkeys(candidates):
            to_sign = f"{head}\n{amz}{_canonical_resource(candidate, query_string)}"
            digest = hmac.new(secret.encode(), to_sign.encode("utf-8"), hashlib.sha1).digest()
            if hmac.compare_digest(base64.b64encode(digest).decode(), signature):
                return AuthResult(access_key, "UNSIGNED-PAYLOAD", presigned, signature, "", "", b"")
        raise errors.SignatureDoesNotMatch(AWSAccessKeyId=access_key)

    def _check_skew(self, value: str | None) -> None:
        if not value:
            raise errors.AccessDenied(
                "AWS authentication requires a valid Date or x-amz-date header"
            )
        try:
            when = parsedate_to_datetime(value).timestamp()
        except (TypeError, ValueError, IndexError):
            raise errors.AccessDenied(
                "AWS authentication requires a valid Date or x-amz-date header"
            ) from None
        if abs(when - self._clock()) > self._max_skew:
            raise errors.RequestTimeTooSkewed(RequestTime=value)
