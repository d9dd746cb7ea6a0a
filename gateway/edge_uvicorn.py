"""`gateway serve --server uvicorn`: the plain-ASGI fallback. uvicorn's httptools protocol with
the edge's limits (gateway/edge.py) and its answers to plain hits, and uvicorn's supervisor
for the workers. It leans on uvicorn's protocol class and attributes (`cycle`, `pipeline`,
`flow`, `server_state`): the node's own server (gateway/server.py) is the default and needs
none of them; this one is kept working and tested as the fallback.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import socket
from collections import Counter
from collections.abc import Callable
from typing import Any

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from gateway import errors
from gateway.edge import (
    CLOSED,
    FAST_ANSWERS,
    LINGER,
    EdgeLimits,
    FastAnswer,
    fast_path,
    header_too_large,
    render_refusal,
    report_refusal,
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
        self._fast = fast_path(port)
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
            self._refuse(header_too_large(self._limits), "header_section_too_large")

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
            raise _Refused(header_too_large(self._limits), "header_section_too_large")
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
        report_refusal(reason)
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        transport = self.transport
        if self.cycle is not None and not self.cycle.response_complete:
            transport.close()
            return
        transport.write(render_refusal(error, self.server_state.default_headers))
        if not transport.can_write_eof():  # TLS: close_notify follows the answer
            transport.close()
            return
        transport.write_eof()
        transport.resume_reading()
        self._linger = self.loop.call_later(LINGER, transport.close)


def _local_port(transport: asyncio.BaseTransport) -> int:
    name = transport.get_extra_info("sockname")
    return int(name[1]) if isinstance(name, tuple) else 0
