"""Credentials of the GCS store: a service-account key (OAuth2 JWT bearer grant, RS256), a
given access token, or none (emulators), as the Authorization header of each request."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import anyio.to_thread
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from gateway.stores.base import StoreAccessDenied, StoreUnavailable
from gateway.stores.gcs.resources import json_object
from gateway.stores.retry import SYSTEM_CLOCK, Clock

# Objects and buckets, not IAM policies: the narrowest scope that can create buckets too.
SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
DEFAULT_TOKEN_URI = "https://oauth2.googleapis.com/token"
GRANT_TYPE = "urn:ietf:params:oauth:grant-type:jwt-bearer"
ASSERTION_LIFETIME = 3600
# A token is replaced this long before it expires (or at half its life, if that is shorter),
# so that no request is sent with a token that expires on the way.
REFRESH_MARGIN = 300.0


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


@dataclass(frozen=True, slots=True)
class ServiceAccountKey:
    """The parts of a service-account JSON key that the JWT bearer grant needs."""

    client_email: str
    private_key: rsa.RSAPrivateKey
    private_key_id: str | None
    token_uri: str

    @classmethod
    def parse(cls, text: str) -> ServiceAccountKey:
        """ValueError for anything but an RSA service-account key; messages hold no key bytes."""
        try:
            info = json.loads(text)
        except ValueError:
            raise ValueError("GCS credentials are not JSON") from None
        if not isinstance(info, dict) or info.get("type") != "service_account":
            raise ValueError("GCS credentials must be a service-account key (type service_account)")
        email, pem = info.get("client_email"), info.get("private_key")
        if not isinstance(email, str) or not isinstance(pem, str):
            raise ValueError("GCS service-account key lacks client_email or private_key")
        try:
            key = serialization.load_pem_private_key(pem.encode(), password=None)
        except (ValueError, TypeError):
            raise ValueError("GCS service-account private_key is not a PEM private key") from None
        if not isinstance(key, rsa.RSAPrivateKey):
            raise ValueError("GCS service-account private_key is not an RSA key")
        token_uri = info.get("token_uri") or DEFAULT_TOKEN_URI
        key_id = info.get("private_key_id")
        return cls(email, key, key_id if isinstance(key_id, str) else None, str(token_uri))

    def assertion(self, now: float) -> str:
        """A signed JWT asking token_uri for an access token (RFC 7523)."""
        header: dict[str, Any] = {"alg": "RS256", "typ": "JWT"}
        if self.private_key_id:
            header["kid"] = self.private_key_id
        claims = {
            "iss": self.client_email,
            "scope": SCOPE,
            "aud": self.token_uri,
            "iat": int(now),
            "exp": int(now) + ASSERTION_LIFETIME,
        }
        signing_input = ".".join(
            _b64url(json.dumps(part, separators=(",", ":")).encode()) for part in (header, claims)
        )
        signature = self.private_key.sign(
            signing_input.encode("ascii"), padding.PKCS1v15(), hashes.SHA256()
        )
        return f"{signing_input}.{_b64url(signature)}"


class Credentials:
    """What each request carries; `headers` is awaited once per attempt."""

    async def headers(self, session: aiohttp.ClientSession) -> dict[str, str]:
        return {}

    def invalidate(self) -> bool:
        """Forget a token the store refused (401); True if a new one may be fetched."""
        return False


class StaticToken(Credentials):
    def __init__(self, token: str) -> None:
        self._header = {"Authorization": f"Bearer {token}"}

    async def headers(self, session: aiohttp.ClientSession) -> dict[str, str]:
        return self._header


class ServiceAccount(Credentials):
    """Access tokens from a service-account key, cached until shortly before they expire."""

    def __init__(
        self,
        key: ServiceAccountKey | None = None,
        path: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._key = key
        self._path = path  # read on first use: opening a store does no I/O
        self._clock = clock
        self._token: str | None = None
        self._refresh_at = 0.0  # on the clock's monotonic time
        self._lock = asyncio.Lock()
        self.fetches = 0  # token requests made, for tests and logs

    async def headers(self, session: aiohttp.ClientSession) -> dict[str, str]:
        if self._token is None or self._clock.monotonic() >= self._refresh_at:
            async with self._lock:  # one fetch, however many requests wait for it
                if self._token is None or self._clock.monotonic() >= self._refresh_at:
                    await self._fetch(session)
        return {"Authorization": f"Bearer {self._token}"}

    def invalidate(self) -> bool:
        self._token = None
        return True

    async def _load(self) -> ServiceAccountKey:
        if self._key is None:
            assert self._path is not None
            try:
                text = await anyio.to_thread.run_sync(Path(self._path).read_text)
            except OSError as exc:
                raise StoreAccessDenied(f"GCS credentials file unreadable: {exc}") from None
            try:
                self._key = ServiceAccountKey.parse(text)
            except ValueError as exc:
                raise StoreAccessDenied(f"{self._path}: {exc}") from None
        return self._key

    async def _fetch(self, session: aiohttp.ClientSession) -> None:
        key = await self._load()
        now = time.time()  # the assertion's claims are wall-clock times
        asked = self._clock.monotonic()
        form = {"grant_type": GRANT_TYPE, "assertion": key.assertion(now)}
        self.fetches += 1
        try:
            async with session.post(key.token_uri, data=form, allow_redirects=False) as r:
                body = await r.read()
                status = r.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise StoreUnavailable(
                f"GCS token endpoint unreachable: {type(exc).__name__}"
            ) from None
        if status >= 500 or status == 429:
            raise StoreUnavailable(f"GCS token endpoint answered {status}")
        reply = json_object(body)
        token, lifetime = reply.get("access_token"), reply.get("expires_in", 3600)
        if status != 200 or not isinstance(token, str):
            # The OAuth2 error code names the problem (invalid_grant: a revoked key, a clock
            # off by minutes); the description may quote the assertion, so it is left out.
            raise StoreAccessDenied(f"GCS token refused ({status}): {reply.get('error', '?')}")
        lifetime = float(lifetime) if isinstance(lifetime, (int, float, str)) else 3600.0
        self._token = token
        self._refresh_at = asked + lifetime - min(REFRESH_MARGIN, lifetime / 2)


def credentials_from(options: Mapping[str, str], clock: Clock = SYSTEM_CLOCK) -> Credentials:
    """The credentials a mount's options name; ValueError for conflicting or malformed ones.
    `clock` times the renewal of tokens."""
    given = [n for n in ("credentials_file", "credentials_json", "access_token") if options.get(n)]
    if len(given) > 1:
        raise ValueError(f"gcs store options {' and '.join(given)} exclude each other")
    if options.get("access_token"):
        return StaticToken(options["access_token"])
    if options.get("credentials_json"):
        return ServiceAccount(ServiceAccountKey.parse(options["credentials_json"]), clock=clock)
    if options.get("credentials_file"):
        return ServiceAccount(path=options["credentials_file"], clock=clock)
    return Credentials()
