"""The node's HTTP edge: uvicorn's httptools protocol with a bounded request head, a time
limit for reading one, and a cap on open connections per listening port.

httptools (llhttp) sets no limit of its own: it hands over the request target and each header
field whole, however long, and uvicorn keeps them all. Here every piece is counted as it is
parsed, and a head past a limit is answered (431, 414), a head not finished in time is
answered (408), a connection past the cap is answered (503 SlowDown) at once, and each is
then closed. The limits hold for both listening sockets, the S3 port and the fleet's port.
"""

from __future__ import annotations

import asyncio
import logging
import math
import multiprocessing
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httptools
import uvicorn
from prometheus_client import Counter as MetricCounter
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from gateway import errors
from gateway.config import Settings
from gateway.counters import REGISTRY
from gateway.s3.http import new_request_id

log = logging.getLogger("gateway.edge")

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


@dataclass(frozen=True)
class EdgeLimits:
    """What one worker process accepts (docs/configuration.md, "The HTTP edge")."""

    max_request_line: int = 16 << 10  # bytes of the request target: path and query
    max_header_bytes: int = 32 << 10  # bytes of the header fields: names and values
    max_headers: int = 128  # header fields of one request
    head_timeout: float = 10.0  # seconds to receive a whole request head
    keepalive_timeout: int = 5  # seconds an idle connection is kept between requests
    max_connections: int = 1024  # open connections per listening port (of this process)

    def __post_init__(self) -> None:
        for name in ("max_request_line", "max_header_bytes", "max_headers", "max_connections"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if not self.head_timeout > 0 or not math.isfinite(self.head_timeout):
            raise ValueError("head_timeout must be a positive number of seconds")
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
            max_connections=s.max_connections,
        )


class EdgeConfig(uvicorn.Config):
    """uvicorn's configuration with the edge's limits; it travels to worker processes whole
    (pickled), so each worker's protocol finds the limits where it finds the rest."""

    def __init__(self, app: Any, limits: EdgeLimits, **kwargs: Any) -> None:
        super().__init__(
            app,
            http=EdgeProtocol,
            ws="none",
            timeout_keep_alive=limits.keepalive_timeout,
            **kwargs,
        )
        self.limits = limits
        # Connections open in this process, per listening port (the fleet's port has its
        # own count, so a flood of clients cannot crowd out the peers).
        self.open_connections: Counter[int] = Counter()


def run_workers(
    config: EdgeConfig, sockets: list[socket.socket], started: Callable[[], None]
) -> None:
    """Serve with `config.workers` worker processes under uvicorn's supervisor, each forked
    from this process, which has imported the gateway already (gunicorn's "preload"): a
    worker is ready in a fraction of a second where a spawned one imports it all again
    (~2.5 s of CPU each on a small machine, for every worker of every node started). This
    process must have no other thread when it forks: `started` runs once the first workers
    are, and the supervisor itself runs none. The supervisor forks again to replace a worker
    that dies, from the same quiet state."""
    from uvicorn import _subprocess
    from uvicorn.supervisors.multiprocess import Multiprocess

    class Supervisor(Multiprocess):
        def init_processes(self) -> None:
            super().init_processes()
            started()

    if "fork" in multiprocessing.get_all_start_methods() and hasattr(_subprocess, "spawn"):
        # uvicorn spawns its workers through this context (uvicorn/_subprocess.py).
        setattr(_subprocess, "spawn", multiprocessing.get_context("fork"))  # noqa: B010
    Supervisor(config, sockets=sockets).run()


class _Refused(Exception):
    """Raised inside a parser callback to stop parsing and answer with `error`."""

    def __init__(self, error: errors.S3Error, reason: str) -> None:
        super().__init__(reason)
        self.error = error
        self.reason = reason


