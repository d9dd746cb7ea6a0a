"""The S3 store's object reads without botocore's request pipeline, for the miss path.

A cold miss of a small object is one GET to the origin, and through aiobotocore that GET cost
~1.3 ms of CPU on its own (events, endpoint rules, the user-agent string rebuilt, retry
bookkeeping, response parsing into a dict): about a third of the gateway's CPU per miss, and
at sixteen readers the miss path is CPU-bound. Here a GET is written to a keep-alive
connection of the store's own pool (http1.py; aiohttp's request cost ~0.25 ms of CPU more),
signed by `GetSigner`: SigV4 exactly as botocore's S3SigV4Auth signs such a GET (a test holds
the two to the same Authorization header), with the signing key kept per day and the
request's fixed parts made once. botocore's signer built an AWSRequest, its header maps on
email.message, and four HMACs for the key on every call: ~0.3 ms of a miss's CPU.

Only success is handled here: any other answer (an error status, a redirect) and any
transport failure return None, and the caller asks botocore again, whose error mapping,
retries and region handling then decide. The URL of an object is botocore's too: the store's
endpoint and addressing style are read once from a presigned URL.

Used where the store has static credentials (the mount's access_key/secret_key); with the
default credential chain (instance roles, refreshed tokens) every request goes to botocore.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import html
import logging
import re
import time
from collections.abc import AsyncGenerator, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

from botocore.auth import EMPTY_SHA256_HASH, SIGNED_HEADERS_BLACKLIST, _host_from_url
from botocore.credentials import Credentials
from botocore.exceptions import ClientError
from botocore.utils import percent_encode

from gateway.stores.s3.http1 import FAILURES, Pool, ProtocolError, Response

log = logging.getLogger(__name__)

_META = "x-amz-meta-"
# Answers botocore would not retry either, common on the miss path: raised here as botocore
# raises them (a ClientError with the code from the body), not asked again.
_FINAL = frozenset({304, 404, 412, 416})
_ERROR_BODY_MAX = 64 << 10
# Answers that may mean this request was built wrong (signature, region, endpoint) rather than
# that the object is out of reach: if botocore then succeeds, the lean GET is given up.
_REFUSALS = frozenset({301, 307, 400, 403})
_CHECKSUMS = {
    "x-amz-checksum-crc32": "ChecksumCRC32",
    "x-amz-checksum-crc32c": "ChecksumCRC32C",
    "x-amz-checksum-crc64nvme": "ChecksumCRC64NVME",
    "x-amz-checksum-sha1": "ChecksumSHA1",
    "x-amz-checksum-sha256": "ChecksumSHA256",
}
_PLAIN = {
    "content-type": "ContentType",
    "content-encoding": "ContentEncoding",
    "content-disposition": "ContentDisposition",
    "content-language": "ContentLanguage",
    "cache-control": "CacheControl",
    "content-range": "ContentRange",
    "etag": "ETag",
    "x-amz-version-id": "VersionId",
    "x-amz-storage-class": "StorageClass",
    "x-amz-checksum-type": "ChecksumType",
    "x-amz-tagging-count": "TagCount",
    "x-amz-server-side-encryption": "ServerSideEncryption",
    "x-amz-server-side-encryption-aws-kms-key-id": "SSEKMSKeyId",
    "x-amz-server-side-encryption-bucket-key-enabled": "BucketKeyEnabled",
    "x-amz-server-side-encryption-customer-algorithm": "SSECustomerAlgorithm",
    "x-amz-server-side-encryption-customer-key-md5": "SSECustomerKeyMD5",
}


_UNSIGNED = frozenset(SIGNED_HEADERS_BLACKLIST)


class GetSigner:
    """SigV4 for a GET with no body, as botocore's S3SigV4Auth signs it without a client
    config (the payload hash is that of no bytes, the path as given, no query): the headers
    to send with the request's own. Static credentials; the signing key is made once a day."""

    __slots__ = ("_access", "_day", "_host", "_key", "_region", "_secret", "_stamp", "_token")

    def __init__(self, credentials: Credentials, region: str, url: str) -> None:
        self._access = credentials.access_key
        self._secret = credentials.secret_key
        self._token = credentials.token
        self._region = region
        self._host = _host_from_url(url)
        self._day = ""
        self._key = b""
        self._stamp = (-1, "")  # (second, its SigV4 timestamp)

    @property
    def host(self) -> str:
        """The Host the requests are signed for (and must be sent with)."""
        return self._host

    def _signing_key(self, day: str) -> bytes:
        if day != self._day:
            key = f"AWS4{self._secret}".encode()
            for part in (day, self._region, "s3", "aws4_request"):
                key = hmac.new(key, part.encode(), hashlib.sha256).digest()
            self._day, self._key = day, key
        return self._key

    def timestamp(self, now: float | None = None) -> str:
        second = int(time.time() if now is None else now)
        if self._stamp[0] != second:
            self._stamp = (second, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(second)))
        return self._stamp[1]

    def sign(self, path: str, headers: Mapping[str, str], stamp: str) -> dict[str, str]:
        """`headers` with the date, payload hash, token and Authorization of a GET of `path`
        (percent-encoded as sent) at `stamp` (an X-Amz-Date)."""
        out = dict(headers)
        out["X-Amz-Date"] = stamp
        if self._token:
            out["X-Amz-Security-Token"] = self._token
        out["X-Amz-Content-SHA256"] = EMPTY_SHA256_HASH
        signed: dict[str, str] = {"host": self._host}
        for name, value in out.items():
            lower = name.lower()
            if lower not in _UNSIGNED:
                # Trimall; botocore joins repeated names with commas (a dict has none).
                signed[lower] = " ".join(value.split())
        names = sorted(signed)
        signed_names = ";".join(names)
        canonical = "\n".join(f"{n}:{signed[n]}" for n in names)
        request = f"GET\n{path}\n\n{canonical}\n\n{signed_names}\n{EMPTY_SHA256_HASH}"
        day = stamp[:8]
        scope = f"{day}/{self._region}/s3/aws4_request"
        digest = hashlib.sha256(request.encode()).hexdigest()
        to_sign = f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{digest}"
        signature = hmac.new(self._signing_key(day), to_sign.encode(), hashlib.sha256).hexdigest()
        out["Authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={self._access}/{scope}, "
            f"SignedHeaders={signed_names}, Signature={signature}"
        )
        return out


