"""The `gs://bucket[/prefix]` under-store: Google Cloud Storage through its JSON API, in
hand-written aiohttp calls: retries with backoff, ranged media reads, listings in S3's order."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any
from urllib.parse import SplitResult, quote, unquote, urlencode, urlsplit

import aiohttp
from yarl import URL

from gateway.stores.base import (
    ObjectInfo,
    ObjectNotFound,
    PreconditionFailed,
    StoreAccessDenied,
    StoreError,
    StoreUnavailable,
    VersionChanged,
)
from gateway.stores.gcs_auth import credentials_from
from gateway.stores.gcs_list import GcsListing
from gateway.stores.gcs_multipart import GcsMultipart
from gateway.stores.gcs_wire import HIDDEN, bare, etag_of, object_info
from gateway.stores.gcs_write import Reply

# Large enough that per-chunk overhead vanishes, small enough to start streaming early.
CHUNK_SIZE = 512 * 1024
DEFAULT_ENDPOINT = "https://storage.googleapis.com"
OPTIONS = frozenset(
    {
        "endpoint",
        "project",
        "credentials_file",
        "credentials_json",
        "access_token",
        "max_attempts",
        "connect_timeout",
        "read_timeout",
        "retry_deadline",
    }
)
# Backoff with full jitter: a random sleep up to a cap that doubles with each attempt.
BASE_DELAY = 0.1
MAX_DELAY = 5.0
_TRANSPORT = (aiohttp.ClientError, TimeoutError, OSError)


def _transient(status: int) -> bool:
    return status >= 500 or status in (408, 429)


def _decode(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body) if body else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class Backoff:
    """Pauses between attempts of one call, bounded by a count and a deadline."""

    def __init__(self, attempts: int, deadline: float) -> None:
        self._left = attempts - 1
        self._until = time.monotonic() + deadline
        self._step = 0

    async def pause(self, why: str) -> None:
        delay = random.uniform(0, min(MAX_DELAY, BASE_DELAY * 2**self._step))
        if self._left <= 0 or time.monotonic() + delay > self._until:
            raise StoreUnavailable(why)
        self._left -= 1
        self._step += 1
        await asyncio.sleep(delay)


class GcsStore(GcsMultipart, GcsListing):
    """Objects under `prefix` in one GCS bucket (or an emulator's, at the `endpoint` option).

    A mount prefix names a folder: 'gs://b/pre/fix' holds 'pre/fix/<key>', never 'pre/fixture'.
    """

    scheme = "gs"

    def __init__(self, bucket: str, prefix: str = "", options: Mapping[str, str] | None = None):
        options = dict(options or {})
        unknown = set(options) - OPTIONS
        if unknown:
            raise ValueError(f"unknown gcs store options: {', '.join(sorted(unknown))}")
        self.bucket = bucket
        prefix = prefix.strip("/")
        self.prefix = f"{prefix}/" if prefix else ""
        self.endpoint = _endpoint(options.get("endpoint") or DEFAULT_ENDPOINT)
        self.project = options.get("project") or None
        self._credentials = credentials_from(options)
        self._attempts = int(_positive(options, "max_attempts", 5))
        self._deadline = _positive(options, "retry_deadline", 30)
        self._timeout = aiohttp.ClientTimeout(
            sock_connect=_positive(options, "connect_timeout", 5),
            sock_read=_positive(options, "read_timeout", 30),
        )
        self._session: aiohttp.ClientSession | None = None
        self._bucket_seen = False

    def __repr__(self) -> str:
        return f"GcsStore(gs://{self.bucket}/{self.prefix} at {self.endpoint})"

    def _o(self, name: str) -> str:
        return f"{self.endpoint}/storage/v1/b/{self.bucket}/o/{quote(name, safe='')}"

    def _backoff(self) -> Backoff:
        return Backoff(self._attempts, self._deadline)

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout, connector=aiohttp.TCPConnector(limit=64)
            )
        return self._session

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    # -- HTTP --------------------------------------------------------------------------------

    async def _send(
        self,
        method: str,
        url: str,
        query: Mapping[str, str] | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        data: Callable[[], Any] | None = None,
        json_body: Any = None,
        retry: bool = True,
        raw: bool = False,
    ) -> aiohttp.ClientResponse:
        """The answer to the first attempt that is no server error; the caller releases it.
        5xx, 408, 429 and broken connections are tried again while attempts and the deadline
        last, then StoreUnavailable. `data` makes the body anew for each attempt."""
        session = self._http()
        target = URL(f"{url}?{urlencode(query, quote_via=quote)}" if query else url, encoded=True)
        headers = dict(headers or {})
        # aiohttp would label a streamed body application/octet-stream, and an emulator
        # takes the label of an upload's chunk for the object's Content-Type.
        skip = ("Content-Type",) if data is not None and "Content-Type" not in headers else ()
        backoff = self._backoff()
        renewed = False
        while True:
            try:
                auth = await self._credentials.headers(session)
                response = await session.request(
                    method,
                    target,
                    headers={**headers, **auth},
                    data=data() if data is not None else None,
                    json=json_body,
                    skip_auto_headers=skip,
                    allow_redirects=False,  # a resumable session answers 308, not a redirect
                    auto_decompress=not raw,  # media is the stored bytes, gzip or not
                )
            except StoreUnavailable as exc:  # the token endpoint's
                why = str(exc)
            except _TRANSPORT as exc:
                why = f"gs://{self.bucket}: {method} failed: {type(exc).__name__}: {exc}"
            else:
                if response.status == 401 and not renewed and self._credentials.invalidate():
                    renewed = True  # an expired or revoked token: one more try with a new one
                    response.release()
                    continue
                if not _transient(response.status):
                    return response
                why = f"gs://{self.bucket}: {method} answered {response.status}"
                response.release()
            if not retry:
                raise StoreUnavailable(why)
            await backoff.pause(why)

    async def _call(
        self,
        method: str,
        url: str,
        query: Mapping[str, str] | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        data: Callable[[], Any] | None = None,
        json_body: Any = None,
        retry: bool = True,
    ) -> Reply:
        response = await self._send(
            method, url, query, headers=headers, data=data, json_body=json_body, retry=retry
        )
        try:
            body = await response.read()
        except _TRANSPORT as exc:
            raise StoreUnavailable(f"gs://{self.bucket}: {type(exc).__name__}: {exc}") from None
        finally:
            response.release()
        return Reply(response.status, _decode(body), response.headers)

    def _fail(self, reply: Reply, key: str, *, write: bool = False) -> StoreError:
        """Our typed error for an answer that is not the one wanted (no secrets in it)."""
        where = f"gs://{self.bucket}/{self.prefix}{key}"
        error = reply.body.get("error")
        message = str(error.get("message", "")) if isinstance(error, dict) else ""
        status = reply.status
        if status in (401, 403):
            return StoreAccessDenied(f"{where}: {status} {message}")
        if status == 412:
            return (PreconditionFailed if write else VersionChanged)(f"{where}: {message}")
        if status == 404:
            return ObjectNotFound(key)
        if _transient(status):
            return StoreUnavailable(f"{where}: GCS answered {status} {message}")
        return StoreError(f"{where}: GCS answered {status} {message}")

    async def _missing(self, key: str) -> StoreError:
        """A 404 does not say whether the key or the bucket is missing; ask once."""
        if not self._bucket_seen:
            reply = await self._call("GET", f"{self.endpoint}/storage/v1/b/{self.bucket}")
            if reply.status == 404:
                return StoreUnavailable(f"origin bucket {self.bucket!r} does not exist")
            # Else (403: no storage.buckets.get) we cannot learn more, and will not ask again.
            self._bucket_seen = True
        return ObjectNotFound(key)

    # -- reads -------------------------------------------------------------------------------

    async def _resource(self, key: str) -> dict[str, Any]:
        if not key or key.startswith(HIDDEN):
            raise ObjectNotFound(key)
        reply = await self._call("GET", self._o(self.prefix + key))
        if reply.status == 200:
            return reply.body
        if reply.status == 404:
            raise await self._missing(key)
        raise self._fail(reply, key)

    async def stat(self, key: str) -> ObjectInfo:
        return object_info(key, await self._resource(key))

    async def read(
        self, key: str, start: int = 0, end: int | None = None, if_match: str | None = None
    ) -> AsyncGenerator[bytes, None]:
        query = {"alt": "media"}
        if if_match is not None:
            # GCS ETags are not our ETags: the version is found by one, then read by the other.
            current = await self._resource(key)
            if bare(etag_of(current)) != bare(if_match):
                raise VersionChanged(f"{key}: is {etag_of(current)}, not {if_match}")
            # fake-gcs-server honours `generation`, GCS both.
            query["generation"] = query["ifGenerationMatch"] = str(current["generation"])
        if end is not None and end <= start:
            if if_match is None:  # no bytes, but a missing key must still be reported
                await self._resource(key)
            return
        if not key or key.startswith(HIDDEN):
            raise ObjectNotFound(key)
        headers = {"Accept-Encoding": "gzip"}  # never transcoded: the bytes as stored
        # No Range for the whole object: GCS answers 416 to any range of an empty one.
        if start > 0 or end is not None:
            headers["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        url = self._o(self.prefix + key)
        response = await self._send("GET", url, query, headers=headers, raw=True)
        try:
            if response.status == 416:
                return  # the range starts at or past the end: [start, end) is empty
            if response.status not in (200, 206):
                reply = Reply(response.status, _decode(await response.read()), response.headers)
                if reply.status == 404 and if_match is not None:
                    await self._resource(key)  # ObjectNotFound if it is gone altogether
                    raise VersionChanged(f"{key}: generation {query['generation']} is gone")
                raise await self._missing(key) if reply.status == 404 else self._fail(reply, key)
            # A server that ignored the Range sends all of it: cut [start, end) out ourselves.
            skip = start if response.status == 200 else 0
            left = None if end is None else end - start
            async for chunk in response.content.iter_chunked(CHUNK_SIZE):
                if skip:
                    chunk, skip = chunk[skip:], max(0, skip - len(chunk))
                if left is not None:
                    chunk, left = chunk[:left], max(0, left - len(chunk))
                if chunk:
                    yield chunk
                if left == 0:
                    break
        except _TRANSPORT as exc:
            raise StoreUnavailable(f"gs://{self.bucket}/{self.prefix}{key}: {exc!r}") from None
        finally:
            # Pooled only when read to the end; else the connection is closed.
            response.release()

    # -- listings ----------------------------------------------------------------------------

    async def _list(self, query: Mapping[str, str]) -> dict[str, Any]:
        reply = await self._call("GET", f"{self.endpoint}/storage/v1/b/{self.bucket}/o", query)
        if reply.status == 404:
            raise StoreUnavailable(f"origin bucket {self.bucket!r} does not exist")
        if reply.status != 200:
            raise self._fail(reply, query.get("prefix", "")[len(self.prefix) :])
        return reply.body

    async def _objects(self, folder: str) -> list[dict[str, Any]]:
        """Every object whose full name starts with `folder` (hidden ones too)."""
        found: list[dict[str, Any]] = []
        query = {"prefix": folder, "maxResults": "1000"}
        while True:
            page = await self._list(query)
            found += page.get("items") or []
            if not page.get("nextPageToken"):
                return found
            query = {**query, "pageToken": page["nextPageToken"]}


def _positive(options: Mapping[str, str], name: str, default: float) -> float:
    raw = options.get(name)
    try:
        value = float(raw) if raw not in (None, "") else default
    except ValueError:
        raise ValueError(f"gcs store option {name} must be a number, not {raw!r}") from None
    if value <= 0:
        raise ValueError(f"gcs store option {name} must be positive")
    return value


def _endpoint(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query:
        raise ValueError(f"gcs store option endpoint must be http(s)://host[:port], not {url!r}")
    return url.rstrip("/")


def open_gcs(parts: SplitResult, options: Mapping[str, str]) -> GcsStore:
    """`gs://bucket[/prefix]`."""
    bucket = parts.netloc
    if not bucket or ":" in bucket or "/" in bucket:
        raise ValueError(f"gs URI {parts.geturl()!r} needs a bucket name: gs://bucket[/prefix]")
    return GcsStore(bucket, unquote(parts.path), options)
