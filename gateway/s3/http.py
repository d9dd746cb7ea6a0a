"""The request as S3 sees it, parsed once from the ASGI scope, and the reply sent back.

Plain ASGI rather than starlette's Request/Response on this path: every microsecond of a
cache hit shows (shared/PERF-NOTES.md: a bare ASGI answer costs ~30 µs, starlette ~50 µs).
"""

from __future__ import annotations

import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, TypeGuard, cast
from urllib.parse import parse_qsl, unquote

from gateway import errors

if TYPE_CHECKING:  # the edge imports this module without the service
    from gateway.service import Caller, Chunk, FileRegion

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
# The ASGI extension that sends a body from a file (gateway/server/ offers it).
ZEROCOPY = "http.response.zerocopysend"
_BUFFERS = (bytes, bytearray, memoryview)


# Request ids: 64 random bits, unique enough and guessed by no one who matters, from a
# generator of this process's own (seeded from the OS, again in a forked child): os.urandom
# was a getrandom(2) call a request, a quarter of a plain hit's system calls, and a release of
# the GIL that the event loop then waited to take back behind the cache's threads.
_ids = random.Random()
os.register_at_fork(after_in_child=_ids.seed)
_bits = _ids.getrandbits


def new_request_id() -> str:
    return f"{_bits(64):016X}"


STATUS_LINES = {
    int(s): b"HTTP/1.1 %d %s\r\n" % (int(s), s.phrase.encode()) for s in HTTPStatus
}  # the status lines of the codes Python knows


def render_refusal(
    error: errors.S3Error,
    default_headers: list[tuple[bytes, bytes]],
    request_id: str | None = None,
) -> bytes:
    """`error` as a whole HTTP answer after which the connection closes: the edge's refusals,
    and an answer promised at the edge that could not be kept (a block that could not be
    read in). `request_id`: the request's, if it was given one already."""
    request_id = request_id or new_request_id()
    body = error.to_xml(request_id)
    head = [STATUS_LINES[error.status]]
    for name, value in default_headers:
        head += [name, b": ", value, b"\r\n"]
    head += [
        b"content-type: application/xml\r\n",
        b"content-length: %d\r\n" % len(body),
        b"x-amz-request-id: " + request_id.encode() + b"\r\n",
        b"connection: close\r\n\r\n",
    ]
    return b"".join(head) + body


@dataclass(slots=True)
class S3Request:
    method: str
    raw_path: str  # percent-encoded, as sent (SigV4 needs it)
    query_string: str
    headers: dict[str, str]  # lower-case names; repeated headers joined with ','
    query: dict[str, str]
    bucket: str | None
    key: str | None
    request_id: str = field(default_factory=new_request_id)
    access_key: str | None = None  # set once authenticated
    virtual_host: bool = False  # the bucket came from the Host header
    receive: Receive | None = None  # the body, for operations that read one
    auth: Any = None  # the AuthResult of a signed request (body checks need it)
    caller: Caller | None = None  # who asks, once authenticated (the service decides again)
    zero_copy: bool = False  # the server sends files itself (http.response.zerocopysend)

    @property
    def resource(self) -> str:
        if self.bucket is None:
            return "/"
        return f"/{self.bucket}/{self.key}" if self.key is not None else f"/{self.bucket}"


_last_query: tuple[str, tuple[tuple[str, str], ...]] = ("", ())


def parse_query(qs: str) -> dict[str, str]:
    """The query string's parameters, decoded (a repeated name: its last value). The last
    query parsed is kept: the same query again (a presigned URL read over and over on the
    full path, a range at a time) is not parsed again."""
    global _last_query
    if not qs:
        return {}
    last, pairs = _last_query
    if qs != last:
        pairs = tuple(parse_qsl(qs, keep_blank_values=True))
        _last_query = (qs, pairs)
    return dict(pairs)


def parse_request(scope: Scope, base_domain: str | None) -> S3Request:
    raw = scope.get("raw_path")
    raw_path = raw.decode("latin-1") if raw else scope["path"]
    qs = scope.get("query_string", b"").decode("latin-1")
    headers: dict[str, str] = {}
    for name, value in scope["headers"]:
        n = name.decode("latin-1").lower()
        v = value.decode("latin-1")
        headers[n] = f"{headers[n]},{v}" if n in headers else v
    query = parse_query(qs)
    path = raw_path.split("?", 1)[0]
    if not path.isascii():  # raw UTF-8 bytes on the request line, not percent-encoded
        path = path.encode("latin-1").decode("utf-8")
    if "%" in path:
        path = unquote(path, errors="strict")
    bucket: str | None = None
    key: str | None = None
    host = headers.get("host", "").rsplit(":", 1)[0].lower() if base_domain else ""
    virtual = bool(base_domain) and host.endswith(f".{base_domain}")
    if virtual:
        bucket = host[: -len(f".{base_domain}")]
        key = path[1:] or None
    else:
        rest = path[1:]
        if rest:
            bucket, sep, k = rest.partition("/")
            key = k if sep and k else None
    req = S3Request(scope["method"], raw_path, qs, headers, query, bucket or None, key)
    req.virtual_host = virtual
    return req


@dataclass(slots=True)
class Reply:
    status: int = 200
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    # A FileRegion (or one among the pieces) is sent by the server from its file: only where
    # the server offers http.response.zerocopysend (the Reader gives one only then).
    body: bytes | FileRegion | AsyncIterator[Chunk] = b""
    length: int | None = None  # Content-Length when it is not len(body): streams, HEAD
    cache: str | None = None  # hit, miss or bypass: for x-cache, metrics and the access log

    def header(self, name: str, value: str) -> None:
        self.headers.append((name.encode("latin-1"), value.encode("latin-1")))


def _is_region(body: object) -> TypeGuard[FileRegion]:
    """A FileRegion (told apart without importing the service, which the edge does not)."""
    return not isinstance(body, _BUFFERS) and not hasattr(body, "__aiter__")


async def send_region(send: Send, region: FileRegion, more: bool) -> None:
    """A piece of body sent from a file by the server (ASGI http.response.zerocopysend)."""
    await send(
        {
            "type": ZEROCOPY,
            "file": region.fd,
            "offset": region.offset,
            "count": region.count,
            "more_body": more,
        }
    )


async def send_reply(send: Send, reply: Reply, head_only: bool, request_id: str) -> int:
    """Send status, headers and body; returns the number of body bytes sent."""
    headers = reply.headers
    headers.append((b"x-amz-request-id", request_id.encode()))
    body = reply.body
    if isinstance(body, bytes):
        length = len(body) if reply.length is None else reply.length
        headers.append((b"content-length", str(length).encode()))
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if head_only else body})
        return 0 if head_only else len(body)
    if reply.length is not None:
        headers.append((b"content-length", str(reply.length).encode()))
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    if _is_region(body):
        try:
            if not head_only:
                await send_region(send, body, False)
        finally:
            body.close()
        return 0 if head_only else body.count
    pieces = cast("AsyncIterator[Chunk]", body)
    sent = 0
    try:
        async for chunk in pieces:
            if _is_region(chunk):
                try:
                    await send_region(send, chunk, True)
                finally:
                    chunk.close()
                sent += chunk.count
            elif chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                sent += len(chunk)
    finally:
        aclose = getattr(body, "aclose", None)
        if aclose is not None:
            await aclose()
    await send({"type": "http.response.body", "body": b""})
    return sent
