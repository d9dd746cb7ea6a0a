"""The WebHDFS REST client of the hdfs:// store: NameNode calls, redirects to DataNodes, retries
with backoff within a deadline, and RemoteException answers turned into typed errors."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from gateway.stores.base import (
    ObjectNotFound,
    StoreAccessDenied,
    StoreError,
    StoreRejected,
    StoreUnavailable,
)
from gateway.stores.retry import SYSTEM_CLOCK, Backoff, Clock

BACKOFF_BASE, BACKOFF_CAP = 0.1, 2.0
# Thrown before the NameNode changes anything (safe mode, standby, observer): safe to resend.
_RETRIABLE = {"RetriableException", "StandbyException", "SafeModeException"}
_DENIED = {"AccessControlException", "SecurityException", "InvalidToken", "AuthorizationException"}


class RemoteFailure(Exception):
    """An error answer: its RemoteException's name and message, or the bare HTTP status."""

    def __init__(self, status: int, exception: str, message: str) -> None:
        super().__init__(f"{status} {exception}: {message}")
        self.status, self.exception, self.message = status, exception, message

    @classmethod
    def of(cls, response: httpx.Response) -> RemoteFailure:
        try:
            remote = json.loads(response.content)["RemoteException"]
            return cls(response.status_code, str(remote["exception"]), str(remote["message"]))
        except (ValueError, KeyError, TypeError):
            return cls(response.status_code, f"HTTP {response.status_code}", response.text[:200])

    def store_error(self, key: str, where: str) -> StoreError:
        """The store's error for this answer about `key`; `where` names store and key."""
        if self.exception == "FileNotFoundException":
            return ObjectNotFound(key)
        if self.exception in _DENIED or self.status == 401:
            return StoreAccessDenied(f"{where}: {self.exception}")
        if self.status >= 500:
            return StoreUnavailable(f"{where}: {self}")
        if 400 <= self.status < 500:
            return StoreRejected(f"{where}: {self}")
        return StoreError(f"{where}: {self}")


@dataclass(frozen=True, slots=True)
class Status:
    """What a FileStatus JSON object tells of one file or directory."""

    name: str
    is_file: bool
    is_dir: bool
    length: int
    mtime_ms: int
    file_id: int

    @classmethod
    def of(cls, doc: Mapping[str, Any]) -> Status:
        return cls(
            str(doc.get("pathSuffix", "")),
            doc.get("type") == "FILE",
            doc.get("type") == "DIRECTORY",
            int(doc.get("length", 0)),
            int(doc.get("modificationTime", 0)),
            int(doc.get("fileId", 0)),
        )

    @property
    def version(self) -> tuple[int, int, int]:
        return self.file_id, self.mtime_ms, self.length

    def synthetic_etag(self) -> str:
        # Never 32 bare hex digits (clients check those as an MD5); fileId changes whenever a
        # new file takes the name, mtime and length when one is appended to.
        return f'"{self.file_id:x}-{self.mtime_ms:x}-{self.length:x}"'


class WebHdfs:
    """The REST calls, retried with exponential backoff and full jitter within a deadline."""

    def __init__(self, base: str, options: Mapping[str, str], clock: Clock = SYSTEM_CLOCK) -> None:
        self.base = base
        self.clock = clock
        token, user = options.get("delegation_token"), options.get("user")
        # With a token the NameNode takes the user from it; user.name is for simple auth.
        self.auth = {"delegation": token} if token else {"user.name": user} if user else {}
        self.max_attempts = max(1, int(options.get("max_attempts", 5)))
        self.deadline = float(options.get("retry_deadline", 15))
        connect, read = (
            float(options.get("connect_timeout", 5)),
            float(options.get("read_timeout", 60)),
        )
        self.timeout = httpx.Timeout(read, connect=connect, pool=connect)
        self._client: httpx.AsyncClient | None = None

    def url(self, path: str) -> str:
        return f"{self.base}/webhdfs/v1{quote(path, safe='/')}"

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def send(
        self,
        method: str,
        url: str,
        params: Mapping[str, str] | None,
        *,
        idempotent: bool,
        stream: bool = False,
        content: AsyncIterator[bytes] | None = None,
        headers: Mapping[str, str] | None = None,
        once: bool = False,
    ) -> httpx.Response:
        """The first answer below 400; RemoteFailure for an error answer; StoreUnavailable when
        the server stays unreachable or failing. A body (`content`) is sent once, never again."""
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout, follow_redirects=False)
        # The CSRF filter (dfs.webhdfs.rest-csrf.enabled) wants this header on writes; its value
        # is not looked at, and servers without the filter ignore it.
        sent = {"X-XSRF-HEADER": "", **(headers or {})} if method != "GET" else headers
        backoff = Backoff(
            self.max_attempts,
            self.deadline,
            base=BACKOFF_BASE,
            cap=BACKOFF_CAP,
            trim=True,  # the last wait is cut short so that one more try fits the deadline
            clock=self.clock,
        )
        while True:
            request = self._client.build_request(
                method, url, params=params, content=content, headers=sent
            )
            try:
                response = await self._client.send(request, stream=stream)
            except httpx.TransportError as exc:
                failure = StoreUnavailable(f"WebHDFS {method} unreachable: {type(exc).__name__}")
                # A refused connection never reached the server: any operation may be resent.
                again = idempotent or isinstance(exc, httpx.ConnectError)
            else:
                if response.status_code < 400:
                    return response
                await response.aread()
                await response.aclose()
                remote = RemoteFailure.of(response)
                if response.status_code < 500 and remote.exception not in _RETRIABLE:
                    raise remote
                failure = StoreUnavailable(f"WebHDFS {method} answered {remote}")
                again = idempotent or response.status_code == 503 or remote.exception in _RETRIABLE
            if once or content is not None or not again or not await backoff.pause():
                raise failure

    async def call(
        self,
        method: str,
        path: str,
        op: str,
        *,
        idempotent: bool = True,
        once: bool = False,
        query: Mapping[str, str] | None = None,
        **params: str,
    ) -> Any:
        """A NameNode operation's JSON answer (None for an empty one); `once`: not retried."""
        every = {"op": op, **(query or {}), **params, **self.auth}
        response = await self.send(method, self.url(path), every, idempotent=idempotent, once=once)
        return json.loads(response.content) if response.content.strip() else None

    async def redirect(self, method: str, path: str, op: str, **params: str) -> str:
        """Step one of OPEN/CREATE: the DataNode URL the NameNode sends us to (never followed
        blindly: a write must not send its body before it knows where to)."""
        response = await self.send(
            method, self.url(path), {"op": op, **params, **self.auth}, idempotent=True
        )
        location = response.headers.get("Location")
        if response.status_code == 200 and not location:  # noredirect=true servers
            location = json.loads(response.content or b"{}").get("Location")
        if not location or not location.startswith(("http://", "https://")):
            raise StoreUnavailable(f"WebHDFS {op} gave no DataNode location")
        return str(location)
