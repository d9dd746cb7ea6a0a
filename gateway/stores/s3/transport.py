"""The S3 store's one seam to the wire for object reads: `Transport.handle(Request)` sends a
GET or HEAD (plain, ranged, conditional, of a version, of a part, with an SSE-C key) on one
persistent pool of keep-alive connections (http1.py), signed once per request (sigv4.py) with
the credentials botocore's chain gives (refreshed as botocore refreshes them), retried as
botocore's standard mode retries, and its failure turned into the store's typed error
(errors.py). Above the seam the store speaks of keys and versions; below it, bytes.

HTTPX's `AsyncBaseTransport.handle_async_request` is the model: a strict cut between the
client's API and the network. aiobotocore's pipeline cost a cold miss ~1.3 ms of CPU of its
own (events, endpoint rules, retry bookkeeping, parsing into a dict), aiohttp's request
~0.25 ms more; here a GET is a few lines written to a pooled connection.

Listings of objects (ListObjectsV2) go through it too (`listing`, read by listings.py): a
page of 1,000 keys parsed by botocore cost ~85 ms of the event loop. Writes, multipart
uploads, tags and versioning settings stay on aiobotocore (client.py); the object's URL is
botocore's too, read once from a presigned URL.
"""

from __future__ import annotations

import asyncio
import html
import random
import re
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeAlias
from urllib.parse import urlsplit

from botocore.credentials import ReadOnlyCredentials
from botocore.utils import percent_encode

from gateway.stores.base import ObjectNotFound, StoreError, StoreMissing, StoreUnavailable
from gateway.stores.s3.errors import RETRIED_STATUS, error_of, unreachable
from gateway.stores.s3.fields import answer_fields
from gateway.stores.s3.http1 import FAILURES, Pool, ProtocolError, Response
from gateway.stores.s3.sigv4 import Signer, canonical_query

# Large enough that per-chunk overhead vanishes, small enough to start streaming early.
CHUNK_SIZE = 512 * 1024

_ERROR_BODY_MAX = 64 << 10
_MAX_BACKOFF = 20.0  # seconds, as botocore's standard retry mode

# The mount's static keys, or a call for the chain's (botocore's, refreshed as it refreshes).
Credentials: TypeAlias = ReadOnlyCredentials | Callable[[], Awaitable[ReadOnlyCredentials]]


@dataclass(frozen=True, slots=True)
class Request:
    """A read of one object of the store (`key`, under the store's prefix): GET or HEAD, with
    the query (versionId, partNumber) and headers (Range, If-Match, SSE-C) it is sent with."""

    method: str
    key: str
    query: tuple[tuple[str, str], ...] = ()
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def version_id(self) -> str | None:
        for name, value in self.query:
            if name == "versionId":
                return value
        return None


@dataclass(frozen=True, slots=True)
class Reply:
    """A 200 or 206: the answer's fields in botocore's names (fields.answer_fields), and its
    body (none to a HEAD) whose failures are StoreUnavailable; its connection is pooled again
    once the body is read to its end, closed if it is closed before."""

    fields: dict[str, Any]
    body: AsyncGenerator[bytes, None]


