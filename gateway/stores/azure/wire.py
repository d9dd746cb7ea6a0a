"""What goes over the wire to Azure Blob Storage: requests authorized with Shared Key
(HMAC-SHA256 over Microsoft's canonical string, version 2009-09-19 and later), a SAS token or
nothing, retried over httpx."""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

import httpx
from defusedxml import ElementTree

from gateway.stores.base import StoreUnavailable
from gateway.stores.retry import SYSTEM_CLOCK, Backoff, Clock

log = logging.getLogger(__name__)

API_VERSION = "2025-01-05"
# Worth another try: throttling (429, 503 ServerBusy), timeouts and server faults.
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
BACKOFF_BASE = 0.1
BACKOFF_CAP = 4.0

# The headers whose values stand, in this order, between the verb and the x-ms- headers.
_STANDARD = (
    "content-encoding",
    "content-language",
    "content-length",
    "content-md5",
    "content-type",
    "date",
    "if-modified-since",
    "if-match",
    "if-none-match",
    "if-unmodified-since",
    "range",
)


def _header_order(name: str) -> tuple[str, str]:
    """Azure sorts x-ms- header names with a culture-aware comparison, not by bytes: '-' is
    ignored and '_' comes before digits. Names here are lowercase ASCII letters, digits, '-'
    and '_' (metadata names are kept to that), for which this key gives the same order."""
    return name.replace("-", "").replace("_", "!"), name


def string_to_sign(
    method: str, account: str, path: str, query: str, headers: Mapping[str, str]
) -> str:
    """Microsoft's "Shared Key for Blob" string: `path` as sent (percent-encoded, with the
    account segment for path-style endpoints), `query` as sent, `headers` lowercase."""
    standard = [headers.get(name, "") for name in _STANDARD]
    if standard[2] == "0":
        standard[2] = ""  # since version 2015-02-21 a zero Content-Length signs as empty
    ms = sorted((n for n in headers if n.startswith("x-ms-")), key=_header_order)
    # Header values are unfolded: runs of whitespace become one space.
    canonical_headers = "".join(f"{n}:{' '.join(headers[n].split())}\n" for n in ms)
    params: dict[str, list[str]] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        params.setdefault(name.lower(), []).append(value)
    resource = f"/{account}{path}" + "".join(
        f"\n{name}:{','.join(sorted(values))}" for name, values in sorted(params.items())
    )
    return "\n".join([method.upper(), *standard, canonical_headers + resource])


class SharedKey:
    """Signs requests with the account key; the key never appears in messages or reprs."""

    def __init__(self, account: str, key: str) -> None:
        try:
            self._key = base64.b64decode(key, validate=True)
        except ValueError:
            raise ValueError("azure account_key must be the base64 key of the account") from None
        self.account = account

    def __repr__(self) -> str:
        return f"SharedKey({self.account})"

    def authorization(self, method: str, path: str, query: str, headers: Mapping[str, str]) -> str:
        text = string_to_sign(method, self.account, path, query, headers)
        digest = hmac.new(self._key, text.encode("utf-8"), hashlib.sha256).digest()
        return f"SharedKey {self.account}:{base64.b64encode(digest).decode()}"


class AzureError(Exception):
    """An answer of the service that is not a success; the store maps it to a StoreError."""

    def __init__(self, status: int, code: str, where: str) -> None:
        super().__init__(f"{where}: Azure answered {status} {code}")
        self.status = status
        self.code = code


@dataclass(frozen=True, slots=True)
class Settings:
    max_attempts: int = 4
    connect_timeout: float = 5.0
    read_timeout: float = 30.0
    retry_deadline: float = 20.0  # seconds from the first try after which no retry starts


def _replayable(content: Any) -> bool:
    """Can this body be sent again? Bytes can; streamed bodies rewind only while they kept
    everything they sent (their seek(0) says so, as botocore asks them)."""
    if content is None or isinstance(content, bytes):
        return True
    try:
        content.seek(0)
    except (io.UnsupportedOperation, AttributeError):
        return False
    return True


