"""SigV4 for the S3 transport's bodiless requests (GET, HEAD), as botocore's S3SigV4Auth signs
them (a test holds the two to the same headers), with the signing key kept per secret and day.

botocore's signer built an AWSRequest, its header maps on email.message, and four HMACs for
the key on every call: ~0.3 ms of a miss's CPU. Here the key is derived once a day (and again
when refreshed credentials bring another secret), the timestamp once a second.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Iterable, Mapping

from botocore.auth import EMPTY_SHA256_HASH, SIGNED_HEADERS_BLACKLIST, _host_from_url
from botocore.credentials import ReadOnlyCredentials
from botocore.utils import percent_encode

_UNSIGNED = frozenset(SIGNED_HEADERS_BLACKLIST)


def canonical_query(query: Iterable[tuple[str, str]]) -> str:
    """A query string as SigV4 signs it (and as it is sent): each name and value
    percent-encoded, sorted."""
    pairs = sorted((percent_encode(k), percent_encode(v)) for k, v in query)
    return "&".join(f"{k}={v}" for k, v in pairs)


class Signer:
    """Signs requests without a body to one endpoint (`url`: its Host) in one region."""

    __slots__ = ("_host", "_key", "_region", "_stamp")

    def __init__(self, region: str, url: str) -> None:
        self._region = region
        self._host = _host_from_url(url)
        self._key = ("", "", b"")  # (secret, day, the signing key)
        self._stamp = (-1, "")  # (second, its SigV4 timestamp)

    @property
    def host(self) -> str:
        """The Host the requests are signed for (and must be sent with)."""
        return self._host

    def _signing_key(self, secret: str, day: str) -> bytes:
        cached_secret, cached_day, key = self._key
        if secret != cached_secret or day != cached_day:
            key = f"AWS4{secret}".encode()
            for part in (day, self._region, "s3", "aws4_request"):
                key = hmac.new(key, part.encode(), hashlib.sha256).digest()
            self._key = (secret, day, key)
        return key

    def timestamp(self, now: float | None = None) -> str:
        second = int(time.time() if now is None else now)
        if self._stamp[0] != second:
            self._stamp = (second, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(second)))
        return self._stamp[1]

    def sign(
        self,
        credentials: ReadOnlyCredentials,
        method: str,
        path: str,
        query: str,
        headers: Mapping[str, str],
        stamp: str,
    ) -> dict[str, str]:
        """`headers` with the date, payload hash, token and Authorization of a `method` of
        `path` (percent-encoded as sent) with `query` (canonical_query's) at `stamp`."""
        out = dict(headers)
        out["X-Amz-Date"] = stamp
        if credentials.token:
            out["X-Amz-Security-Token"] = credentials.token
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
        request = f"{method}\n{path}\n{query}\n{canonical}\n\n{signed_names}\n{EMPTY_SHA256_HASH}"
        day = stamp[:8]
        scope = f"{day}/{self._region}/s3/aws4_request"
        digest = hashlib.sha256(request.encode()).hexdigest()
        to_sign = f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{digest}"
        key = self._signing_key(credentials.secret_key, day)
        signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        out["Authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={credentials.access_key}/{scope}, "
            f"SignedHeaders={signed_names}, Signature={signature}"
        )
        return out