class EdgeProtocol(HttpToolsProtocol):
    """One HTTP/1.1 connection, as uvicorn serves it, with the edge's limits."""

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        if not isinstance(config, EdgeConfig):
            raise TypeError("EdgeProtocol needs an EdgeConfig")
        limits = self._limits = config.limits
        # Read on every request: kept as plain attributes (a hit costs microseconds).
        self._max_request_line = limits.max_request_line
        self._max_header_bytes = limits.max_header_bytes
        self._max_headers = limits.max_headers
        self._open = config.open_connections
        self._port: int | None = None  # the listening port this connection is counted on
        self._answered = False  # a refusal is written: what the client still sends is dropped
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
        self._progress = False
        self._fast: FastAnswer | None = None  # this port's answer to plain hits, if any
        self._fast_answer: list[bytes | memoryview] | None = None  # to the request parsed
        self._fast_keep_alive = True

    # -- connection ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        port = _local_port(transport)
        if self._open[port] >= self._limits.max_connections:
            self.transport = transport
            self._refuse(
                errors.SlowDown("The node has reached its limit of open connections."),
                "connection_limit",
            )
            return
        self._open[port] += 1
        self._port = port
        self._fast = _FAST.get(port)
        super().connection_made(transport)
        self._head_since = self.loop.time()
        self._head_timer = self.loop.call_later(self._limits.head_timeout, self._check_head)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._port is not None:
            self._open[self._port] -= 1
            self._port = None
        for timer in (self._head_timer, self._linger):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._linger = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._answered:
            return
        self._unset_keepalive_if_required()
        self._progress = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # No protocol to upgrade to (websockets are off): the request is served as a
            # plain one, as uvicorn does.
            return
        except httptools.HttpParserError as exc:
            refused = exc.__context__  # what a callback raised
            if isinstance(refused, _Refused):
                self._refuse(refused.error, refused.reason)
            else:
                self._refuse(
                    errors.InvalidRequest("The request is not valid HTTP/1.1."), "not_http"
                )
            return
        if self._progress:
            self._silent = 0
            return
        self._silent += len(data)
        if self._silent > self._max_header_bytes:
            self._refuse(_header_too_large(self._limits), "header_section_too_large")

    # -- parser callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._progress = self._asked = True
        self._field_bytes = 0
        self._head_since = self.loop.time()

    def on_url(self, url: bytes) -> None:
        self._progress = True
        self.url += url
        if len(self.url) > self._max_request_line:
            raise _Refused(
                errors.RequestURITooLong(MaxSizeAllowed=str(self._max_request_line)),
                "request_line_too_long",
            )

    def on_header(self, name: bytes, value: bytes) -> None:
        # uvicorn's own on_header, inlined with the counting: called ~10 times a request.
        self._progress = True
        self._field_bytes += len(name) + len(value)
        if self._field_bytes > self._max_header_bytes or len(self.headers) >= self._max_headers:
            raise _Refused(_header_too_large(self._limits), "header_section_too_large")
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._progress = True
        self._head_since = None
        fast = self._fast
        if (
            fast is not None
            and (self.cycle is None or self.cycle.response_complete)
            and not self.pipeline
            and not self.flow.write_paused  # a client that does not read gets no more
        ):
            parser = self.parser
            keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive()
            answer = fast(
                parser.get_method(), self.url, self.headers, keep_alive,
                self.server_state.default_headers,
            )  # fmt: skip
            if answer is not None:
                self._fast_answer = answer
                self._fast_keep_alive = keep_alive
                return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._progress = True
        super().on_body(body)

    def on_chunk_header(self) -> None:
        self._progress = True

    def on_chunk_complete(self) -> None:
        self._progress = True

    def on_message_complete(self) -> None:
        self._progress = True
        answer = self._fast_answer
        if answer is None:
            super().on_message_complete()
            return
        # Answered at the edge: written in order (no request of this connection is under
        # way), then on as uvicorn goes on after a response.
        self._fast_answer = None
        transport = self.transport
        if transport.is_closing():
            return
        if len(answer) == 1:
            transport.write(answer[0])
        else:
            transport.writelines(answer)
        FAST_ANSWERS.inc()
        if not self._fast_keep_alive:
            transport.close()
            return
        self._unset_keepalive_if_required()
        self.on_response_complete()

    # -- refusals ------------------------------------------------------------------------

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
            CLOSED.labels("idle").inc()
            self.transport.close()
            return
        self._refuse(
            errors.RequestTimeout(
                f"The request head was not received within {self._limits.head_timeout:g} seconds."
            ),
            "head_timeout",
        )

    def _refuse(self, error: errors.S3Error, reason: str) -> None:
        """Answer `error` and close. A request whose response is under way (a pipelined
        request, trailers of a body being read) has no room for another answer: its
        connection is closed."""
        self._answered = True
        _report(reason)
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        transport = self.transport
        if self.cycle is not None and not self.cycle.response_complete:
            transport.close()
            return
        transport.write(_render(error, self.server_state.default_headers))
        if not transport.can_write_eof():  # TLS: close_notify follows the answer
            transport.close()
            return
        transport.write_eof()
        transport.resume_reading()
        self._linger = self.loop.call_later(LINGER, transport.close)


# The answers to plain cache hits, by listening port (the S3 port; never the fleet's): set by
# the node of this process once it has started (gateway/s3/fast.py).
FastAnswer = Callable[
    [bytes, bytes, list[tuple[bytes, bytes]], bool, list[tuple[bytes, bytes]]],
    list[bytes | memoryview] | None,
]
_FAST: dict[int, FastAnswer] = {}


def install_fast_path(port: int, answer: FastAnswer | None) -> None:
    """Answer plain cache hits on `port` with `answer` (None: stop), in this process."""
    if answer is None:
        _FAST.pop(port, None)
    else:
        _FAST[port] = answer


def _local_port(transport: asyncio.BaseTransport) -> int:
    name = transport.get_extra_info("sockname")
    return int(name[1]) if isinstance(name, tuple) else 0


def _header_too_large(limits: EdgeLimits) -> errors.S3Error:
    return errors.RequestHeaderSectionTooLarge(
        f"The request's header fields exceed {limits.max_header_bytes} bytes or"
        f" {limits.max_headers} fields.",
        MaxSizeAllowed=str(limits.max_header_bytes),
    )


def _render(error: errors.S3Error, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    request_id = new_request_id()
    body = error.to_xml(request_id)
    head = [STATUS_LINE[error.status]]
    for name, value in default_headers:
        head += [name, b": ", value, b"\r\n"]
    head += [
        b"content-type: application/xml\r\n",
        b"content-length: %d\r\n" % len(body),
        b"x-amz-request-id: " + request_id.encode() + b"\r\n",
        b"connection: close\r\n\r\n",
    ]
    return b"".join(head) + body


_reported: dict[str, tuple[float, int]] = {}


def _report(reason: str) -> None:
    """Count a refusal; log it, but not more than once per REPORT_EVERY seconds a reason, so
    that an attack cannot flood the log."""
    CLOSED.labels(reason).inc()
    now = time.monotonic()
    last, count = _reported.get(reason, (-REPORT_EVERY, 0))
    if now - last < REPORT_EVERY:
        _reported[reason] = (last, count + 1)
        return
    _reported[reason] = (now, 0)
    more = f" (and {count} more since the last report)" if count else ""
    log.warning("edge: closed a connection: %s%s", reason, more)