def error_code(response: httpx.Response) -> str:
    """x-ms-error-code, which HEAD answers carry too; else the XML body's <Code>."""
    code = response.headers.get("x-ms-error-code")
    if code:
        return code
    try:
        found = ElementTree.fromstring(response.content).findtext("Code")
    except (ElementTree.ParseError, httpx.ResponseNotRead, ValueError):
        found = None
    return found or str(response.status_code)


class Transport:
    """One account endpoint: builds, signs and sends requests, retrying what may be retried
    with exponential backoff and full jitter until `retry_deadline` has passed."""

    def __init__(
        self,
        endpoint: str,
        account: str,
        settings: Settings,
        key: str | None = None,
        sas_token: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.query:
            raise ValueError(
                f"azure endpoint must be http(s)://host[:port][/path], not {endpoint!r}"
            )
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.root = parts.path.rstrip("/")  # "/account" on path-style endpoints (Azurite)
        self.account = account
        self.settings = settings
        self.clock = clock
        self._signer = SharedKey(account, key) if key else None
        self.sas = (sas_token or "").lstrip("?")
        self._client: httpx.AsyncClient | None = None

    def url(self, path: str) -> str:
        """The full URL of an (encoded) path, as another request may name it (x-ms-copy-source)."""
        return self.origin + self.root + path + (f"?{self.sas}" if self.sas else "")

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            s = self.settings
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(s.read_timeout, connect=s.connect_timeout),
                limits=httpx.Limits(max_connections=64, max_keepalive_connections=32),
            )
        return self._client

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def _build(
        self,
        method: str,
        path: str,
        query: Sequence[tuple[str, str]],
        headers: Mapping[str, str],
        content: Any,
        timeout: float,
    ) -> httpx.Request:
        qs = "&".join(f"{k}={quote(v, safe='')}" for k, v in query)
        h = {k.lower(): v for k, v in headers.items()}
        h |= {"x-ms-date": formatdate(usegmt=True), "x-ms-version": API_VERSION}
        # Bytes as stored: a blob kept gzip-encoded must not be decoded on the way.
        h.setdefault("accept-encoding", "identity")
        if self._signer is not None:
            h["authorization"] = self._signer.authorization(method, self.root + path, qs, h)
        if self.sas:
            qs = f"{qs}&{self.sas}" if qs else self.sas
        url = self.origin + self.root + path + (f"?{qs}" if qs else "")
        limit = httpx.Timeout(timeout, connect=min(timeout, self.settings.connect_timeout))
        return self._http().build_request(method, url, headers=h, content=content, timeout=limit)

    async def send(
        self,
        method: str,
        path: str,
        query: Sequence[tuple[str, str]] = (),
        headers: Mapping[str, str] | None = None,
        content: Any = None,
        *,
        stream: bool = False,
    ) -> httpx.Response:
        """The first success (2xx) answer; AzureError for any other final answer,
        StoreUnavailable when the service could not be reached in time. A streamed answer
        must be closed by the caller. Exceptions of a body's own iterator propagate."""
        s = self.settings
        backoff = Backoff(
            s.max_attempts, s.retry_deadline, base=BACKOFF_BASE, cap=BACKOFF_CAP, clock=self.clock
        )
        attempt = 0
        while True:
            attempt += 1
            # No try outlives the deadline, the first one neither.
            timeout = min(s.read_timeout, max(backoff.remaining(), 0.5))
            request = self._build(method, path, query, headers or {}, content, timeout)
            refused: AzureError | None = None
            try:
                response = await self._http().send(request, stream=stream)
            except httpx.TransportError as exc:
                failure = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code < 300:
                    return response
                if stream:
                    await response.aread()  # the error document, then the connection is free
                    await response.aclose()
                refused = AzureError(response.status_code, error_code(response), path)
                if response.status_code not in RETRY_STATUS:
                    raise refused
                failure = str(refused)
            pause = backoff.next_pause() if _replayable(content) else None
            if pause is None:
                if refused is not None:
                    raise refused  # 5xx, 429: the store makes it StoreUnavailable
                raise StoreUnavailable(f"{self.origin}: no answer after {attempt} tries: {failure}")
            log.info("azure %s %s: %s; retry %d in %.2fs", method, path, failure, attempt, pause)
            await self.clock.sleep(pause)
