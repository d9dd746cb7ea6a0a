"""The node's own HTTP/1.1 server: an `asyncio.Protocol` over httptools' parser (llhttp) on
uvloop, built on public APIs only, with the edge's limits (gateway/edge.py) and its answers to
plain hits made in the parser's callback, before any request cycle exists.

Everything that is not such a hit is handed, in this process and without a second parse, to
the node's ASGI application (starlette and the S3 front end) as an ASGI 3 `http` exchange:
keep-alive, pipelining (one exchange at a time per connection, the next one parsed and held),
backpressure both ways (reading paused while an exchange's unread body is large or a
pipelined request waits; the application's `send` waits while the socket's buffer is full),
`Expect: 100-continue` answered on the first `receive`, and timeouts: the head (408, or closed
when nothing was asked), the idle connection between requests, the TLS handshake.

`Serving` runs the application's lifespan around one process's listening sockets;
`run_workers` forks the node's worker processes from this one (which has imported the gateway
already), replaces a worker that dies, and stops them all on SIGINT or SIGTERM. uvicorn stays
available as the plain-ASGI fallback (`gateway serve --server uvicorn`, gateway/edge.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import selectors
import signal
import socket
import ssl
import sys
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any, cast
from urllib.parse import unquote

import httptools

from gateway import errors
from gateway.edge import (
    STATUS_LINES,
    EdgeLimits,
    FastAnswer,
    HeadGuard,
    Refused,
    fast_path,
    render_refusal,
    report_refusal,
    write_fast_answer,
)

log = logging.getLogger("gateway.server")

App = Callable[[dict[str, Any], Callable[[], Awaitable[dict[str, Any]]], Any], Awaitable[None]]

# Bytes of request body buffered for an exchange before the connection stops reading.
BODY_HIGH_WATER = 256 << 10
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_ASGI = {"version": "3.0", "spec_version": "2.3"}
_NO_BODY_STATUS = frozenset({204, 304})
# The ASGI extension for bodies sent from a file by the kernel (sendfile(2)): offered on plain
# TCP connections, never over TLS (the bytes would bypass the encryption).
ZEROCOPY = "http.response.zerocopysend"
_ZEROCOPY_EXTENSIONS: dict[str, Any] = {ZEROCOPY: {}}
# Bytes handed to one sendfile(2) call before the loop serves other connections.
SENDFILE_SLICE = 1 << 20


@dataclass
class ServerConfig:
    """What each worker's server needs; built before the workers are forked."""

    limits: EdgeLimits
    ssl: ssl.SSLContext | None = None
    graceful_timeout: float = 10.0  # seconds running exchanges are given at a shutdown


class _Clock:
    """The `date` header, formatted once a second rather than once a response."""

    def __init__(self) -> None:
        self._second = -1
        self._headers: list[tuple[bytes, bytes]] = []

    def headers(self) -> list[tuple[bytes, bytes]]:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._headers = [(b"date", formatdate(now, usegmt=True).encode())]
        return self._headers


class Server:
    """One process's connections: their count per listening port, the application, and a
    graceful stop."""

    def __init__(self, app: App, config: ServerConfig) -> None:
        self.app = app
        self.config = config
        self.limits = config.limits
        self.clock = _Clock()
        self.open: Counter[int] = Counter()  # connections per listening port
        self.connections: set[Connection] = set()
        self.state: dict[str, Any] = {}  # the lifespan's state, copied into each scope
        self.stopping = False
        self._none_open = asyncio.Event()  # set when stopping and the last connection closed

    def closed(self, conn: Connection) -> None:
        self.connections.discard(conn)
        if self.stopping and not self.connections:
            self._none_open.set()

    def protocol(self) -> Connection:
        return Connection(self)

    async def drain(self) -> None:
        """Close idle connections, let running exchanges finish (their connections close
        after the answer), and close the rest once the graceful timeout is over."""
        self.stopping = True
        for conn in list(self.connections):
            conn.stop()
        if self.connections:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._none_open.wait(), self.config.graceful_timeout)
        for conn in list(self.connections):
            conn.abort()


