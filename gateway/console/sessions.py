"""The console's sessions: a cookie the node signs (HMAC-SHA256 under a key derived from the
secrets' key, so every node of the fleet accepts it), holding the admin access key, a random
nonce and the expiry, all checked on every request; and the CSRF token each form carries,
an HMAC of the session's nonce.

A visitor without a session gets an anonymous one (no access key) on the login page, so that
the login form is CSRF-protected as every other form is; logging in issues a new session
(a new nonce), never an upgrade of the old one.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

COOKIE = "gateway_console"
SESSION_TTL = 12 * 3600.0  # seconds a login lasts
ANONYMOUS_TTL = 900.0  # seconds the login form's anonymous session lasts


@dataclass(frozen=True, slots=True)
class Session:
    """What the cookie says, once its signature and expiry are checked."""

    access_key: str  # "" before login
    nonce: str
    expires: float  # seconds since the epoch

    @property
    def signed_in(self) -> bool:
        return bool(self.access_key)


class Sessions:
    """Issues and reads session cookies and CSRF tokens under one key; `clock` gives the time
    (seconds since the epoch), for tests of expiry."""

    def __init__(self, key: bytes, clock: Callable[[], float] = time.time) -> None:
        self._key = key
        self._clock = clock

    def issue(self, access_key: str = "", ttl: float | None = None) -> tuple[Session, str]:
        """A new session and its cookie value."""
        if ttl is None:
            ttl = SESSION_TTL if access_key else ANONYMOUS_TTL
        session = Session(access_key, secrets.token_hex(16), self._clock() + ttl)
        body = json.dumps(
            {"k": session.access_key, "n": session.nonce, "e": session.expires},
            separators=(",", ":"),
        ).encode()
        payload = _b64(body)
        return session, f"{payload}.{_b64(self._sign(payload))}"

    def read(self, cookie: str | None) -> Session | None:
        """The session of a cookie value, or None if it is missing, forged or expired."""
        if not cookie or cookie.count(".") != 1:
            return None
        payload, signature = cookie.split(".")
        try:
            given = _unb64(signature)
            raw = json.loads(_unb64(payload))
            session = Session(str(raw["k"]), str(raw["n"]), float(raw["e"]))
        except (ValueError, TypeError, KeyError):
            return None
        if not hmac.compare_digest(given, self._sign(payload)):
            return None
        if session.expires <= self._clock():
            return None
        return session

    def csrf_token(self, session: Session) -> str:
        """The token the session's forms carry (hidden field `csrf` or header X-CSRF-Token)."""
        return _b64(hmac.new(self._key, b"csrf:" + session.nonce.encode(), hashlib.sha256).digest())

    def csrf_ok(self, session: Session, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(
            token.encode(), self.csrf_token(session).encode()
        )

    def _sign(self, payload: str) -> bytes:
        return hmac.new(self._key, b"session:" + payload.encode(), hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise ValueError("not base64") from exc


class SignedOut:
    """The sessions signed out before their expiry (by nonce), in a file of the node's cache
    dir its worker processes share: a copy of a session's cookie ends with the session, on
    whichever worker it comes back. (Each node keeps its own: on another node of a fleet, a
    copy lasts until it expires, SESSION_TTL.)"""

    def __init__(self, path: str | None, clock: Callable[[], float] = time.time) -> None:
        self._path = path  # None: this process's memory alone
        self._clock = clock
        self._memory: dict[str, float] = {}

    async def add(self, session: Session) -> None:
        if self._path is None:
            self._add(session)
        else:
            await asyncio.to_thread(self._add, session)

    async def holds(self, session: Session) -> bool:
        if self._path is None:
            return self._holds(session.nonce)
        return await asyncio.to_thread(self._holds, session.nonce)

    def _add(self, session: Session) -> None:
        with self._locked(write=True) as ended:
            now = self._clock()
            for nonce in [n for n, expires in ended.items() if expires <= now]:
                del ended[nonce]  # expired anyway
            ended[session.nonce] = session.expires

    def _holds(self, nonce: str) -> bool:
        with self._locked(write=False) as ended:
            return nonce in ended

    @contextlib.contextmanager
    def _locked(self, write: bool) -> Iterator[dict[str, float]]:
        if self._path is None:
            yield self._memory
            return
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "r+", encoding="utf-8") as f:
            fcntl.flock(fd, fcntl.LOCK_EX if write else fcntl.LOCK_SH)
            try:
                ended: dict[str, float] = json.loads(f.read() or "{}")
            except ValueError:
                ended = {}
            yield ended
            if write:
                f.seek(0)
                f.truncate()
                f.write(json.dumps(ended, separators=(",", ":")))
                f.flush()