class Transport:
    """Reads of one bucket's objects. `base` is everything of an object's URL before its
    percent-encoded full key (scheme, host, and the bucket for path-style addressing)."""

    def __init__(
        self,
        base: str,
        region: str,
        credentials: Credentials,
        *,
        bucket: str,
        prefix: str,
        connect_timeout: float,
        read_timeout: float,
        max_attempts: int,
        connections: int = 64,
    ) -> None:
        self.base = base
        self.bucket, self.prefix = bucket, prefix
        self._path = urlsplit(base).path  # the bucket's part, path-style
        self.signer = Signer(region, base)
        self._host = (("Host", self.signer.host),)
        self._static = credentials if isinstance(credentials, ReadOnlyCredentials) else None
        self._refreshed = None if isinstance(credentials, ReadOnlyCredentials) else credentials
        self._attempts = max(1, max_attempts)
        self._pool = Pool(base, connect_timeout, read_timeout, connections)
        self._bucket_seen = False

    async def handle(self, request: Request) -> Reply:
        """The answer to `request`, or the store's typed error for its failure."""
        key = request.key
        where = f"s3://{self.bucket}/{self.prefix}{key}"
        # As signed: the key's escapes, "." and ".." segments are ordinary characters of it.
        path = self._path + percent_encode(self.prefix + key, safe="/~")
        response = await self._exchange(request.method, path, request, where)
        status = response.status
        if status in (200, 206):
            try:
                fields = answer_fields(response.headers)
            except (KeyError, ValueError, TypeError) as exc:
                response.close()
                raise StoreError(f"{where}: an answer without a valid {exc}") from None
            if request.method == "HEAD":
                response.release()
                return Reply(fields, _no_body())
            return Reply(fields, _body(response, where, self.base))
        code = await _error_code(response)
        headers = {k.lower(): v for k, v in response.headers}
        version_id = request.version_id
        error = error_of(self.bucket, where, key, status, code, headers, version_id)
        if request.method == "HEAD" and type(error) is ObjectNotFound and version_id is None:
            error = await self._head_missing(key, where)
        raise error

    async def listing(self, query: tuple[tuple[str, str], ...]) -> bytes:
        """The body of a ListObjectsV2 answer to `query` (listings.list_query's), or the
        store's typed error (ValueError for a continuation token the origin did not give)."""
        where = f"s3://{self.bucket}/{self.prefix}"
        path = self._path.rstrip("/") or "/"
        response = await self._exchange("GET", path, Request("GET", "", query), where)
        if response.status == 200:
            try:
                return await response.read()
            except FAILURES as exc:
                raise unreachable(where, exc, self.base) from None
            finally:
                response.release()
        code = await _error_code(response)
        if response.status == 400 and any(n == "continuation-token" for n, _ in query):
            raise ValueError("malformed continuation token")  # S3: 400 InvalidArgument
        headers = {k.lower(): v for k, v in response.headers}
        raise error_of(self.bucket, where, "", response.status, code, headers)

    async def _exchange(self, method: str, path: str, request: Request, where: str) -> Response:
        """The answer's head (any status but one worth asking again while attempts are left)."""
        query = canonical_query(request.query) if request.query else ""
        target = f"{path}?{query}" if query else path
        headers = dict(request.headers)
        signer = self.signer
        attempt = 1
        while True:
            credentials = self._static
            if credentials is None:
                assert self._refreshed is not None
                credentials = await self._refreshed()
            signed = signer.sign(credentials, method, path, query, headers, signer.timestamp())
            try:
                response = await self._pool.request(method, target, (*self._host, *signed.items()))
            except ProtocolError as exc:
                # Not asked again: the origin would answer the same way.
                raise StoreUnavailable(f"{where}: an answer not read (http1.py): {exc}") from None
            except FAILURES as exc:
                if attempt >= self._attempts:
                    raise unreachable(where, exc, self.base) from None
            else:
                if response.status not in RETRIED_STATUS or attempt >= self._attempts:
                    return response
                await _error_code(response)  # read, so that its connection is pooled again
            await asyncio.sleep(min(_MAX_BACKOFF, random.random() * 2 ** (attempt - 1)))
            attempt += 1

    async def _head_missing(self, key: str, where: str) -> StoreError:
        """A HEAD 404 has no body to tell a missing key from a missing bucket; ask once."""
        if not self._bucket_seen:
            path = self._path.rstrip("/") or "/"
            response = await self._exchange("HEAD", path, Request("HEAD", ""), where)
            response.release()
            if response.status == 404:
                return StoreMissing(f"origin bucket {self.bucket!r} does not exist")
            # Else (403: no s3:ListBucket) we cannot learn more, and will not ask again.
            self._bucket_seen = True
        return ObjectNotFound(key)

    async def close(self) -> None:
        await self._pool.close()


async def _error_code(response: Response) -> str:
    """The code of an error answer's XML body; the status for one without (a HEAD's)."""
    try:
        body = await response.read(_ERROR_BODY_MAX)
    except FAILURES:
        body = b""  # the status alone says what happened
    finally:
        response.release()
    found = re.search(rb"<Code>([^<]*)</Code>", body)
    if found is None:
        return str(response.status)
    return html.unescape(found.group(1).decode("utf-8", "replace"))


async def _body(response: Response, where: str, base: str) -> AsyncGenerator[bytes, None]:
    try:
        async for chunk in response.chunks(CHUNK_SIZE):
            yield chunk
    except FAILURES as exc:
        raise unreachable(where, exc, base) from None
    finally:
        response.release()


async def _no_body() -> AsyncGenerator[bytes, None]:
    return
    yield