class Connection(HeadGuard, asyncio.Protocol):
    """One client connection (see the module's docstring)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        limits = server.limits
        self.guard_init(limits)
        self.body_timeout = limits.body_timeout
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.parser = httptools.HttpRequestParser(self)
        with contextlib.suppress(AttributeError):  # httptools < 0.6.3
            # A request pipelined after one with `Connection: close` is not an error.
            self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self._port: int | None = None  # the listening port this connection is counted on
        self._sockname: tuple[str, int] | None = None
        self._peername: tuple[str, int] | None = None
        self._scheme = "http"
        self._fast: FastAnswer | None = None
        # The request being parsed.
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._field_bytes = 0
        self._expect_continue = False
        self._parsing: Exchange | None = None  # the exchange the parser feeds a body to
        self._fast_answer: list[bytes | memoryview] | None = None
        self._fast_keep_alive = True
        # Exchanges: the one answering, and those parsed behind it.
        self.running: Exchange | None = None
        self._pipeline: deque[Exchange] = deque()
        # Flow: reading is paused for a body not yet read by the application or for a
        # pipelined request; writing waits while the transport's buffer is full.
        self._paused_for_body = False
        self._paused_for_pipeline = False
        self.writable = asyncio.Event()
        self.writable.set()
        self._idle_timer: asyncio.TimerHandle | None = None
        self.lost = False
        self._socket_fd = -1  # the socket's descriptor, for sendfile (plain TCP only)
        self._send_wait: asyncio.Future[None] | None = None  # a sendfile waiting for room

    # -- connection ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are asyncio.Transport in all but class.
        self.transport = transport = cast(asyncio.Transport, transport)
        sockname = transport.get_extra_info("sockname")
        port = int(sockname[1]) if isinstance(sockname, tuple) else 0
        server = self.server
        if server.open[port] >= self._limits.max_connections or server.stopping:
            self.refuse(
                errors.SlowDown("The node has reached its limit of open connections."),
                "connection_limit",
            )
            return
        server.open[port] += 1
        server.connections.add(self)
        self._port = port
        self._sockname = (str(sockname[0]), port) if isinstance(sockname, tuple) else None
        peer = transport.get_extra_info("peername")
        self._peername = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else None
        if transport.get_extra_info("sslcontext") is not None:
            self._scheme = "https"
        else:
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                self._socket_fd = sock.fileno()
        self._fast = fast_path(port)
        self.guard_start()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self._port is not None:
            self.server.open[self._port] -= 1
            self._port = None
        self.server.closed(self)
        self.guard_stop()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self.writable.set()  # a sender waiting for room finds the connection gone
        self._socket_fd = -1
        if self._send_wait is not None and not self._send_wait.done():
            self._send_wait.set_result(None)
        for exchange in (self.running, *self._pipeline):
            if exchange is not None:
                exchange.disconnect()
        self._pipeline.clear()

    def eof_received(self) -> bool | None:
        # The client sends no more: the connection closes (an answer under way is told its
        # client went away), as HTTP/1.1 servers commonly treat a half-close.
        return None

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def data_received(self, data: bytes) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self.feed(data)

    # -- parser callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.message_begun()
        self._url = b""
        self._headers = []
        self._expect_continue = False

    def on_url(self, url: bytes) -> None:
        self._url += url
        self.count_url(len(self._url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.count_header(name, value, len(self._headers))
        name = name.lower()
        value = value.rstrip(b" \t")  # llhttp keeps trailing whitespace; RFC 9110 drops it
        if name == b"expect" and value.lower() == b"100-continue":
            self._expect_continue = True
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.head_done()
        parser = self.parser
        version = parser.get_http_version()
        keep_alive = version != "1.0" and parser.should_keep_alive() and not self.server.stopping
        fast = self._fast
        if (
            fast is not None
            and self.running is None
            and not self._pipeline
            and self.writable.is_set()  # a client that does not read gets no more
        ):
            method = parser.get_method()
            answer = fast(method, self._url, self._headers, keep_alive, self.server.clock.headers())
            if answer is not None:
                self._fast_answer = answer
                self._fast_keep_alive = keep_alive
                self._parsing = None
                return
        verb = parser.get_method().decode("ascii")
        parsed = httptools.parse_url(self._url)
        raw_path = parsed.path
        try:
            path = raw_path.decode("ascii")
        except UnicodeDecodeError:
            raise Refused(errors.InvalidURI(), "not_http") from None
        if "%" in path:
            path = unquote(path)
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": _ASGI,
            "http_version": version,
            "server": self._sockname,
            "client": self._peername,
            "scheme": self._scheme,
            "root_path": "",
            "method": verb,
            "path": path,
            "raw_path": raw_path,
            "query_string": parsed.query or b"",
            "headers": self._headers,
            "state": self.server.state.copy(),
        }
        if self._socket_fd >= 0:
            scope["extensions"] = _ZEROCOPY_EXTENSIONS
        exchange = Exchange(self, scope, keep_alive, self._expect_continue, verb == "HEAD")
        self._parsing = exchange
        if self.running is None:
            self._start(exchange)
        else:
            self._pipeline.append(exchange)
            self._paused_for_pipeline = True
            self.transport.pause_reading()

    def on_body(self, body: bytes) -> None:
        self.progress = True
        exchange = self._parsing
        if exchange is None or exchange.complete:
            return
        exchange.body += body
        exchange.arrived.set()
        if len(exchange.body) > BODY_HIGH_WATER and not self._paused_for_body:
            self._paused_for_body = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        self.progress = True
        answer = self._fast_answer
        if answer is None:
            exchange = self._parsing
            if exchange is not None:
                exchange.more_body = False
                exchange.arrived.set()
            self._parsing = None
            return
        self._fast_answer = None
        if write_fast_answer(self.transport, answer, self._fast_keep_alive):
            self._idle()

    # -- exchanges -----------------------------------------------------------------------

    def _start(self, exchange: Exchange) -> None:
        self.running = exchange
        exchange.task = self.loop.create_task(exchange.run(self.server.app))

    def body_read(self) -> None:
        """The application took the buffered body: reading goes on."""
        if self._paused_for_body:
            self._paused_for_body = False
            if not self._paused_for_pipeline and not self.lost:
                self.transport.resume_reading()

    def finished(self, exchange: Exchange) -> None:
        """`exchange` has sent its whole answer (or failed)."""
        if self.running is not exchange:
            return
        self.running = None
        transport = self.transport
        if not exchange.keep_alive or transport.is_closing():
            if not transport.is_closing():
                transport.close()
            return
        if self._pipeline:
            self._start(self._pipeline.popleft())
            if not self._pipeline and self._paused_for_pipeline:
                self._paused_for_pipeline = False
                if not self._paused_for_body:
                    transport.resume_reading()
            return
        if self.server.stopping:
            transport.close()
            return
        self._idle()

    def _idle(self) -> None:
        """Between requests: closed after the keep-alive timeout unless asked again."""
        if self._paused_for_pipeline:
            self._paused_for_pipeline = False
            if not self._paused_for_body:
                self.transport.resume_reading()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        self._idle_timer = self.loop.call_later(
            self.server.limits.keepalive_timeout, self._close_idle
        )

    def _close_idle(self) -> None:
        self._idle_timer = None
        if self.running is None and not self.transport.is_closing():
            self.transport.close()

    def stop(self) -> None:
        """A graceful shutdown: an idle connection closes now, a busy one after its answer."""
        if self.running is None and not self._pipeline:
            self.transport.close()
            return
        for exchange in (self.running, *self._pipeline):
            if exchange is not None:
                exchange.keep_alive = False

    def abort(self) -> None:
        if self.running is not None and self.running.task is not None:
            self.running.task.cancel()
        self.transport.abort()

    # -- bodies from files -----------------------------------------------------------------

    async def send_file(self, fd: int, offset: int, count: int) -> bool:
        """Send `count` bytes of the file `fd` from `offset` after what the transport holds,
        from the page cache to the socket by the kernel (sendfile(2)), on the event loop: the
        transport's buffer drained first (uvloop's transports have no `sendfile` of their own
        and must not be written beside), then slices of SENDFILE_SLICE bytes while the
        socket takes them, waiting for room between them on a duplicate of the socket's
        descriptor (uvloop watches no descriptor a transport owns). False when the connection
        is gone (the rest unsent), or the client read nothing for `body_timeout` seconds (the
        connection is then aborted). The caller makes sure the file's bytes are in the page
        cache, so that the loop does not wait for the disk (PageStore.region)."""
        if self.transport.get_write_buffer_size() and not await self._drained():
            return False
        while count > 0:
            sock = self._socket_fd
            if sock < 0 or self.transport.is_closing():
                return False
            try:
                sent = os.sendfile(sock, fd, offset, min(count, SENDFILE_SLICE))
            except BlockingIOError:
                if not await self._room():
                    return False
                continue
            except (BrokenPipeError, ConnectionError):
                self.transport.abort()
                return False
            if sent == 0:
                raise EOFError(f"the file ends before {count} more bytes at {offset}")
            offset += sent
            count -= sent
            if count > 0:
                await asyncio.sleep(0)  # the other connections' turn
        return True

    async def _drained(self) -> bool:
        """Wait until the transport has written all it holds (its limits lowered to zero
        meanwhile, so that it pauses now and resumes once empty)."""
        transport = self.transport
        low, high = transport.get_write_buffer_limits()
        transport.set_write_buffer_limits(high=0, low=0)
        try:
            while transport.get_write_buffer_size() and not self.lost:
                self.writable.clear()  # resume_writing sets it once the buffer is empty
                try:
                    await asyncio.wait_for(self.writable.wait(), self.body_timeout)
                except TimeoutError:
                    self._send_timed_out()
                    return False
        finally:
            if not transport.is_closing():
                transport.set_write_buffer_limits(high=high, low=low)
        return not self.lost

    async def _room(self) -> bool:
        """Wait until the socket takes more bytes; False when the connection went, or after
        `body_timeout` seconds without room (the client reads nothing: aborted)."""
        copy = os.dup(self._socket_fd)
        waiter = self._send_wait = self.loop.create_future()

        def ready() -> None:
            if not waiter.done():
                waiter.set_result(None)

        try:
            self.loop.add_writer(copy, ready)
            try:
                await asyncio.wait_for(waiter, self.body_timeout)
            except TimeoutError:
                self._send_timed_out()
                return False
        finally:
            self._send_wait = None
            self.loop.remove_writer(copy)
            os.close(copy)
        return not self.lost

    def _send_timed_out(self) -> None:
        report_refusal("send_timeout")
        self.transport.abort()

    # -- the edge's refusals -------------------------------------------------------------

    def refuse_during(self, error: errors.S3Error, reason: str) -> None:
        """Answer `error` for the running exchange, whose answer has not begun, and close."""
        self._answered = True
        report_refusal(reason)
        self.transport.write(render_refusal(error, self.server.clock.headers()))
        self.transport.close()

    def answering(self) -> bool:
        return self.running is not None

    def default_headers(self) -> list[tuple[bytes, bytes]]:
        return self.server.clock.headers()


class Exchange:
    """One request and its answer, as the ASGI application sees them."""

    def __init__(
        self,
        conn: Connection,
        scope: dict[str, Any],
        keep_alive: bool,
        expect_continue: bool,
        head: bool,
    ) -> None:
        self.conn = conn
        self.scope = scope
        self.keep_alive = keep_alive
        self.head = head
        self.task: asyncio.Task[None] | None = None
        # The request's body.
        self.body = bytearray()
        self.more_body = True
        self._body_given = False  # receive() has returned the body's last piece
        self.arrived = asyncio.Event()  # more body, its end, or the connection's loss
        self._continue = expect_continue
        # The answer.
        self.started = False  # its head is written (or held to go with the first body)
        self.complete = False
        self.disconnected = False
        self._status = 200
        self._bodyless = head  # nothing of a body is sent: HEAD, 204, 304
        self._head: list[bytes] | None = None  # the answer's head, until the first body
        self._chunked = False
        self._length: int | None = None  # bytes of body still to come, when declared

    def disconnect(self) -> None:
        self.disconnected = True
        self.arrived.set()

    async def run(self, app: App) -> None:
        try:
            await app(self.scope, self.receive, self.send)
        except asyncio.CancelledError:
            self.keep_alive = False
            raise
        except BaseException:
            log.exception(
                "the application failed on %s %s", self.scope["method"], self.scope["path"]
            )
            if not self.started and not self.disconnected:
                await self._internal_error()
            else:
                self.keep_alive = False
        else:
            if not self.complete and not self.disconnected:
                if not self.started:
                    log.error("the application returned without an answer")
                    await self._internal_error()
                else:
                    log.error("the application returned before its answer's end")
                    self.keep_alive = False
        finally:
            if not self.complete:
                self.keep_alive = False
            self.conn.finished(self)

    async def _internal_error(self) -> None:
        body = b"Internal Server Error"
        self.keep_alive = False
        await self.send(
            {
                "type": "http.response.start",
                "status": 500,
                "headers": [(b"content-type", b"text/plain; charset=utf-8")],
            }
        )
        await self.send({"type": "http.response.body", "body": body})

    # -- ASGI receive --------------------------------------------------------------------

    async def receive(self) -> dict[str, Any]:
        if self._continue:
            self._continue = False
            if not self.started and not self.conn.transport.is_closing():
                self.conn.transport.write(_CONTINUE)
        if not self._body_given:
            while not self.body and self.more_body and not self.disconnected:
                self.arrived.clear()
                try:
                    await asyncio.wait_for(self.arrived.wait(), self.conn.body_timeout)
                except TimeoutError:
                    self._body_timed_out()
            if not self.disconnected:
                data = bytes(self.body)
                self.body.clear()
                self.conn.body_read()
                self._body_given = not self.more_body
                return {"type": "http.request", "body": data, "more_body": self.more_body}
        # The whole body was given: what is left to tell is the end of the connection, or of
        # the answer (after which nobody listens for it).
        while not self.disconnected and not self.complete:
            self.arrived.clear()
            await self.arrived.wait()
        return {"type": "http.disconnect"}

    def _body_timed_out(self) -> None:
        """The client sent nothing of its body for `body_timeout` seconds: answered 408 if no
        answer has begun, and closed; the application is told its client went away."""
        conn = self.conn
        if not self.started and not conn.transport.is_closing():
            conn.refuse_during(
                errors.RequestTimeout(
                    "Your socket connection to the server was not read from or written to"
                    f" within the timeout period ({conn.body_timeout:g} s of a request body)."
                ),
                "body_timeout",
            )
        else:
            report_refusal("body_timeout")
            conn.transport.close()
        self.keep_alive = False
        self.disconnect()

    # -- ASGI send -----------------------------------------------------------------------

    async def send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if self.disconnected:  # nobody to answer: what the application sends is dropped
            if kind == "http.response.body" and not message.get("more_body", False):
                self.complete = True
            return
        if kind == "http.response.start":
            if self.started:
                raise RuntimeError("the answer has started already")
            self.started = True
            self._continue = False
            self._status = status = int(message["status"])
            self._bodyless = self.head or status in _NO_BODY_STATUS
            self._head = self._render_head(status, message.get("headers", ()))
            return
        if kind == ZEROCOPY:
            await self._send_file(message)
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unexpected ASGI message {kind!r}")
        if not self.started:
            raise RuntimeError("a body before the answer's start")
        if self.complete:
            raise RuntimeError("the answer is complete already")
        body: bytes = message.get("body", b"")
        more = bool(message.get("more_body", False))
        transport = await self._writable(more)
        if transport is None:
            return
        out = self._framed(len(body), more)
        if body and not self._bodyless:
            out.append(body)
            if self._chunked:
                out.append(b"\r\n")
        self._ended(out, more)
        if out:
            if len(out) == 1:
                transport.write(out[0])
            else:
                transport.writelines(out)
        if not more:
            self.complete = True
            self.arrived.set()

    async def _writable(self, more: bool) -> asyncio.Transport | None:
        """The connection's transport once it takes more bytes (backpressure), or None when
        the client is going (its loss is told next; a last body part completes the answer)."""
        conn = self.conn
        if not conn.writable.is_set():
            await conn.writable.wait()
            if self.disconnected:
                return None
        transport = conn.transport
        if transport.is_closing():
            if not more:
                self.complete = True
            return None
        return transport

    def _framed(self, size: int, more: bool) -> list[bytes]:
        """What goes before `size` bytes of body: the head, if not written yet (with the
        body's length or chunked coding when the application named neither), and a chunk's
        size line."""
        out: list[bytes] = []
        head = self._head
        if head is not None:
            self._head = None
            if self._length is None and not self._chunked and not self._bodyless:
                if not more:
                    head.append(b"content-length: %d\r\n" % size)
                    self._length = size
                else:
                    head.append(b"transfer-encoding: chunked\r\n")
                    self._chunked = True
            if not self.keep_alive:
                head.append(b"connection: close\r\n")
            head.append(b"\r\n")
            out.append(b"".join(head))
        if size and not self._bodyless:
            if self._chunked:
                out.append(b"%x\r\n" % size)
            elif self._length is not None:
                if size > self._length:
                    raise RuntimeError("the body is longer than its content-length")
                self._length -= size
        return out

    def _ended(self, out: list[bytes], more: bool) -> None:
        """What goes after the last piece of body, onto `out`: the chunked body's end; an
        answer shorter than its content-length closes the connection."""
        if not more:
            if self._chunked:
                out.append(b"0\r\n\r\n")
            elif self._length and not self._bodyless:
                # Shorter than declared: the client can only tell by the connection's end.
                self.keep_alive = False

    async def _send_file(self, message: dict[str, Any]) -> None:
        """`http.response.zerocopysend`: a piece of body sent from a file by the kernel."""
        if not self.started:
            raise RuntimeError("a body before the answer's start")
        if self.complete:
            raise RuntimeError("the answer is complete already")
        more = bool(message.get("more_body", False))
        if self.disconnected:
            if not more:
                self.complete = True
            return
        file = message["file"]
        fd = file if isinstance(file, int) else file.fileno()
        offset = message.get("offset")
        if offset is None:
            offset = os.lseek(fd, 0, os.SEEK_CUR)
        count = message.get("count")
        if count is None:
            count = os.fstat(fd).st_size - offset
        transport = await self._writable(more)
        if transport is None:
            return
        out = self._framed(count, more)
        if out:
            transport.writelines(out)
        if count and not self._bodyless and not await self.conn.send_file(fd, offset, count):
            self.keep_alive = False
            if not more:
                self.complete = True
            return
        tail = [b"\r\n"] if count and self._chunked and not self._bodyless else []
        self._ended(tail, more)
        if tail:
            transport.writelines(tail)
        if not more:
            self.complete = True
            self.arrived.set()

    def _render_head(self, status: int, headers: Any) -> list[bytes]:
        line = STATUS_LINES.get(status)
        if line is None:
            line = b"HTTP/1.1 %d \r\n" % status
        head = [line]
        for name, value in self.conn.server.clock.headers():
            head.append(b"%s: %s\r\n" % (name, value))
        for name, value in headers:
            if b"\r" in value or b"\n" in value or b"\r" in name or b"\n" in name:
                raise RuntimeError("a header field of the answer holds a line break")
            lower = name.lower()
            if lower == b"content-length":
                self._length = int(value)
            elif lower == b"transfer-encoding" and value.lower() == b"chunked":
                self._chunked = True
            elif lower == b"connection" and value.lower() == b"close":
                self.keep_alive = False
                continue  # written below with the rest of the connection's fate
            head.append(b"%s: %s\r\n" % (name, value))
        return head


# -- one process ---------------------------------------------------------------------------


class Serving:
    """One process's server: the lifespan around its listening sockets."""

    def __init__(self, app: App, config: ServerConfig, sockets: list[socket.socket]) -> None:
        self.server = Server(app, config)
        self.sockets = sockets
        self.started = False
        self._stop = asyncio.Event()
        self._lifespan: _Lifespan | None = None

    def stop(self) -> None:
        self._stop.set()

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self.stop)
        lifespan = self._lifespan = _Lifespan(self.server.app, self.server.state)
        if not await lifespan.startup():
            return
        config = self.server.config
        listeners = []
        for sock in self.sockets:
            listeners.append(
                await loop.create_server(
                    self.server.protocol,
                    sock=sock,
                    ssl=config.ssl,
                    ssl_handshake_timeout=config.limits.head_timeout if config.ssl else None,
                    backlog=2048,
                )
            )
        self.started = True
        log.info("worker %d started", os.getpid())
        await self._stop.wait()
        for listener in listeners:
            listener.close()
        await self.server.drain()
        for listener in listeners:
            with contextlib.suppress(Exception):
                await listener.wait_closed()
        await lifespan.shutdown()


