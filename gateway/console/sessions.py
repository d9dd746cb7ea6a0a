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
import hashlib
import hmac
import json
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.meta import SignOuts

COOKIE = "gateway_console"
SESSION_TTL = 12 * 3600.0  # seconds a login lasts
ANONYMOUS_TTL = 900.0  # seconds the login form's anonymous session lasts
PRUNE_AFTER = 3600.0  # seconds a sign-out is kept past its session's expiry (nodes' clocks)
MAX_REMEMBERED = 10_000  # nonces a process remembers signed out (SignedOut._known)


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
    """The sessions signed out before their expiry, by nonce, in the database (table
    console_signed_out) that every node and worker of the fleet reads: a copy of a session's
    cookie ends with the session wherever it comes back, at once.

    `holds` costs a console request one primary-key lookup (never an S3 request: only the
    console asks); a nonce found signed out is remembered in this process until its session
    would have expired, so a copied cookie sent again costs nothing. A session that is not
    signed out is looked up every time: no cache may hide a sign-out for a while on another
    worker or node. Rows are pruned PRUNE_AFTER past their expiry as sign-outs are written.
    `clock`: seconds since the epoch, the sessions' own."""

    def __init__(
        self, engine: AsyncEngine, clock: Callable[[], float] = time.time, legacy: str | None = None
    ) -> None:
        self._table = SignOuts(engine)
        self._clock = clock
        self._known: dict[str, float] = {}  # nonces signed out, by their sessions' expiry
        self._legacy = legacy  # the file a node kept its sign-outs in before 0009, taken in once

    async def add(self, session: Session) -> None:
        await self._take_in_legacy()
        await self._write({session.nonce: session.expires})
        self._remember(session.nonce, session.expires)

    async def holds(self, session: Session) -> bool:
        if session.nonce in self._known:
            return True
        await self._take_in_legacy()
        expires = await self._table.expires(session.nonce)
        if expires is None:
            return False
        self._remember(session.nonce, expires)
        return True

    async def _write(self, ended: dict[str, float]) -> None:
        # A node whose clock is behind still refuses a session for PRUNE_AFTER.
        await self._table.add(ended, prune_before=self._clock() - PRUNE_AFTER)

    def _remember(self, nonce: str, expires: float) -> None:
        if len(self._known) >= MAX_REMEMBERED:
            now = self._clock()
            self._known = {n: e for n, e in self._known.items() if e > now}
            if len(self._known) >= MAX_REMEMBERED:
                self._known.clear()  # only a cache: the database has them all
        self._known[nonce] = expires

    async def _take_in_legacy(self) -> None:
        """Sign-outs a node wrote to its cache dir's file before migration 0009: written into
        the table once (by whichever worker comes first; the others find no file), so that no
        signed-out session comes back with an upgrade. Until that has succeeded, the next
        request tries again (two at once write the same rows: no harm)."""
        path = self._legacy
        if path is None:
            return
        ended = await asyncio.to_thread(_read_legacy, path)
        now = self._clock()
        ended = {n: e for n, e in ended.items() if isinstance(e, int | float) and e > now}
        if ended:
            await self._write(ended)
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread(os.unlink, path)
        self._legacy = None


def _read_legacy(path: str) -> dict[str, float]:
    try:
        with open(path, encoding="utf-8") as f:
            ended = json.loads(f.read() or "{}")
    except (FileNotFoundError, ValueError, UnicodeError):
        return {}
    return ended if isinstance(ended, dict) else {}