class FastGet:
    """Signed GETs of one bucket's objects. `base` is everything of an object's URL before
    its percent-encoded key (scheme, host, and the bucket for path-style addressing)."""

    def __init__(
        self,
        base: str,
        region: str,
        credentials: Credentials,
        connect_timeout: float,
        read_timeout: float,
        connections: int = 64,
    ) -> None:
        self.base = base
        parts = urlsplit(base)
        self._path = parts.path  # the bucket's part, path-style, as a presigned URL has it
        self._signer = GetSigner(credentials, region, base)
        self._host = (("Host", self._signer.host),)
        self._timeouts = (connect_timeout, read_timeout)
        self._connections = connections
        self._pool: Pool | None = None
        self.refused = False  # the last GET was refused (see _REFUSALS)

    def _client(self) -> Pool:
        if self._pool is None:
            connect, read = self._timeouts
            self._pool = Pool(self.base, connect, read, self._connections)
        return self._pool

    def url(self, full_key: str) -> str:
        return self.base + percent_encode(full_key, safe="/~")

    async def get(
        self, full_key: str, headers: Mapping[str, str]
    ) -> tuple[dict[str, Any], Response] | None:
        """(the answer's fields in botocore's names, the open response) for a 200 or 206;
        botocore's ClientError for a 304, 404, 412 or 416; None for anything else (the caller
        asks botocore, which retries what is worth it), the response closed."""
        self.refused = False
        # As signed: the key's escapes, "." and ".." segments are ordinary characters of it.
        target = self._path + percent_encode(full_key, safe="/~")
        signer = self._signer
        signed = signer.sign(target, headers, signer.timestamp())
        try:
            response = await self._client().get(target, (*self._host, *signed.items()))
        except FAILURES as exc:
            log.debug("fast GET of %s failed, asking botocore: %r", full_key, exc)
            # An answer this client cannot read (a chunked one): if botocore's succeeds, the
            # lean GET is given up for this origin, as for a refusal.
            self.refused = isinstance(exc, ProtocolError)
            return None
        if response.status in _FINAL:
            raise await _client_error(response)
        if response.status not in (200, 206):
            self.refused = response.status in _REFUSALS
            response.close()
            return None
        try:
            return fields(response), response
        except (KeyError, ValueError, TypeError) as exc:  # an answer botocore should judge
            response.close()
            log.debug("fast GET of %s: unexpected answer, asking botocore: %r", full_key, exc)
            return None

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None


async def _client_error(response: Response) -> ClientError:
    """The ClientError botocore raises for this answer: the code and message of the XML error
    body (none for a 304 or a HEAD-like empty body: the status stands for the code)."""
    try:
        body = await response.read(_ERROR_BODY_MAX)
    except FAILURES:
        body = b""  # the status alone says what happened
    finally:
        response.release()
    text = body.decode("utf-8", "replace")
    code = _element(text, "Code") or str(response.status)
    error = {"Code": code, "Message": _element(text, "Message") or ""}
    meta = {
        "HTTPStatusCode": response.status,
        "HTTPHeaders": {k.lower(): v for k, v in response.headers},
        "RequestId": response.header("x-amz-request-id") or "",
    }
    return ClientError({"Error": error, "ResponseMetadata": meta}, "GetObject")


def _element(text: str, name: str) -> str | None:
    found = re.search(rf"<{name}>([^<]*)</{name}>", text)
    return html.unescape(found.group(1)) if found else None


def fields(response: Response) -> dict[str, Any]:
    """An S3 GET answer's headers as botocore's GetObject output names them (values decoded as
    Latin-1, as botocore's http.client does, so that both paths agree on non-ASCII ones)."""
    out: dict[str, Any] = {"Metadata": {}}
    for name, value in response.headers:
        lower = name.lower()
        if lower.startswith(_META):
            out["Metadata"][name[len(_META) :]] = value  # the name as sent, as botocore has it
        elif lower in _PLAIN:
            out[_PLAIN[lower]] = value
        elif lower in _CHECKSUMS:
            out[_CHECKSUMS[lower]] = value
        elif lower == "content-length":
            out["ContentLength"] = int(value)
        elif lower == "last-modified":
            out["LastModified"] = parsedate_to_datetime(value).astimezone(UTC)
        elif lower == "expires":
            out["ExpiresString"] = value
            with contextlib.suppress(TypeError, ValueError):
                out["Expires"] = parsedate_to_datetime(value).astimezone(UTC)
    for needed in ("ContentLength", "ETag", "LastModified"):
        if needed not in out:
            raise KeyError(needed)
    if not isinstance(out["LastModified"], datetime):
        raise TypeError("Last-Modified")
    return out


async def body_chunks(response: Response, size: int) -> AsyncGenerator[bytes, None]:
    """The body in pieces of up to about `size` bytes; the connection is pooled again only
    when the body was read to its end."""
    try:
        async for chunk in response.chunks(size):
            yield chunk
    except FAILURES as exc:
        # As aiohttp's: the store's client turns it into a StoreUnavailable.
        raise ConnectionResetError(f"the origin's answer was cut: {exc!r}") from exc
    finally:
        response.release()
