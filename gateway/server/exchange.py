"""One HTTP exchange of the node's own server as the ASGI application sees it: the request's
body handed to `receive` as it arrives (with `Expect: 100-continue` answered on the first
call), and the answer framed (content-length or chunked, HEAD, 204 and 304 without a body) and
queued on the connection's outbox (gateway/server/sends.py), whose pace `send` waits on: the
application is at most one message ahead of the socket."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from gateway import errors
from gateway.edge import STATUS_LINES
from gateway.server.sends import Outbox

log = logging.getLogger(__name__)

App = Callable[[dict[str, Any], Callable[[], Awaitable[dict[str, Any]]], Any], Awaitable[None]]

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_NO_BODY_STATUS = frozenset({204, 304})
# The ASGI extension for bodies sent from a file by the kernel (sendfile(2)): offered on plain
# TCP connections, never over TLS (the bytes would bypass the encryption).
ZEROCOPY = "http.response.zerocopysend"


class Conn(Protocol):
    """What an exchange needs of its connection (gateway/server/protocol.py)."""

    outbox: Outbox
    body_timeout: float

    def is_closing(self) -> bool: ...

    def date_headers(self) -> list[tuple[bytes, bytes]]: ...

    def body_read(self) -> None: ...

    def finished(self, exchange: Exchange) -> None: ...

    def refuse_during(self, error: errors.S3Error, reason: str) -> None: ...

    def cut_off(self, reason: str) -> None: ...


class Exchange:
    """One request and its answer, as the ASGI application sees them."""

    def __init__(
        self,
        conn: Conn,
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
            if not self.started and not self.conn.is_closing():
                self.conn.outbox.send((_CONTINUE,))
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
        if not self.started and not conn.is_closing():
            conn.refuse_during(
                errors.RequestTimeout(
                    "Your socket connection to the server was not read from or written to"
                    f" within the timeout period ({conn.body_timeout:g} s of a request body)."
                ),
                "body_timeout",
            )
        else:
            conn.cut_off("body_timeout")
        self.keep_alive = False
        self.disconnect()

    # -- ASGI send -----------------------------------------------------------------------

    async def send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if self.disconnected:  # nobody to answer: what the application sends is dropped
            if kind != "http.response.start" and not message.get("more_body", False):
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
        if not self._open(more):
            return
        out: list[bytes | memoryview] = list(self._framed(len(body), more))
        if body and not self._bodyless:
            out.append(body)
            if self._chunked:
                out.append(b"\r\n")
        self._ended(out, more)
        if out:
            self.conn.outbox.send(out)
        await self._sent(more)

    async def _sent(self, more: bool) -> None:
        """Wait until what is queued is handed over; the last part completes the answer."""
        outbox = self.conn.outbox
        if not outbox.idle and not await outbox.flushed():
            self._gone(more)
            return
        if not more:
            self.complete = True
            self.arrived.set()

    def _open(self, more: bool) -> bool:
        """Whether the connection takes the answer's bytes still; when the client is going
        (its loss is told next), a last body part completes the answer."""
        if self.conn.is_closing():
            if not more:
                self.complete = True
            return False
        return True

    def _gone(self, more: bool) -> None:
        """The connection went while a piece of the answer waited to go out."""
        self.keep_alive = False
        if not more:
            self.complete = True

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

    def _ended(self, out: list[bytes | memoryview], more: bool) -> None:
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
        file = message["file"]
        fd = file if isinstance(file, int) else file.fileno()
        offset = message.get("offset")
        if offset is None:
            offset = os.lseek(fd, 0, os.SEEK_CUR)
        count = message.get("count")
        if count is None:
            count = os.fstat(fd).st_size - offset
        if not self._open(more):
            return
        outbox = self.conn.outbox
        out: list[bytes | memoryview] = list(self._framed(count, more))
        if out:
            outbox.send(out)
        if count and not self._bodyless:
            outbox.send_file(fd, offset, count)
            tail: list[bytes | memoryview] = [b"\r\n"] if self._chunked else []
        else:
            tail = []
        self._ended(tail, more)
        if tail:
            outbox.send(tail)
        # The caller closes the file once this returns: its bytes must be out by then.
        await self._sent(more)

    def _render_head(self, status: int, headers: Any) -> list[bytes]:
        line = STATUS_LINES.get(status)
        if line is None:
            line = b"HTTP/1.1 %d \r\n" % status
        head = [line]
        for name, value in self.conn.date_headers():
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
