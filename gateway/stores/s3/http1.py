"""Keep-alive HTTP/1.1 connections to one origin: the wire under the S3 transport (transport.py).

A cold miss is one GET to the origin, and through aiohttp that GET cost ~0.25 ms of the
gateway's CPU of its own (a request object, header multidicts, tracing and timeout contexts,
a stream reader) before a byte of the body: about a tenth of a miss. Here a GET is a few
lines written to a pooled connection, its answer's head parsed in one pass in the protocol's
callback, and its body handed on as it arrives (the socket paused while more than `_HIGH`
bytes wait for the reader).

Only what the transport's reads need: GET or HEAD, no request body, an answer with a status
line, headers and a body of its Content-Length (S3's answers to both; a HEAD's has none) or
chunked (some origins send listings so: rclone). Anything else (a body that runs to the close,
another transfer coding, a malformed head) is a `ProtocolError`; every failure is an OSError,
TimeoutError or ProtocolError (`FAILURES`) for the transport, which retries or reports it. A
pooled connection the origin closed while idle is replaced once, before a byte of the answer
arrived.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterable
from typing import Any, cast
from urllib.parse import urlsplit

_HIGH, _LOW = 1 << 20, 256 << 10  # bytes waiting for the reader: pause, resume the socket
_HEAD_MAX = 64 << 10  # an answer's status line and headers at most
_CHUNKED = -2  # the body's length: chunked
_CHUNK_LINE_MAX = 4096  # a chunk's size line, or a trailer line, at most


class ProtocolError(Exception):
    """An answer this client does not read: malformed, or with a body sent neither by its
    Content-Length nor chunked."""


FAILURES = (OSError, TimeoutError, ProtocolError)


class Response:
    """One answer: its status, its headers (names and values as sent, Latin-1), its body."""

    __slots__ = (
        "_buffered", "_chunks", "_conn", "_error", "_waiter", "complete", "headers", "status",
    )  # fmt: skip

    def __init__(self, conn: _Connection) -> None:
        self._conn: _Connection | None = conn
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self.complete = False  # the whole body has arrived
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def at_eof(self) -> bool:
        """Every byte of the body has arrived and been taken."""
        return self.complete and not self._chunks

    async def chunks(self, size: int) -> AsyncGenerator[bytes, None]:
        """The body as it arrives: each piece as the socket gave it, or those waiting joined
        up to `size` bytes."""
        while True:
            chunks = self._chunks
            if chunks:
                if len(chunks) == 1 or len(chunks[0]) >= size:
                    data = chunks.popleft()
                else:
                    parts, n = [], 0
                    while chunks and n + len(chunks[0]) <= size:
                        n += len(chunks[0])
                        parts.append(chunks.popleft())
                    data = b"".join(parts)
                self._taken(len(data))
                yield data
            elif self.complete:
                return
            else:
                await self._wait()

    async def read(self, limit: int = -1) -> bytes:
        """The body (its first `limit` bytes if limit >= 0)."""
        out = bytearray()
        async for chunk in self.chunks(1 << 20):
            out += chunk
            if 0 <= limit <= len(out):
                return bytes(out[:limit])
        return bytes(out)

    def release(self) -> None:
        """Done with the answer: its connection is pooled again if the body was all read and
        the origin keeps it open, else closed."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.done(self, reuse=self.at_eof())

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.done(self, reuse=False)

    async def _wait(self) -> None:
        if self._error is not None:
            raise self._error
        conn = self._conn
        if conn is None:
            raise ConnectionResetError("the answer was released before its end")
        loop = conn.loop
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(conn.read_timeout, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None
        if self._error is not None and not self._chunks and not self.complete:
            raise self._error

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > _HIGH and self._conn is not None:
            self._conn.pause()
        self._wake()

    def _taken(self, n: int) -> None:
        self._buffered -= n
        if self._buffered < _LOW and self._conn is not None:
            self._conn.resume()

    def _end(self, error: BaseException | None = None) -> None:
        if error is None:
            self.complete = True
        elif not self.complete:
            self._error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def _expire(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError("the origin sent nothing within the read timeout"))


class _Connection(asyncio.Protocol):
    """One connection to the origin and the answer it is reading, parsed as it arrives."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.read_timeout = pool.read_timeout
        self.transport: asyncio.Transport | None = None
        self.response: Response | None = None
        self.head: asyncio.Future[Response] | None = None
        self.received = False  # a byte of the current answer came
        self.closed = False
        self.paused = False
        self.holds_slot = False  # one of the pool's `limit` places is this connection's
        self.keep_alive = False  # the origin keeps the connection after this answer
        self.bodiless = False  # the answer has no body whatever its head says (to a HEAD)
        self._buffer = b""  # the start of a head not whole yet
        self._remaining = -1  # the body's bytes still to come; -1: its head is not in yet
        self._chunks: _Dechunker | None = None  # a chunked body's decoder

    # -- the request ---------------------------------------------------------------------------

    async def send(self, request: bytes, bodiless: bool) -> Response:
        """Write the request; its answer once its head has arrived."""
        assert self.transport is not None
        self.response = Response(self)
        self.bodiless = bodiless
        self.received = self.keep_alive = False
        self._buffer, self._remaining, self._chunks = b"", -1, None
        head = self.head = self.loop.create_future()
        timer = self.loop.call_later(self.read_timeout, _expire, head)
        self.transport.write(request)
        try:
            return await head
        finally:
            timer.cancel()

    def done(self, response: Response, reuse: bool) -> None:
        if response is not self.response:
            return
        self.response = self.head = None
        if reuse and self.keep_alive and not self.closed:
            self.resume()
            self.pool.put(self)
        else:
            self.abort()

    def pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.received = True
        response = self.response
        if response is None or response.complete:
            self._broken(ProtocolError("bytes from the origin nobody asked for"))
            return
        if self._remaining < 0:
            if self._buffer:
                data, self._buffer = self._buffer + data, b""
            end = data.find(b"\r\n\r\n")
            if end < 0:
                if len(data) > _HEAD_MAX:
                    self._broken(ProtocolError("the answer's head is too long"))
                else:
                    self._buffer = data
                return
            try:
                self._remaining, self.keep_alive = _parse_head(response, data[:end], self.bodiless)
            except ProtocolError as exc:
                self._broken(exc)
                return
            data = data[end + 4 :]
            if response.status < 200:  # 100 Continue and the like: the answer follows
                response.headers.clear()
                self._remaining = -1
                if data:
                    self.data_received(data)
                return
            head = self.head
            if head is not None and not head.done():
                head.set_result(response)
            if self._remaining == _CHUNKED:
                self._chunks, self._remaining = _Dechunker(), 0
            elif self._remaining == 0:
                response._end()
        if self._chunks is not None:
            try:
                ended = self._chunks.feed(data, response._feed)
            except ProtocolError as exc:
                self._broken(exc)
                return
            if ended:
                self._chunks, self._remaining = None, 0
                response._end()
            return
        if data:
            if len(data) > self._remaining:
                self._broken(ProtocolError("the origin sent more than its Content-Length"))
                return
            self._remaining -= len(data)
            response._feed(data)
            if self._remaining == 0:
                response._end()

    def eof_received(self) -> bool | None:
        return None  # the transport closes itself; connection_lost tells the answer

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.lost(self)
        self._failed(exc or ConnectionResetError("the origin closed the connection"))

    def _broken(self, exc: BaseException) -> None:
        self._failed(exc)
        self.abort()

    def _failed(self, exc: BaseException) -> None:
        head, response = self.head, self.response
        if head is not None and not head.done():
            head.set_exception(exc)
        elif response is not None:
            response._end(exc)


def _parse_head(response: Response, head: bytes, bodiless: bool) -> tuple[int, bool]:
    """The status and headers of an answer's head into `response`; (the body's length,
    whether the connection stays open after it). A `bodiless` answer (to a HEAD) has none."""
    lines = head.split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    code = rest[:3]
    if version not in (b"HTTP/1.1", b"HTTP/1.0") or not code.isdigit():
        raise ProtocolError(f"not an HTTP/1.1 status line: {lines[0][:80]!r}")
    response.status = status = int(code)
    keep = version == b"HTTP/1.1"
    length = None
    chunked = False
    headers = response.headers
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name[-1:] in (b" ", b"\t"):
            raise ProtocolError(f"a malformed header line: {line[:80]!r}")
        n, v = name.decode("latin-1"), value.strip(b" \t").decode("latin-1")
        headers.append((n, v))
        lower = n.lower()
        if lower == "connection":
            tokens = {t.strip() for t in v.lower().split(",")}
            keep = "close" not in tokens and (keep or "keep-alive" in tokens)
        elif bodiless:
            continue  # a HEAD's Content-Length is the object's; its answer has no body
        elif lower == "content-length":
            if not v.isdigit() or (length is not None and length != int(v)):
                raise ProtocolError(f"Content-Length {v!r}")
            length = int(v)
        elif lower == "transfer-encoding":
            if v.lower() != "chunked":
                raise ProtocolError(f"a body sent {v!r}")  # see the module's docstring
            chunked = True
    if bodiless or status < 200 or status in (204, 304):
        return 0, keep
    if chunked:
        return _CHUNKED, keep  # (a Content-Length beside it is not the body's: RFC 9112 6.3)
    if length is None:
        raise ProtocolError("an answer without Content-Length")
    return length, keep


class _Dechunker:
    """A chunked body (RFC 9112, 7.1) decoded as it arrives: a size line (hex, extensions
    ignored), that many bytes and a CRLF, again until a size of 0, then trailer lines (ignored)
    to an empty one."""

    __slots__ = ("_buffer", "_left", "_state")

    SIZE, DATA, DATA_END, TRAILER = range(4)

    def __init__(self) -> None:
        self._state = self.SIZE
        self._left = 0  # of the chunk's data
        self._buffer = b""  # a line not whole yet

    def feed(self, data: bytes, body: Callable[[bytes], None]) -> bool:
        """Decode `data`, handing the body's bytes to `body`; True once the body ended (no
        byte may follow it)."""
        if self._buffer:
            data, self._buffer = self._buffer + data, b""
        at, end = 0, len(data)
        while at < end:
            if self._state == self.DATA:
                piece = data[at : at + self._left]
                body(piece)
                at += len(piece)
                self._left -= len(piece)
                if not self._left:
                    self._state = self.DATA_END
                continue
            eol = data.find(b"\r\n", at)
            if eol < 0:
                if end - at > _CHUNK_LINE_MAX:
                    raise ProtocolError("a chunk's line is too long")
                self._buffer = data[at:]
                return False
            line, at = data[at:eol], eol + 2
            if self._state == self.DATA_END:
                if line:
                    raise ProtocolError("a chunk longer than its size")
                self._state = self.SIZE
            elif self._state == self.SIZE:
                size = line.partition(b";")[0].strip()
                if not size or any(c not in b"0123456789abcdefABCDEF" for c in size):
                    raise ProtocolError(f"a chunk size {line[:40]!r}")
                self._left = int(size, 16)
                self._state = self.DATA if self._left else self.TRAILER
            elif not line:  # the trailer's end: the body's
                if at < end:
                    raise ProtocolError("the origin sent more than its chunked body")
                return True
        return False


class Pool:
    """Keep-alive connections to the origin of `base_url`, at most `limit` at once."""

    def __init__(
        self,
        base_url: str,
        connect_timeout: float,
        read_timeout: float,
        limit: int = 64,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if self.https else 80)
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._ssl = (ssl_context or ssl.create_default_context()) if self.https else None
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(limit)
        self._open: set[_Connection] = set()
        self.loop = asyncio.get_running_loop()

    async def request(
        self, method: str, target: str, headers: Iterable[tuple[str, str]]
    ) -> Response:
        """`method` (GET or HEAD) of `target` (the path and query as sent) with `headers`
        (Host among them)."""
        lines = [f"{method} {target} HTTP/1.1"]
        lines += [f"{name}: {value}" for name, value in headers]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        bodiless = method == "HEAD"
        await self._slots.acquire()
        try:
            for _ in range(2):
                conn = self._idle.pop() if self._idle else None
                reused = conn is not None
                if conn is None or conn.closed:
                    conn = await self._connect()
                try:
                    response = await conn.send(request, bodiless)
                except FAILURES:
                    conn.abort()
                    if reused and not conn.received:
                        continue  # closed by the origin while idle: once more, anew
                    raise
                except BaseException:  # cancelled: the answer on its way is nobody's
                    conn.abort()
                    raise
                # The place goes back with the connection: pooled again, or closed.
                conn.holds_slot = True
                return response
            raise ConnectionResetError("the origin closed two connections in a row")
        except BaseException:
            self._slots.release()
            raise

    async def _connect(self) -> _Connection:
        loop = self.loop
        make = loop.create_connection(
            lambda: _Connection(self), self.host, self.port, ssl=self._ssl,
            server_hostname=self.host if self._ssl is not None else None,
        )  # fmt: skip
        _, conn = await asyncio.wait_for(make, self.connect_timeout)
        self._open.add(conn)
        return conn

    def put(self, conn: _Connection) -> None:
        self._release_slot(conn)
        self._idle.append(conn)

    def lost(self, conn: _Connection) -> None:
        self._open.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)
        self._release_slot(conn)

    def _release_slot(self, conn: _Connection) -> None:
        if conn.holds_slot:
            conn.holds_slot = False
            self._slots.release()

    async def close(self) -> None:
        for conn in list(self._open):
            conn.abort()
        self._idle.clear()
