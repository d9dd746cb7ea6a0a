"""The node's HTTP edge: a bounded request head, a time limit for reading one, and a cap on
open connections per listening port, held by both HTTP servers a node can run: its own
(gateway/server.py, the default) and uvicorn's httptools protocol (gateway/edge_uvicorn.py,
`--server uvicorn`).

httptools (llhttp) sets no limit of its own: it hands over the request target and each header
field whole, however long. Here every piece is counted as it is
parsed, and a head past a limit is answered (431, 414), a head not finished in time is
answered (408), a connection past the cap is answered (503 SlowDown) at once, and each is
then closed. The limits hold for both listening sockets, the S3 port and the fleet's port.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus

from prometheus_client import Counter as MetricCounter

from gateway import errors
from gateway.config import Settings
from gateway.counters import REGISTRY
from gateway.s3.http import new_request_id

log = logging.getLogger("gateway.edge")

STATUS_LINES = {
    int(s): b"HTTP/1.1 %d %s\r\n" % (int(s), s.phrase.encode()) for s in HTTPStatus
}  # the status lines of the codes Python knows

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
    body_timeout: float = 60.0  # seconds a request body may send nothing (own server only)
    max_connections: int = 1024  # open connections per listening port (of this process)

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


# The answers to plain cache hits, by listening port (the S3 port; never the fleet's): set by
# the node of this process once it has started (gateway/s3/fast.py).
FastAnswer = Callable[
    [bytes, bytes, list[tuple[bytes, bytes]], bool, list[tuple[bytes, bytes]]],
    list[bytes | memoryview] | None,
]
_FAST: dict[int, FastAnswer] = {}


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


def render_refusal(error: errors.S3Error, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    request_id = new_request_id()
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
