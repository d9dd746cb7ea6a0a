"""What goes over the wire to GCS's JSON API for one bucket: requests with the store's
credentials, sent over aiohttp and retried with backoff, and answers that are not the one
wanted made typed store errors."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
from yarl import URL

from gateway.stores.base import (
    ObjectNotFound,
    PreconditionFailed,
    StoreAccessDenied,
    StoreError,
    StoreRejected,
    StoreUnavailable,
    UnsupportedKey,
    VersionChanged,
)
from gateway.stores.gcs.auth import Credentials
from gateway.stores.gcs.resources import HIDDEN, check_name, json_object
from gateway.stores.retry import SYSTEM_CLOCK, Backoff, Clock

# Backoff with full jitter: a random pause up to a cap that doubles with each attempt.
BASE_DELAY = 0.1
MAX_DELAY = 5.0
# What a broken connection raises, on the way out or while an answer is read.
TRANSPORT = (aiohttp.ClientError, TimeoutError, OSError)


def _transient(status: int) -> bool:
    return status >= 500 or status in (408, 429)


@dataclass(frozen=True, slots=True)
class Settings:
    """How long and how often to try (the store's options give the values)."""

    max_attempts: int
    retry_deadline: float  # seconds from the first try after which no retry starts
    connect_timeout: float
    read_timeout: float


@dataclass(frozen=True, slots=True)
class Reply:
    """A finished exchange: status, JSON body (empty if none), headers."""

    status: int
    body: dict[str, Any]
    headers: Mapping[str, str]


class Client:
    """The objects under `prefix` in one bucket at one endpoint (GCS or an emulator): names,
    requests, retries, and the store error for each answer."""

    def __init__(
        self,
        bucket: str,
        prefix: str,
        endpoint: str,
        credentials: Credentials,
        settings: Settings,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix  # "" or a folder: "pre/fix/"
        self.endpoint = endpoint
        self.settings = settings
        self.clock = clock
        self._credentials = credentials
        self._timeout = aiohttp.ClientTimeout(
            sock_connect=settings.connect_timeout, sock_read=settings.read_timeout
        )
        self._session: aiohttp.ClientSession | None = None
        self._bucket_seen = False

    def __repr__(self) -> str:
        return f"gs://{self.bucket}/{self.prefix} at {self.endpoint}"

    # -- names -------------------------------------------------------------------------------

    def bucket_url(self) -> str:
        return f"{self.endpoint}/storage/v1/b/{self.bucket}"

    def object_url(self, name: str) -> str:
        """The resource URL of a full object name (prefix included)."""
        return f"{self.bucket_url()}/o/{quote(name, safe='')}"

    def readable(self, key: str) -> str:
        """The object name of a key that may be read; ObjectNotFound for the hidden folder."""
        if not key or key.startswith(HIDDEN):
            raise ObjectNotFound(key)
        check_name(self.prefix + key)
        return self.prefix + key

    def writable(self, key: str) -> str:
        """The object name of a key that may be written; UnsupportedKey if none can be."""
        if not key:
            raise UnsupportedKey("an object needs a non-empty key")
        if key.startswith(HIDDEN):
            raise UnsupportedKey(f"{key!r}: {HIDDEN} holds the store's unfinished uploads")
        if "\r" in key or "\n" in key:
            raise UnsupportedKey(f"{key!r}: GCS object names hold no CR or LF")
        check_name(self.prefix + key)
        return self.prefix + key

    # -- HTTP --------------------------------------------------------------------------------

    def backoff(self) -> Backoff:
        """The pauses of one call's attempts; each call has its own."""
        s = self.settings
        return Backoff(
            s.max_attempts, s.retry_deadline, base=BASE_DELAY, cap=MAX_DELAY, clock=self.clock
        )

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

    async def send(
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
        backoff = self.backoff()
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
            except TRANSPORT as exc:
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
            if not retry or not await backoff.pause():
                raise StoreUnavailable(why)

    async def reply(self, response: aiohttp.ClientResponse) -> Reply:
        """The whole answer, its connection released."""
        try:
            body = await response.read()
        except TRANSPORT as exc:
            raise StoreUnavailable(f"gs://{self.bucket}: {type(exc).__name__}: {exc}") from None
        finally:
            response.release()
        return Reply(response.status, json_object(body), response.headers)

    async def call(
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
        """`send`, then the whole answer."""
        response = await self.send(
            method, url, query, headers=headers, data=data, json_body=json_body, retry=retry
        )
        return await self.reply(response)

    # -- errors ------------------------------------------------------------------------------

    def fail(self, reply: Reply, key: str, *, write: bool = False) -> StoreError:
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
        if 400 <= status < 500:
            return StoreRejected(f"{where}: GCS answered {status} {message}")
        return StoreError(f"{where}: GCS answered {status} {message}")

    async def missing(self, key: str) -> StoreError:
        """A 404 does not say whether the key or the bucket is missing; ask once."""
        if not self._bucket_seen:
            reply = await self.call("GET", self.bucket_url())
            if reply.status == 404:
                return StoreUnavailable(f"origin bucket {self.bucket!r} does not exist")
            # Else (403: no storage.buckets.get) we cannot learn more, and will not ask again.
            self._bucket_seen = True
        return ObjectNotFound(key)

    # -- resources and listings --------------------------------------------------------------

    async def resource(self, key: str) -> dict[str, Any]:
        """The object resource of a key (ObjectNotFound if there is none)."""
        reply = await self.call("GET", self.object_url(self.readable(key)))
        if reply.status == 200:
            return reply.body
        if reply.status == 404:
            raise await self.missing(key)
        raise self.fail(reply, key)

    async def list_objects(self, query: Mapping[str, str]) -> dict[str, Any]:
        """One page of objects.list."""
        reply = await self.call("GET", f"{self.bucket_url()}/o", query)
        if reply.status == 404:
            raise StoreUnavailable(f"origin bucket {self.bucket!r} does not exist")
        if reply.status != 200:
            raise self.fail(reply, query.get("prefix", "")[len(self.prefix) :])
        return reply.body

    async def objects(self, folder: str) -> list[dict[str, Any]]:
        """Every object whose full name starts with `folder` (hidden ones too)."""
        found: list[dict[str, Any]] = []
        query = {"prefix": folder, "maxResults": "1000"}
        while True:
            page = await self.list_objects(query)
            found += page.get("items") or []
            if not page.get("nextPageToken"):
                return found
            query = {**query, "pageToken": page["nextPageToken"]}