class _Lifespan:
    """The ASGI lifespan protocol, as the server's side of it."""

    def __init__(self, app: App, state: dict[str, Any]) -> None:
        self._app = app
        self._state = state
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._answers: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        scope = {"type": "lifespan", "asgi": _ASGI, "state": self._state}
        try:
            await self._app(scope, self._inbox.get, self._answers.put)
        except BaseException as exc:
            await self._answers.put({"type": "failed", "message": repr(exc)})
            if not isinstance(exc, Exception):
                raise

    async def startup(self) -> bool:
        self._task = asyncio.create_task(self._run())
        await self._inbox.put({"type": "lifespan.startup"})
        answer = await self._answers.get()
        if answer["type"] != "lifespan.startup.complete":
            log.error("the node did not start: %s", answer.get("message", answer["type"]))
            return False
        return True

    async def shutdown(self) -> None:
        await self._inbox.put({"type": "lifespan.shutdown"})
        answer = await self._answers.get()
        if answer["type"] != "lifespan.shutdown.complete":
            log.error("the node did not stop cleanly: %s", answer.get("message", answer["type"]))
        if self._task is not None:
            with contextlib.suppress(BaseException):
                await self._task


def serve_process(app: App, config: ServerConfig, sockets: list[socket.socket]) -> bool:
    """Serve in this process until SIGINT or SIGTERM; False when the node did not start."""
    serving = Serving(app, config, sockets)
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(serving.serve())
    return serving.started


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
        return None
    return uvloop.new_event_loop


