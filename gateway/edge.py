"""The node's HTTP edge: a bounded request head, a time limit for reading one, and a cap on
open connections per listening port, held by both HTTP servers a node can run: its own
(gateway/server/, the default) and uvicorn's httptools protocol (gateway/edge_uvicorn.py,
`--server uvicorn`).

httptools (llhttp) sets no limit of its own: it hands over the request target and each header
field whole, however long. Here every piece is counted as it is
parsed, and a head past a limit is answered (431, 414), a head not finished in time is
answered (408), a connection past the cap is answered (503 SlowDown) at once, and each is
then closed. The limits hold for both listening sockets, the S3 port and the fleet's port.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import httptools
from prometheus_client import Counter as MetricCounter

from gateway import counters, errors
from gateway.config import Settings
from gateway.counters import REGISTRY
from gateway.s3.http import STATUS_LINES as STATUS_LINES  # the edge's names too
from gateway.s3.http import render_refusal as render_refusal

log = logging.getLogger(__name__)

# After an answer to a request that is refused, the client may still be sending; closing a
# socket with unread input makes the kernel send a reset, which can destroy the answer
# before the client reads it. So the edge half-closes, drops what still comes, and closes
# when the client does, or after this many seconds.
LINGER = 1.0
REPORT_EVERY = 10.0  # seconds between log lines about refusals of one kind

CLOSED = MetricCounter(
    "gateway_edge_closed",
    "Connections the HTTP edge answered with an error and closed (or closed idle), by reason",
    ["reason"],
    registry=REGISTRY,
)
FAST_ANSWERS = MetricCounter(
    "gateway_edge_fast_answers",
    "Requests answered at the edge from memory, without an ASGI request cycle",
    registry=REGISTRY,
)
# Counted per answer as a plain number, published with the request metrics (counters.py): an
# inc() of prometheus_client's is a locked write of a shared file with several workers.
FAST_ANSWERED = counters.deferred(FAST_ANSWERS)


@dataclass(frozen=True)
class EdgeLimits:
    """What one worker process accepts (docs/configuration.md, "The HTTP edge")."""

    max_request_line: int = 16 << 10  # bytes of the request target: path and query
    max_header_bytes: int = 32 << 10  # bytes of the header fields: names and values
    max_headers: int = 128  # header fields of one request
    head_timeout: float = 10.0  # seconds to receive a whole request head
    keepalive_timeout: int = 5  # seconds an idle connection is kept between requests
    max_connections: int = 1024  # open connections per listening port (of this process)
    body_timeout: float = 60.0  # seconds a request body may send nothing (own server only)

    def __post_init__(self) -> None:
        for name in ("max_request_line", "max_header_bytes", "max_headers", "max_connections"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in ("head_timeout", "body_timeout"):
            value = getattr(self, name)
            if not value > 0 or not math.isfinite(value):
                raise ValueError(f"{name} must be a positive number of seconds")
        if self.keepalive_timeout < 1:
            raise ValueError("keepalive_timeout must be at least 1 second")

    @classmethod
    def from_settings(cls, s: Settings) -> EdgeLimits:
        """The limits of each of the node's `workers`. The connection cap is each worker's,
        not a share of the node's: the kernel hands a new connection to whichever worker
        accepts first, often the same one, and a worker at a share of the cap would refuse
        clients its idle siblings could serve."""
        return cls(
            max_request_line=s.max_request_line,
            max_header_bytes=s.max_header_bytes,
            max_headers=s.max_headers,
            head_timeout=s.head_timeout,
            keepalive_timeout=s.keepalive_timeout,
            body_timeout=s.body_timeout,
            max_connections=s.max_connections,
        )


class Refused(Exception):
    """Raised inside a parser callback to stop parsing and answer with `error`."""

    def __init__(self, error: errors.S3Error, reason: str) -> None:
        super().__init__(reason)
        self.error = error
        self.reason = reason


class HeadGuard:
    """The edge's limits on one connection, for a protocol over httptools' parser (both
    servers' protocols inherit it): the request head counted as it is parsed, one timer per
    connection for the head's time limit, and the refusals. The protocol sets `transport`,
    `loop` and `parser`, calls `guard_start` once connected, `guard_stop` once lost, feeds
    data through `feed`, and counts the head with `message_begun`, `count_url` and
    `count_header`; it says whether an answer is under way (`answering`), drops the request
    refused (`rejecting`), calls `send_refusal` once the answers before a refusal are out, and
    gives the default header fields of its answers (`default_headers`)."""

    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    parser: httptools.HttpRequestParser

    def guard_init(self, limits: EdgeLimits) -> None:
        self._limits = limits
        # Read on every request: kept as plain attributes (a hit costs microseconds).
        self._max_request_line = limits.max_request_line
        self._max_header_bytes = limits.max_header_bytes
        self._max_headers = limits.max_headers
        self._answered = False  # a request is refused: what the client still sends is dropped
        self._refusal: bytes | None = None  # the refusal, until the answers before it are out
        # One timer per connection, re-armed as it fires, checks the head in progress (arming
        # and cancelling one per request would cost more than the rest of the edge).
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_since: float | None = None  # loop time the head in progress began
        self._asked = False  # a request has begun on this connection
        self._linger: asyncio.TimerHandle | None = None
        self._field_bytes = 0  # of the current message's header fields (trailers included)
        # Bytes parsed without any callback: a header field still being received (httptools
        # keeps a field's pieces until the field ends), or chunk extensions.
        self._silent = 0
        self.progress = False  # set by every parser callback

    def answering(self) -> bool:
        raise NotImplementedError

    def default_headers(self) -> list[tuple[bytes, bytes]]:
        raise NotImplementedError

    def guard_start(self) -> None:
        self._head_since = self.loop.time()
        self._head_timer = self.loop.call_later(self._limits.head_timeout, self._check_head)

    def guard_stop(self) -> None:
        for timer in (self._head_timer, self._linger):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._linger = None

    def feed(self, data: bytes) -> bool:
        """Parse `data`; False when the connection was refused (or had been)."""
        if self._answered:
            return False
        self.progress = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # Nothing to upgrade to: the request is served as a plain one.
            return True
        except httptools.HttpParserError as exc:
            refused = exc.__context__  # what a callback raised
            if isinstance(refused, Refused):
                self.refuse(refused.error, refused.reason)
            else:
                self.refuse(errors.InvalidRequest("The request is not valid HTTP/1.1."), "not_http")
            return False
        if self.progress:
            self._silent = 0
            return True
        self._silent += len(data)
        if self._silent > self._max_header_bytes:
            self.refuse(header_too_large(self._limits), "header_section_too_large")
            return False
        return True

    # httptools calls these between a chunked body's pieces: progress, for the silent count.
    def on_chunk_header(self) -> None:
        self.progress = True

    def on_chunk_complete(self) -> None:
        self.progress = True

    def message_begun(self) -> None:
        self.progress = self._asked = True
        self._field_bytes = 0
        self._head_since = self.loop.time()

    def head_done(self) -> None:
        self.progress = True
        self._head_since = None

    def count_url(self, length: int) -> None:
        """The request target has `length` bytes so far."""
        self.progress = True
        if length > self._max_request_line:
            raise Refused(
                errors.RequestURITooLong(MaxSizeAllowed=str(self._max_request_line)),
                "request_line_too_long",
            )

    def count_header(self, name: bytes, value: bytes, fields: int) -> None:
        """One more header field, after `fields` of them."""
        self.progress = True
        self._field_bytes += len(name) + len(value)
        if self._field_bytes > self._max_header_bytes or fields >= self._max_headers:
            raise Refused(header_too_large(self._limits), "header_section_too_large")

    def _check_head(self) -> None:
        self._head_timer = None
        if self._answered or self.transport.is_closing():
            return
        timeout = self._limits.head_timeout
        since = self._head_since
        waited = 0.0 if since is None else self.loop.time() - since
        if waited < timeout:
            self._head_timer = self.loop.call_later(timeout - waited, self._check_head)
            return
        if not self._asked:
            # Nothing was asked: an idle connection is closed without an answer.
            report_refusal("idle", log_it=False)
            self.transport.close()
            return
        self.refuse(
            errors.RequestTimeout(f"The request head was not received within {timeout:g} seconds."),
            "head_timeout",
        )

    def refuse(self, error: errors.S3Error, reason: str) -> None:
        """Answer `error` and close. Nothing the client sends after the refused request is
        read, and the requests taken up before it are answered first, in order: a server
        answers every request it carries out and carries out none after the one it refuses.
        The refused request itself, when its head was taken up (its body or trailers are
        what is wrong), is dropped by the protocol (`rejecting`)."""
        self._answered = True
        report_refusal(reason)
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self._refusal = render_refusal(error, self.default_headers())
        self.rejecting()
        if self.answering():
            # The protocol calls send_refusal() once its answers are out.
            self.transport.pause_reading()
            return
        self.send_refusal()

    def rejecting(self) -> None:
        """The request being parsed is refused: the protocol drops it if it took it up (it
        is never carried out, or it is told its client went away), or, if its answer has
        begun, sets `_refusal` to b"" (the connection closes after that answer)."""

    def send_refusal(self) -> None:
        """Write the refusal held, once no answer before it is still to go out; half-close
        and drop what the client still sends; close when it does, or after LINGER."""
        data, self._refusal = self._refusal, None
        transport = self.transport
        if data is None or transport.is_closing():
            return
        if data:
            transport.write(data)
        if not transport.can_write_eof():  # TLS: close_notify follows the answer
            transport.close()
            return
        transport.write_eof()
        transport.resume_reading()
        self._linger = self.loop.call_later(LINGER, transport.close)


class FileBody(Protocol):
    """Bytes of an open file to send as they are (the page store's FileRegion is one): whoever
    takes it sends them and closes it. `reading`: a read of them into the page cache under
    way, which the send waits for (and answers `failed()` instead of, if it fails; the
    server's own error when None), or None."""

    fd: int
    offset: int
    count: int
    reading: asyncio.Future[None] | None
    failed: Callable[[], bytes] | None

    def close(self) -> None: ...


# An answer made at the edge: its head (a small body joined to it), and a body apart: bytes in
# memory (the memory tier's, shared: not copied), or a region of a block file, sent from the
# page cache by a server that takes files, or None.
FastReply = tuple[bytes, bytes | memoryview | FileBody | None]
# The answers to plain hits, by listening port (the S3 port; never the fleet's): set by the
# node of this process once it has started (gateway/s3/fast.py). Called with the method, the
# request target, the header fields, whether the connection is kept alive, the default header
# fields, and whether the server takes a body in a file.
FastAnswer = Callable[
    [bytes, bytes, list[tuple[bytes, bytes]], bool, list[tuple[bytes, bytes]], bool],
    FastReply | None,
]
_FAST: dict[int, FastAnswer] = {}


def write_fast_answer(transport: asyncio.Transport, answer: FastReply, keep_alive: bool) -> bool:
    """Write an answer made at the edge whose body is in memory, whole, in order (no other
    answer of the connection is under way); True when the connection goes on to its next
    request. (The node's own server sends them through its outbox instead.)"""
    if transport.is_closing():
        return False
    head, body = answer
    if body is None:
        transport.write(head)
    else:
        if not isinstance(body, bytes | memoryview):
            raise TypeError("a body in a file needs a server that sends files")
        transport.writelines([head, body])
    FAST_ANSWERED.pending += 1
    if not keep_alive:
        transport.close()
        return False
    return True


def fast_path(port: int) -> FastAnswer | None:
    """The answer to plain hits on `port` in this process, if any."""
    return _FAST.get(port)


def install_fast_path(port: int, answer: FastAnswer | None) -> None:
    """Answer plain cache hits on `port` with `answer` (None: stop), in this process."""
    if answer is None:
        _FAST.pop(port, None)
    else:
        _FAST[port] = answer


def header_too_large(limits: EdgeLimits) -> errors.S3Error:
    return errors.RequestHeaderSectionTooLarge(
        f"The request's header fields exceed {limits.max_header_bytes} bytes or"
        f" {limits.max_headers} fields.",
        MaxSizeAllowed=str(limits.max_header_bytes),
    )


_reported: dict[str, tuple[float, int]] = {}


def report_refusal(reason: str, log_it: bool = True) -> None:
    """Count a refusal; log it, but not more than once per REPORT_EVERY seconds a reason, so
    that an attack cannot flood the log."""
    CLOSED.labels(reason).inc()
    if not log_it:
        return
    now = time.monotonic()
    last, count = _reported.get(reason, (-REPORT_EVERY, 0))
    if now - last < REPORT_EVERY:
        _reported[reason] = (last, count + 1)
        return
    _reported[reason] = (now, 0)
    more = f" (and {count} more since the last report)" if count else ""
    log.warning("edge: closed a connection: %s%s", reason, more)
