"""The node's own HTTP/1.1 protocol: an `asyncio.Protocol` over httptools' parser (llhttp) on
uvloop, built on public APIs only, with the edge's limits (gateway/edge.py) and its answers to
plain hits made in the parser's callback, before any request cycle exists.

Everything that is not such a hit is handed, in this process and without a second parse, to
the node's ASGI application as an exchange (gateway/server/exchange.py): keep-alive,
pipelining (one exchange at a time per connection, the next one parsed and held; a plain hit
is answered at the edge only when nothing of the connection is under way), backpressure both
ways (reading paused while an exchange's unread body is large or a pipelined request waits;
answers sent through the connection's outbox, gateway/server/sends.py, at the socket's pace),
and timeouts: the head (408, or closed when nothing was asked), the idle connection between
requests, the TLS handshake, a client that takes nothing of its answer.

A request refused by the edge (malformed, past a limit) is answered after the requests taken
up before it, which are carried out and answered in order; nothing after it is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections import Counter, deque
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any, cast
from urllib.parse import unquote

import httptools

from gateway import errors
from gateway.bounded import Bounded
from gateway.edge import (
    FAST_ANSWERED,
    EdgeLimits,
    FastAnswer,
    HeadGuard,
    Refused,
    fast_path,
    render_refusal,
    report_refusal,
)
from gateway.server.accept import Loads
from gateway.server.exchange import ZEROCOPY, App, Exchange
from gateway.server.sends import Outbox

# Bytes of request body buffered for an exchange before the connection stops reading.
BODY_HIGH_WATER = 256 << 10
ASGI_VERSION = {"version": "3.0", "spec_version": "2.3"}
_ZEROCOPY_EXTENSIONS: dict[str, Any] = {ZEROCOPY: {}}
# Request heads answered at the edge, as they arrived (one whole request in one read, nothing
# after it) and as the parser read them: [method, target, header fields, whether HTTP keeps
# the connection alive]. The same bytes again (a presigned URL's GET, as clients repeat it)
# are not parsed again: parsing the head cost more than a fifth of a small hit. Only heads
# without an Authorization header (a presigned URL's, an anonymous one's: a header-signed
# request carries its date and differs each time), of _HEAD_MAX bytes at most, _HEADS_KEPT.
ParsedHead = tuple[bytes, bytes, list[tuple[bytes, bytes]], bool]
_HEAD_MAX = 2048
_HEADS_KEPT = 4096
_HEADS: Bounded[bytes, ParsedHead] = Bounded(_HEADS_KEPT)


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
        # The node's workers' counts of open connections (accept.py), and this one's slot.
        self.loads: Loads | None = None
        self.slot = 0
        self._starting = 0  # connections accepted, not yet begun (accept.Counted)

    def load(self) -> int:
        return len(self.connections) + self._starting

    def accepted(self) -> None:
        self._starting += 1
        self._publish()

    def begun(self) -> None:
        self._starting -= 1
        self._publish()

    def ahead(self) -> bool:
        return self.loads is not None and self.loads.ahead(self.slot, self.load())

    def _publish(self) -> None:
        if self.loads is not None:
            self.loads.set(self.slot, self.load())

    def opened(self, conn: Connection) -> None:
        self.connections.add(conn)
        self._publish()

    def closed(self, conn: Connection) -> None:
        self.connections.discard(conn)
        self._publish()
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
        self.outbox: Outbox = None  # type: ignore[assignment]
        self.parser = httptools.HttpRequestParser(self)
        with contextlib.suppress(AttributeError):  # httptools < 0.6.3
            # A request pipelined after one with `Connection: close` is not an error.
            self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self._port: int | None = None  # the listening port this connection is counted on
        self._sockname: tuple[str, int] | None = None
        self._peername: tuple[str, int] | None = None
        self._scheme = "http"
        self._fast: FastAnswer | None = None
        self._files = False  # bodies in files are sent from the page cache (plain TCP)
        # The request being parsed.
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._field_bytes = 0
        self._expect_continue = False
        self._parsing: Exchange | None = None  # the exchange the parser feeds a body to
        self._fast_answer: tuple[bytes, Any] | None = None
        self._fast_keep_alive = True
        self._between = True  # the parser is between two messages
        self._begun = 0  # messages begun in the data being parsed
        self._learned: ParsedHead | None = None  # the head it answered at the edge, if any
        # Exchanges: the one answering, and those parsed behind it.
        self.running: Exchange | None = None
        self._pipeline: deque[Exchange] = deque()
        self._rejected: Exchange | None = None  # a running exchange whose request is refused
        # Reading is paused for a body not yet read by the application or for a pipelined
        # request.
        self._paused_for_body = False
        self._paused_for_pipeline = False
        self._close_when_sent = False  # closed once the outbox has handed everything over
        # One keep-alive timer per connection, re-armed as it fires (arming and cancelling one
        # per request costs more than a small hit's parsing): it closes the connection once
        # it has been idle, between two requests, for the keep-alive timeout.
        self._idle_timer: asyncio.TimerHandle | None = None
        self._idle_since: float | None = None  # loop time the connection went idle
        self.lost = False

    # -- connection ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are asyncio.Transport in all but class.
        self.transport = transport = cast(asyncio.Transport, transport)
        sock_fd = -1  # the socket's descriptor, for sendfile (plain TCP only)
        if transport.get_extra_info("sslcontext") is not None:
            self._scheme = "https"
        else:
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                sock_fd = sock.fileno()
        self._files = sock_fd >= 0
        self.outbox = Outbox(transport, sock_fd, self.body_timeout, self)
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
        server.opened(self)
        self._port = port
        self._sockname = (str(sockname[0]), port) if isinstance(sockname, tuple) else None
        peer = transport.get_extra_info("peername")
        self._peername = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else None
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
        if self.outbox is not None:
            self.outbox.lost()
        for exchange in (self.running, *self._pipeline):
            if exchange is not None:
                exchange.disconnect()
        self._pipeline.clear()

    def eof_received(self) -> bool | None:
        # The client sends no more: the connection closes (an exchange under way is told
        # its client went away), as HTTP/1.1 servers commonly treat a half-close; an answer
        # made at the edge and still going out is sent whole first.
        if self.running is None and not self._pipeline and not self.outbox.idle:
            self._close_after_answers()
            return True
        return None

    def pause_writing(self) -> None:
        self.outbox.pause()

    def resume_writing(self) -> None:
        self.outbox.resume()

    def data_received(self, data: bytes) -> None:
        if self._fast is None or not self._between or len(data) > _HEAD_MAX:
            self.feed(data)
            return
        head = _HEADS.get(data)
        if head is not None and self._replay(head):
            return
        self._begun = 0
        self._learned = None
        self.feed(data)
        learned = self._learned
        if learned is not None and self._begun == 1 and self._between:
            # One whole request, answered at the edge: its bytes are known from now on.
            _HEADS.put(data, learned)

    def _replay(self, head: ParsedHead) -> bool:
        """Answer a request whose head is the same bytes as one parsed and answered at the
        edge before, as the parser's callbacks would; False (nothing sent) when the edge
        does not answer it now: the parser then reads it as any other."""
        if self._answered or self.running is not None or self._pipeline or not self.outbox.idle:
            return False
        fast = self._fast
        if fast is None:
            return False
        method, target, fields, keep_alive = head
        self.message_begun()
        self.head_done()
        self._silent = 0
        self._idle_since = None
        keep_alive = keep_alive and not self.server.stopping
        answer = fast(method, target, fields, keep_alive, self.server.clock.headers(), self._files)
        if answer is None:
            return False
        self._send_fast(answer, keep_alive)
        return True

    # -- parser callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.message_begun()
        self._between = False
        self._begun += 1
        self._idle_since = None  # asked again: not idle
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
        alive = version != "1.0" and parser.should_keep_alive()
        keep_alive = alive and not self.server.stopping
        fast = self._fast
        if (
            fast is not None
            and self.running is None
            and not self._pipeline
            and self.outbox.idle  # one answer at a time is sent from the edge
        ):
            method = parser.get_method()
            answer = fast(
                method, self._url, self._headers, keep_alive, self.server.clock.headers(),
                self._files,
            )  # fmt: skip
            if answer is not None:
                self._fast_answer = answer
                self._fast_keep_alive = keep_alive
                self._parsing = None
                if not any(name == b"authorization" for name, _ in self._headers):
                    self._learned = (method, self._url, self._headers, alive)
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
            "asgi": ASGI_VERSION,
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
        if self._files:
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
        self._between = True
        answer = self._fast_answer
        if answer is None:
            exchange = self._parsing
            if exchange is not None:
                exchange.more_body = False
                exchange.arrived.set()
            self._parsing = None
            return
        self._fast_answer = None
        self._send_fast(answer, self._fast_keep_alive)

    def _send_fast(self, answer: tuple[bytes, Any], keep_alive: bool) -> None:
        """Send an answer made at the edge; then wait for the next request, or close."""
        FAST_ANSWERED.pending += 1  # published with the request metrics (counters.py)
        head, body = answer
        outbox = self.outbox
        if body is None:
            outbox.send((head,))
        elif isinstance(body, bytes | memoryview):
            outbox.send((head, body))
        elif body.reading is None:  # a region of a block file, closed once sent
            outbox.send_file(body.fd, body.offset, body.count, body.close, head)
        else:  # the same, being read in from the disk first: an error answered if that fails
            failed = body.failed or self._unread
            outbox.send_file(
                body.fd, body.offset, body.count, body.close, head, body.reading, failed
            )
        if not keep_alive:
            self._close_after_answers()
        else:
            self._idle()

    def _unread(self) -> bytes:
        """The answer sent instead of a body in a file that could not be read in, when its
        maker gave none of its own (the edge's: s3/fast.py): S3's InternalError, retried."""
        return render_refusal(errors.InternalError(), self.server.clock.headers())

    # -- exchanges -----------------------------------------------------------------------

    def _start(self, exchange: Exchange) -> None:
        self.running = exchange
        exchange.task = self.loop.create_task(exchange.run(self.server.app))

    def body_read(self) -> None:
        """The application took the buffered body: reading goes on."""
        if self._paused_for_body:
            self._paused_for_body = False
            if not self._paused_for_pipeline:
                self._resume_reading()

    def finished(self, exchange: Exchange) -> None:
        """`exchange` has sent its whole answer (or failed)."""
        if self.running is not exchange:
            return
        self.running = None
        refused = exchange is self._rejected  # told its client went away: the refusal follows
        if not (exchange.keep_alive or refused) or self.transport.is_closing():
            self._close_after_answers()
            return
        if self._pipeline:
            self._start(self._pipeline.popleft())
            if not self._pipeline and self._paused_for_pipeline:
                self._paused_for_pipeline = False
                if not self._paused_for_body:
                    self._resume_reading()
            return
        if self._refusal is not None:
            self._settle()
            return
        if self.server.stopping:
            self._close_after_answers()
            return
        self._idle()

    def sent(self) -> None:
        """The outbox has handed everything over (sends.Owner)."""
        if self._close_when_sent:
            self.transport.close()
        elif self._refusal is not None:
            self._settle()

    def _settle(self) -> None:
        """A refusal waits for the answers before it: sent once none is under way."""
        if self._refusal is not None and not self.answering():
            self.send_refusal()

    def _close_after_answers(self) -> None:
        """Close once what the outbox holds is handed over (at once if nothing)."""
        if self.outbox.idle:
            if not self.transport.is_closing():
                self.transport.close()
        else:
            self._close_when_sent = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if not self.lost and not self._answered and not self._close_when_sent:
            self.transport.resume_reading()

    def _idle(self) -> None:
        """Between requests: closed after the keep-alive timeout unless asked again."""
        if self._paused_for_pipeline:
            self._paused_for_pipeline = False
            if not self._paused_for_body:
                self._resume_reading()
        self._idle_since = self.loop.time()
        if self._idle_timer is None:
            self._idle_timer = self.loop.call_later(
                self.server.limits.keepalive_timeout, self._close_idle
            )

    def _close_idle(self) -> None:
        self._idle_timer = None
        if self.transport.is_closing():
            return
        keepalive = self.server.limits.keepalive_timeout
        wait = float(keepalive)
        since = self._idle_since
        # Not idle while a request is read or answered, or an answer is still going out.
        if since is not None and self.running is None and self.outbox.idle:
            idle_for = self.loop.time() - since
            if idle_for >= keepalive:
                self.transport.close()
                return
            wait = keepalive - idle_for
        self._idle_timer = self.loop.call_later(wait, self._close_idle)

    def stop(self) -> None:
        """A graceful shutdown: an idle connection closes now, a busy one after its answer."""
        if self.running is None and not self._pipeline:
            self._close_after_answers()
            return
        for exchange in (self.running, *self._pipeline):
            if exchange is not None:
                exchange.keep_alive = False

    def abort(self) -> None:
        if self.running is not None and self.running.task is not None:
            self.running.task.cancel()
        self.transport.abort()

    # -- what the exchanges and the outbox ask -----------------------------------------

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def date_headers(self) -> list[tuple[bytes, bytes]]:
        return self.server.clock.headers()

    def send_timed_out(self) -> None:
        """The client took nothing of its answer for `body_timeout` seconds (sends.Owner)."""
        self.cut_off("send_timeout")

    def cut_off(self, reason: str) -> None:
        report_refusal(reason)
        self.transport.abort()

    def refuse_during(self, error: errors.S3Error, reason: str) -> None:
        """Answer `error` for the running exchange, whose answer has not begun, and close."""
        self._answered = True
        report_refusal(reason)
        self.outbox.send((render_refusal(error, self.server.clock.headers()),))
        self._close_after_answers()

    # -- the edge's refusals (HeadGuard) ---------------------------------------------------

    def answering(self) -> bool:
        return self.running is not None or bool(self._pipeline) or not self.outbox.idle

    def rejecting(self) -> None:
        bad, self._parsing = self._parsing, None
        if bad is None:
            return  # what is wrong is a request's head: nothing of it was taken up
        if bad in self._pipeline:
            self._pipeline.remove(bad)  # parsed behind the others: never run
        elif bad is not self.running:
            return  # answered already (without its whole body): the refusal follows
        elif bad.started:
            self._refusal = b""  # it answered already: the connection closes after it
        else:
            self._rejected = bad
            bad.disconnect()  # its body is what is wrong: the application is told

    def default_headers(self) -> list[tuple[bytes, bytes]]:
        return self.server.clock.headers()