# -- the node's workers --------------------------------------------------------------------

# Exit status of a worker whose node did not start (its lifespan failed).
NOT_STARTED = 3


def run_workers(
    make_app: Callable[[], App],
    config: ServerConfig,
    sockets: list[socket.socket],
    workers: int,
    started: Callable[[], None],
) -> int:
    """Fork `workers` processes serving `sockets`, each building its app with `make_app`;
    replace a worker that dies; on SIGINT or SIGTERM stop them (each drains gracefully) and
    return. This process must have no other thread when it forks: `started` runs after the
    first forks. The exit status: 0, or NOT_STARTED when no worker's node ever started."""
    supervisor = _Supervisor(make_app, config, sockets, workers)
    return supervisor.run(started)


class _Supervisor:
    def __init__(
        self,
        make_app: Callable[[], App],
        config: ServerConfig,
        sockets: list[socket.socket],
        workers: int,
    ) -> None:
        self._make_app = make_app
        self._config = config
        self._sockets = sockets
        self._workers = workers
        self._children: dict[int, int] = {}  # pid -> the read end of its "started" pipe
        self._ever_started = False
        self._stopping: int | None = None  # the signal that stops the node

    def _fork(self) -> None:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                os.close(read)
                for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
                    signal.signal(signum, signal.SIG_DFL)
                signal.set_wakeup_fd(-1)
                code = _worker(self._make_app, self._config, self._sockets, write)
            except BaseException:
                log.exception("worker %d failed", os.getpid())
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        os.close(write)
        os.set_blocking(read, False)
        self._children[pid] = read

    def run(self, started: Callable[[], None]) -> int:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        old_wakeup = signal.set_wakeup_fd(wake_w)
        handlers = {}

        def stop(signum: int, _frame: Any) -> None:
            if self._stopping is None:
                self._stopping = signum

        for signum in (signal.SIGINT, signal.SIGTERM):
            handlers[signum] = signal.signal(signum, stop)
        handlers[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda *_: None)
        try:
            for _ in range(self._workers):
                self._fork()
            started()
            return self._supervise(wake_r)
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
            os.close(wake_r)
            os.close(wake_w)

    def _supervise(self, wake: int) -> int:
        selector = selectors.DefaultSelector()
        selector.register(wake, selectors.EVENT_READ)
        try:
            while True:
                self._note_started()
                if self._stopping is not None:
                    return self._stop_all()
                failed_start = self._reap()
                if failed_start and not self._ever_started:
                    log.error("the node's workers could not start")
                    self._stopping = signal.SIGTERM
                    self._stop_all()
                    return NOT_STARTED
                for _ in range(self._workers - len(self._children)):
                    if self._stopping is None:
                        log.warning("a worker died; starting another")
                        self._fork()
                selector.select(timeout=1.0)
                with contextlib.suppress(BlockingIOError):
                    os.read(wake, 512)
        finally:
            selector.close()

    def _note_started(self) -> None:
        for read in self._children.values():
            with contextlib.suppress(BlockingIOError, OSError):
                if os.read(read, 1):
                    self._ever_started = True

    def _reap(self) -> bool:
        """Collect dead workers; True when one of them exited without having started."""
        failed = False
        while self._children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            read = self._children.pop(pid, None)
            if read is None:
                continue
            with contextlib.suppress(BlockingIOError, OSError):
                if os.read(read, 1):
                    self._ever_started = True
            os.close(read)
            if os.waitstatus_to_exitcode(status) == NOT_STARTED:
                failed = True
        return failed

    def _stop_all(self) -> int:
        for pid in self._children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + self._config.graceful_timeout + 10.0
        while self._children and time.monotonic() < deadline:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.05)
                continue
            read = self._children.pop(pid, None)
            if read is not None:
                os.close(read)
        for pid in self._children:  # past the deadline
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self._children.clear()
        return 0 if self._ever_started else NOT_STARTED


def _worker(
    make_app: Callable[[], App], config: ServerConfig, sockets: list[socket.socket], tell: int
) -> int:
    app = make_app()

    async def told_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return

        async def send_and_tell(message: dict[str, Any]) -> None:
            if message["type"] == "lifespan.startup.complete":
                with contextlib.suppress(OSError):
                    os.write(tell, b"1")
            await send(message)

        await app(scope, receive, send_and_tell)

    ok = serve_process(told_app, config, sockets)
    return 0 if ok else NOT_STARTED
