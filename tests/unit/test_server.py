"""The node's own HTTP/1.1 server (gateway/server/), over real loopback sockets: the
exchange between a raw client and a small ASGI application, byte for byte where the bytes
are the point (keep-alive, pipelining, chunked answers, 100-continue, HEAD, errors, a client
that goes away, a graceful stop, bodies sent from files). The attacks on the edge's limits
are tried against whole nodes in tests/e2e/test_edge.py, on this server and on uvicorn's."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import uvloop

from gateway.edge import EdgeLimits, install_fast_path
from gateway.server import BODY_HIGH_WATER, ZEROCOPY, Server, ServerConfig
from tests.support.net import eventually_async

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def _answer(send: Send, status: int, body: bytes, headers: list[Any] | None = None) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers or []})
    await send({"type": "http.response.body", "body": body})


async def _body(receive: Receive) -> bytes:
    out = b""
    while True:
        message = await receive()
        assert message["type"] == "http.request"
        out += message["body"]
        if not message.get("more_body"):
            return out


@contextlib.asynccontextmanager
async def serving(app: Any, sndbuf: int = 0, **limits: Any) -> AsyncIterator[tuple[Server, int]]:
    """A server on a loopback port; `sndbuf`: the send buffer of its connections (Linux's
    accepted sockets take the listener's), the kernel's own when 0."""
    server = Server(app, ServerConfig(EdgeLimits(**limits), graceful_timeout=2.0))
    sock = socket.socket()
    if sndbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    sock.bind(("127.0.0.1", 0))
    listener = await asyncio.get_running_loop().create_server(server.protocol, sock=sock)
    try:
        yield server, sock.getsockname()[1]
    finally:
        listener.close()
        await server.drain()


async def _read_answer(reader: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """One answer off the connection: its status line, header fields and (de-chunked) body."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    fields = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(b": ")
            fields[name.lower()] = value
    if fields.get(b"transfer-encoding") == b"chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                return lines[0], fields, body
            body += chunk[:-2]
    length = int(fields.get(b"content-length", b"0"))
    return lines[0], fields, await reader.readexactly(length)


def test_keep_alive_answers_each_request_on_one_connection() -> None:
    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await _answer(send, 200, scope["path"].encode() + b"?" + scope["query_string"])

    async def main() -> None:
        async with serving(app) as (_, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            for path in (b"/a", b"/b%20c"):
                writer.write(b"GET " + path + b"?x=1 HTTP/1.1\r\nHost: h\r\n\r\n")
                status, fields, body = await _read_answer(reader)
                assert status == b"HTTP/1.1 200 OK"
                assert b"date" in fields and b"connection" not in fields
                assert body == path.replace(b"%20", b" ") + b"?x=1"
            writer.close()

    asyncio.run(main())


def test_pipelined_requests_are_answered_in_order_one_at_a_time() -> None:
    order: list[str] = []
    release = asyncio.Event()
    running = 0

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        nonlocal running
        running += 1
        assert running == 1  # never two exchanges of one connection at once
        order.append(scope["path"])
        if scope["path"] == "/slow":
            await release.wait()
        body = await _body(receive)
        running -= 1
        await _answer(send, 200, scope["path"].encode() + b":" + body)

    async def main() -> None:
        async with serving(app) as (_, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"GET /slow HTTP/1.1\r\nHost: h\r\n\r\n"
                b"PUT /put HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc"
                b"GET /last HTTP/1.1\r\nHost: h\r\n\r\n"
            )
            await asyncio.sleep(0)  # the requests are parsed; only the first runs
            release.set()
            answers = [(await _read_answer(reader))[2] for _ in range(3)]
            assert answers == [b"/slow:", b"/put:abc", b"/last:"]
            assert order == ["/slow", "/put", "/last"]
            writer.close()

    asyncio.run(main())


def test_a_streamed_answer_without_a_length_is_chunked_and_head_sends_no_body() -> None:
    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["method"] == "HEAD":
            await _answer(send, 200, b"", [(b"content-length", b"11")])
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for piece in (b"hello", b" ", b"world"):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async def main() -> None:
        async with serving(app) as (_, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
            _, fields, body = await _read_answer(reader)
            assert fields[b"transfer-encoding"] == b"chunked" and body == b"hello world"
            writer.write(b"HEAD / HTTP/1.1\r\nHost: h\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            assert b"content-length: 11\r\n" in head
            # No body after the HEAD's head: the next bytes are the next answer's.
            assert (await reader.readexactly(9)) == b"HTTP/1.1 "
            writer.close()

    asyncio.run(main())


def test_100_continue_is_sent_when_the_body_is_read_and_not_when_refused() -> None:
    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["path"] == "/refuse":
            await _answer(send, 403, b"no")
            return
        await _answer(send, 200, await _body(receive))

    async def main() -> None:
        async with serving(app) as (_, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"PUT /ok HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n"
            )
            assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(b"data")
            assert (await _read_answer(reader))[2] == b"data"
            writer.write(
                b"PUT /refuse HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n"
                b"Expect: 100-continue\r\n\r\n"
            )
            status, _, body = await _read_answer(reader)
            assert status.startswith(b"HTTP/1.1 403") and body == b"no"
            writer.close()

    asyncio.run(main())


def test_a_large_body_is_read_whole_while_the_application_reads_slowly() -> None:
    seen: list[int] = []

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        total = 0
        while True:
            message = await receive()
            seen.append(len(message["body"]))
            total += len(message["body"])
            await asyncio.sleep(0.001)  # a slow consumer: the server must hold back
            if not message.get("more_body"):
                break
        await _answer(send, 200, str(total).encode())

    async def main() -> None:
        async with serving(app) as (_, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            size = 8 << 20
            writer.write(b"PUT / HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n" % size)
            writer.write(b"x" * size)
            assert (await _read_answer(reader))[2] == str(size).encode()
            # Reading pauses past the high-water mark: no piece handed over is much larger
            # (one socket read may land on top of it).
            assert max(seen) < BODY_HIGH_WATER + (1 << 20)
            writer.close()

    asyncio.run(main())


def test_an_application_error_is_a_500_and_the_connection_closes() -> None:
    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        raise RuntimeError("boom")

    async def main() -> None:
        async with serving(app) as (_, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
            status, fields, _ = await _read_answer(reader)
            assert status.startswith(b"HTTP/1.1 500") and fields[b"connection"] == b"close"
            assert await reader.read() == b""
            writer.close()

    asyncio.run(main())


def test_a_client_that_goes_away_is_told_to_the_application() -> None:
    told = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await _body(receive)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"x", "more_body": True})
        if (await receive())["type"] == "http.disconnect":
            told.set()

    async def main() -> None:
        async with serving(app) as (server, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
            await reader.readuntil(b"\r\n\r\n")
            writer.close()
            await asyncio.wait_for(told.wait(), 5)
            assert not server.connections  # told from the connection's loss, once counted out

    asyncio.run(main())


def test_http_1_0_is_answered_and_closed() -> None:
    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        assert scope["http_version"] == "1.0"
        await _answer(send, 200, b"ok")

    async def main() -> None:
        async with serving(app) as (_, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.0\r\n\r\n")
            answer = await reader.read()  # to the close
            assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b"\r\n\r\nok")
            assert b"connection: close\r\n" in answer
            writer.close()

    asyncio.run(main())


def test_a_graceful_stop_closes_idle_connections_and_finishes_running_answers() -> None:
    release = asyncio.Event()
    started = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        started.set()
        await release.wait()
        await _answer(send, 200, b"done")

    async def main() -> None:
        server = Server(app, ServerConfig(EdgeLimits(), graceful_timeout=5.0))
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        listener = await asyncio.get_running_loop().create_server(server.protocol, sock=sock)
        port = sock.getsockname()[1]
        idle_r, idle_w = await asyncio.open_connection("127.0.0.1", port)
        busy_r, busy_w = await asyncio.open_connection("127.0.0.1", port)
        busy_w.write(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        await started.wait()
        listener.close()
        drained = asyncio.create_task(server.drain())
        assert await idle_r.read() == b""  # the idle one is closed at once
        release.set()
        _, fields, body = await _read_answer(busy_r)
        assert body == b"done" and fields[b"connection"] == b"close"
        await asyncio.wait_for(drained, 5)
        assert not server.connections
        idle_w.close()
        busy_w.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    "request_bytes",
    [b"GET /\xff HTTP/1.1\r\nHost: h\r\n\r\n", b"NOT HTTP AT ALL\r\n\r\n"],
)
def test_bytes_that_are_not_a_request_are_answered_400_as_s3_does(request_bytes: bytes) -> None:
    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        raise AssertionError("never reached")

    async def main() -> None:
        async with serving(app) as (_, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request_bytes)
            answer = await reader.read()
            assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n")
            assert b"<Code>Invalid" in answer and b"x-amz-request-id: " in answer
            writer.close()

    asyncio.run(main())


def test_a_request_whose_body_is_malformed_is_refused_after_the_answers_before_it() -> None:
    """A slow GET, a PUT, a PUT whose chunked body is malformed and a GET, in one write: the
    first two are answered in order, then 400, and the connection closes; neither the
    malformed PUT nor the GET after it reaches the application. A malformed body of the
    request running: the application is told its client went away, and 400 follows."""
    bodies: dict[str, bytes | None] = {}
    release = asyncio.Event()
    reading = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        path = scope["path"]
        if path == "/slow":
            await release.wait()
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                bodies[path] = None
                return
            body += message["body"]
            reading.set()
            if not message.get("more_body"):
                break
        bodies[path] = body
        await _answer(send, 200, path.encode() + b":" + body)

    bad = b"PUT /bad HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nxyz\r\n"

    async def main() -> None:
        async with serving(app) as (_, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"GET /slow HTTP/1.1\r\nHost: h\r\n\r\n"
                b"PUT /put HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc"
                + bad
                + b"not a chunk size\r\nGET /after HTTP/1.1\r\nHost: h\r\n\r\n"
            )
            release.set()
            answers = [await _read_answer(reader) for _ in range(3)]
            assert [a[2] for a in answers[:2]] == [b"/slow:", b"/put:abc"]
            assert answers[2][0] == b"HTTP/1.1 400 Bad Request"
            assert await reader.read() == b""  # then closed
            assert bodies == {"/slow": b"", "/put": b"abc"}
            writer.close()

            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(bad)
            await reading.wait()  # the application has the body's first chunk
            writer.write(b"not a chunk size\r\nGET /after HTTP/1.1\r\nHost: h\r\n\r\n")
            status, _, _ = await _read_answer(reader)
            assert status == b"HTTP/1.1 400 Bad Request"
            assert await reader.read() == b""
            assert bodies == {"/slow": b"", "/put": b"abc", "/bad": None}
            writer.close()

    asyncio.run(main())


def test_a_body_that_stops_coming_is_answered_408_and_the_application_told() -> None:
    told: list[str] = []

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                told.append("disconnect")
                await _answer(send, 200, b"never sent")  # dropped: nobody to answer
                return
            if not message.get("more_body"):
                raise AssertionError("the body never ends")

    async def main() -> None:
        async with serving(app, body_timeout=0.5) as (_, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"PUT / HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\nabc")
            answer = await asyncio.wait_for(reader.read(), 10)  # to the close
            assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
            assert b"<Code>RequestTimeout</Code>" in answer and b"never sent" not in answer
            assert told == ["disconnect"]
            writer.close()

    asyncio.run(main())


# -- bodies sent from files (http.response.zerocopysend) -------------------------------------


def _file(tmp_path: Any, name: str, size: int, seed: int) -> tuple[str, bytes]:
    data = random.Random(seed).randbytes(size)
    path = tmp_path / name
    path.write_bytes(data)
    return str(path), data


async def _send_file(send: Send, path: str, offset: int, count: int, more: bool) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        await send(
            {"type": ZEROCOPY, "file": fd, "offset": offset, "count": count, "more_body": more}
        )
    finally:
        os.close(fd)


def test_a_body_sent_from_a_file_arrives_byte_exact(tmp_path: Any) -> None:
    path, data = _file(tmp_path, "f", 5 * (1 << 20) + 7, 1)
    extensions: list[Any] = []

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        extensions.append(scope.get("extensions", {}))
        headers = [] if scope["path"] == "/chunked" else [(b"content-length", b"%d" % 3_000_010)]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await _send_file(send, path, 100, 1_000_000, True)
        await send({"type": "http.response.body", "body": b"0123456789", "more_body": True})
        await _send_file(send, path, 2_000_000, 2_000_000, False)

    async def main() -> None:
        async with serving(app) as (_, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            want = data[100:1_000_100] + b"0123456789" + data[2_000_000:4_000_000]
            for path_ in (b"/", b"/chunked", b"/"):
                writer.write(b"GET " + path_ + b" HTTP/1.1\r\nHost: h\r\n\r\n")
                status, fields, body = await _read_answer(reader)
                assert status == b"HTTP/1.1 200 OK"
                assert (b"transfer-encoding" in fields) == (path_ == b"/chunked")
                assert body == want
            writer.close()

    uvloop.run(main())
    assert all(ZEROCOPY in e for e in extensions)


def test_a_slow_reader_holds_the_sender_back_and_gets_every_byte(tmp_path: Any) -> None:
    path, data = _file(tmp_path, "f", 24 << 20, 2)
    sent = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await _send_file(send, path, 0, len(data), False)
        sent.set()

    async def main() -> None:
        async with serving(app) as (_, port):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
            reader, writer = await asyncio.open_connection(sock=sock, limit=64 << 10)
            writer.write(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
            await reader.readuntil(b"\r\n\r\n")
            got = await reader.readexactly(1 << 20)
            # Socket buffers hold a few MiB at most: the rest waits for the reader.
            assert not sent.is_set()
            while len(got) < len(data):
                got += await reader.read(64 << 10)
                await asyncio.sleep(0)
            assert got == data
            await asyncio.wait_for(sent.wait(), 30)
            writer.close()

    uvloop.run(main())


def test_a_slow_reader_of_a_streamed_answer_in_memory_gets_every_part() -> None:
    # A body sent in parts from memory (as a cold read streams blocks) to a client that reads
    # a little at a time, through a send buffer smaller than a slice: each part's last slice
    # leaves the connection paused with nothing queued, and the sender of that part is let
    # go all the same (else the next part is never sent and the client waits for ever).
    parts = [bytes([65 + i]) * ((1 << 20) + 4099 * i) for i in range(4)]
    data = b"".join(parts)
    sent = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        headers = [(b"content-length", str(len(data)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for part in parts:
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        sent.set()

    async def main() -> None:
        async with serving(app, sndbuf=32 << 10) as (_, port):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 10)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
            reader, writer = await asyncio.open_connection(sock=sock, limit=16 << 10)
            writer.write(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
            await reader.readuntil(b"\r\n\r\n")
            got = bytearray()
            while len(got) < len(data):
                got += await asyncio.wait_for(reader.read(4 << 10), 30)
                await asyncio.sleep(0)
            assert got == data
            await asyncio.wait_for(sent.wait(), 30)
            writer.close()

    uvloop.run(main())


def test_a_client_gone_in_the_middle_of_a_file_ends_the_send(tmp_path: Any) -> None:
    path, data = _file(tmp_path, "f", 32 << 20, 3)
    ended = asyncio.Event()
    told: list[str] = []

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        try:
            await _send_file(send, path, 0, len(data), False)
            told.append((await receive())["type"])
        finally:
            ended.set()

    async def main() -> None:
        async with serving(app) as (server, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
            await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(1 << 20)
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.close()  # a reset: the server's next sendfile fails, or it hears the loss
            await asyncio.wait_for(ended.wait(), 30)
            assert told == ["http.disconnect"]
            await eventually_async(lambda: not server.connections, timeout=30)
            # The server goes on serving.
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
            await reader.readuntil(b"\r\n\r\n")
            assert await reader.readexactly(1000) == data[:1000]
            writer.close()

    uvloop.run(main())


def test_a_client_that_reads_nothing_is_cut_off_after_the_body_timeout(tmp_path: Any) -> None:
    path, data = _file(tmp_path, "f", 32 << 20, 4)
    ended = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        try:
            await _send_file(send, path, 0, len(data), False)
        finally:
            ended.set()

    async def main() -> None:
        async with serving(app, body_timeout=0.5) as (server, port):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
            await asyncio.wait_for(ended.wait(), 30)  # nothing read: the send gives up
            await eventually_async(lambda: not server.connections, timeout=30)
            writer.close()

    uvloop.run(main())


def test_pipelined_requests_answered_from_files_keep_their_order(tmp_path: Any) -> None:
    files = [_file(tmp_path, f"f{i}", (i + 1) * 700_001, 10 + i) for i in range(3)]

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        i = int(scope["path"][1:])
        if i == 3:
            await _answer(send, 200, b"bytes")
            return
        path, data = files[i]
        headers = [(b"content-length", b"%d" % (len(data) - 5))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await _send_file(send, path, 5, len(data) - 5, False)

    async def main() -> None:
        async with serving(app) as (_, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            order = [2, 0, 3, 1, 2]
            writer.write(b"".join(b"GET /%d HTTP/1.1\r\nHost: h\r\n\r\n" % i for i in order))
            for i in order:
                _, _, body = await _read_answer(reader)
                assert body == (b"bytes" if i == 3 else files[i][1][5:])
            writer.close()

    uvloop.run(main())


# -- answers made at the edge (the fast path), through the connection's outbox -------------


class _Region:
    """A FileBody (as the page store's FileRegion): an open file's bytes, closed once sent."""

    def __init__(self, path: str, offset: int, count: int) -> None:
        self.fd = os.open(path, os.O_RDONLY)
        self.offset = offset
        self.count = count
        self.reading: asyncio.Future[None] | None = None
        self.failed: Callable[[], bytes] | None = None
        self.closed = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self.fd)


def _ok_head(length: int) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % length


@contextlib.asynccontextmanager
async def serving_edge(app: Any, answer: Callable[..., Any]) -> AsyncIterator[tuple[Server, int]]:
    """`serving`, with `answer` as the port's answers at the edge (gateway/edge.py)."""
    server = Server(app, ServerConfig(EdgeLimits(), graceful_timeout=2.0))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    install_fast_path(port, answer)
    listener = await asyncio.get_running_loop().create_server(server.protocol, sock=sock)
    try:
        yield server, port
    finally:
        install_fast_path(port, None)
        listener.close()
        await server.drain()


def test_edge_answers_from_memory_and_files_go_out_whole_in_order_with_the_rest(
    tmp_path: Any,
) -> None:
    """Large answers made at the edge (a body in memory, a region of a file), pipelined with
    requests the application answers, on connections at once: every answer arrives whole,
    in order; every file region is closed once sent. A client that half-closes once it has
    asked gets the edge's answers whole, then the close."""
    path_, data = _file(tmp_path, "block", 9 << 20, 3)
    memory = random.Random(4).randbytes(6 << 20)
    regions: list[_Region] = []

    def answer(method: bytes, target: bytes, *_: Any) -> Any:
        if target == b"/memory":
            return _ok_head(len(memory)), memoryview(memory)
        if target == b"/file":
            region = _Region(path_, 1000, len(data) - 2000)
            regions.append(region)
            return _ok_head(region.count), region
        return None

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        # A request pipelined behind an answer still going out is the application's: it
        # gives what the edge would have.
        path = scope["path"]
        if path == "/file":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await _send_file(send, path_, 1000, len(data) - 2000, False)
        else:
            await _answer(send, 200, memory if path == "/memory" else path.encode())

    async def client(port: int, order: list[bytes]) -> list[bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
        writer.write(b"".join(b"GET " + p + b" HTTP/1.1\r\nHost: h\r\n\r\n" for p in order))
        half = len(order) == 1  # (an exchange of the application is told its client went)
        if half:
            writer.write_eof()
        bodies = [(await _read_answer(reader))[2] for _ in order]
        if half:
            assert await reader.read() == b""  # closed after the last answer
        writer.close()
        return bodies

    async def main() -> None:
        async with serving_edge(app, answer) as (_, port):
            orders = [
                [b"/file", b"/app", b"/memory", b"/file"],
                [b"/memory", b"/file", b"/app"],
                [b"/app", b"/file"],
                [b"/file"],
                [b"/memory"],
                [b"/file", b"/memory", b"/file"],
            ]
            got = await asyncio.gather(*(client(port, order) for order in orders))
            want = {b"/file": data[1000:-1000], b"/memory": memory, b"/app": b"/app"}
            for order, bodies in zip(orders, got, strict=True):
                assert bodies == [want[p] for p in order]
            assert regions and all(region.closed for region in regions)

    uvloop.run(main())


def test_an_edge_answer_whose_file_is_being_read_in_holds_the_answers_after_it(
    tmp_path: Any,
) -> None:
    """An answer made at the edge from a file still being read in (`reading`: a block on disk,
    not in the page cache) waits for that read, and the answers pipelined behind it wait for
    it (the application's: the edge sends one answer at a time, so the requests behind
    it are the application's): they arrive in the order asked."""
    path_, data = _file(tmp_path, "block", 3 << 20, 6)
    os.truncate(path_, 0)  # its bytes are there only once the read is done
    memory = random.Random(7).randbytes(100_000)
    regions: list[_Region] = []
    asked: list[str] = []

    def answer(method: bytes, target: bytes, *_: Any) -> Any:
        if target == b"/memory":
            return _ok_head(len(memory)), memoryview(memory)
        if target == b"/file":
            region = _Region(path_, 0, len(data))
            region.reading = asyncio.get_running_loop().create_future()
            regions.append(region)
            return _ok_head(region.count), region
        return None

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        path = scope["path"]
        asked.append(path)
        await _answer(send, 200, memory if path == "/memory" else path.encode())

    async def main() -> None:
        async with serving_edge(app, answer) as (_, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
            order = [b"/file", b"/memory", b"/app", b"/memory"]
            writer.write(b"".join(b"GET " + p + b" HTTP/1.1\r\nHost: h\r\n\r\n" for p in order))
            # The application has answered the second request (queued behind the first; the
            # third waits for it): the read ends now.
            await eventually_async(lambda: asked == ["/memory"], timeout=30)
            assert regions[0].reading is not None
            await asyncio.to_thread(Path(path_).write_bytes, data)
            regions[0].reading.set_result(None)
            bodies = [(await _read_answer(reader))[2] for _ in order]
            assert bodies == [data, memory, b"/app", memory]
            await eventually_async(lambda: regions[0].closed, timeout=30)
            writer.close()

    uvloop.run(main())


def test_an_edge_answer_whose_file_could_not_be_read_in_is_an_error_and_the_last(
    tmp_path: Any,
) -> None:
    """A read in that fails (the disk, or a block found damaged) is answered 500 InternalError,
    as S3 words it, with a request id, and the connection closes after it: the requests
    pipelined behind it are not answered (the client asks them again), the file is closed."""
    path_, data = _file(tmp_path, "block", 1 << 20, 8)
    regions: list[_Region] = []

    def answer(method: bytes, target: bytes, *_: Any) -> Any:
        if target == b"/file":
            region = _Region(path_, 0, len(data))
            region.reading = asyncio.get_running_loop().create_future()
            regions.append(region)
            return _ok_head(region.count), region
        return b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", None

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        raise AssertionError("never reached")

    async def main() -> None:
        async with serving_edge(app, answer) as (_, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
            writer.write(b"GET /ok HTTP/1.1\r\nHost: h\r\n\r\n")
            assert (await _read_answer(reader))[2] == b"ok"
            writer.write(
                b"GET /file HTTP/1.1\r\nHost: h\r\n\r\n" + b"GET /ok HTTP/1.1\r\nHost: h\r\n\r\n"
            )
            await eventually_async(lambda: len(regions) == 1, timeout=30)
            assert regions[0].reading is not None
            regions[0].reading.set_exception(OSError(5, "Input/output error"))
            status, fields, body = await _read_answer(reader)
            assert status == b"HTTP/1.1 500 Internal Server Error"
            assert b"<Code>InternalError</Code>" in body and fields[b"x-amz-request-id"]
            assert fields[b"connection"] == b"close"
            assert await reader.read() == b""  # closed: the second /ok is not answered
            await eventually_async(lambda: regions[0].closed, timeout=30)
            writer.close()

    uvloop.run(main())


def test_a_client_that_takes_nothing_of_an_edge_answer_is_cut_off(tmp_path: Any) -> None:
    """A client that never reads an answer made at the edge from a file holds no more than
    what the kernel buffers: after the send timeout its connection is cut off and the file
    region closed, and the server serves the next client."""
    path, data = _file(tmp_path, "block", 32 << 20, 5)
    regions: list[_Region] = []

    def answer(method: bytes, target: bytes, *_: Any) -> Any:
        region = _Region(path, 0, len(data))
        regions.append(region)
        return _ok_head(region.count), region

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        raise AssertionError("never reached")

    async def main() -> None:
        server = Server(app, ServerConfig(EdgeLimits(body_timeout=1.0), graceful_timeout=2.0))
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        install_fast_path(port, answer)
        listener = await asyncio.get_running_loop().create_server(server.protocol, sock=sock)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n")
            await eventually_async(lambda: regions and regions[0].closed, timeout=30)
            await eventually_async(lambda: not server.connections, timeout=30)
            got = b""
            with contextlib.suppress(ConnectionError):
                got = await reader.read()  # what the kernels held, then the cut
            assert len(got) < len(data)
            writer.close()
        finally:
            install_fast_path(port, None)
            listener.close()
            await server.drain()

    uvloop.run(main())


def test_a_head_answered_at_the_edge_before_is_answered_again_as_the_parser_read_it() -> None:
    """The same request bytes again (a presigned URL's GET, as clients repeat it) are answered
    at the edge without being parsed again: the edge is asked with what the parser read the
    first time (method, target, fields, keep-alive), on any connection; a `Connection: close`
    is still closed after its answer; a head the edge declines now goes to the application,
    read by the parser as any other; a head with an Authorization header is parsed each time."""
    asked: list[tuple[bytes, bytes, list[tuple[bytes, bytes]], bool]] = []
    read: list[Any] = []  # the fields lists the edge was given: one per parse
    declining: set[bytes] = set()

    def answer(method: bytes, target: bytes, fields: Any, keep_alive: bool, *_: Any) -> Any:
        if target in declining:
            return None
        asked.append((method, target, list(fields), keep_alive))
        read.append(fields)
        body = b"edge %d" % len(asked)
        return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body, None

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await _answer(send, 200, b"app " + scope["raw_path"])

    plain = b"GET /obj?sig=1 HTTP/1.1\r\nHost: h\r\nUser-Agent: t  \r\n\r\n"
    closing = b"GET /obj?sig=2 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
    signed = b"GET /obj?sig=3 HTTP/1.1\r\nHost: h\r\nAuthorization: AWS4 x\r\n\r\n"
    fields = [(b"host", b"h"), (b"user-agent", b"t")]

    async def main() -> None:
        async with serving_edge(app, answer) as (_, port):
            for _ in range(2):  # two connections, three requests each, one at a time
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                for _ in range(3):
                    writer.write(plain)
                    status, _, body = await _read_answer(reader)
                    assert (status, body) == (b"HTTP/1.1 200 OK", b"edge %d" % len(asked))
                writer.write(signed)
                assert (await _read_answer(reader))[2] == b"edge %d" % len(asked)
                writer.close()
            assert asked[:3] == [(b"GET", b"/obj?sig=1", fields, True)] * 3
            assert [a[1] for a in asked] == [b"/obj?sig=1"] * 3 + [b"/obj?sig=3"] + (
                [b"/obj?sig=1"] * 3 + [b"/obj?sig=3"]
            )
            assert all(a == asked[0] for a in asked if a[1] == b"/obj?sig=1")
            # Parsed once: the same bytes again are answered with what was read the first time.
            assert all(read[i] is read[0] for i in (1, 2, 4, 5, 6))
            assert read[7] is not read[3]  # an Authorization header: parsed each time
            for _ in range(2):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(closing)
                assert (await _read_answer(reader))[2] == b"edge %d" % len(asked)
                assert await reader.read() == b""  # closed after it
                writer.close()
            assert [a[3] for a in asked[-2:]] == [False, False]
            declining.add(b"/obj?sig=1")
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            for _ in range(2):
                writer.write(plain)
                assert (await _read_answer(reader))[2] == b"app /obj"
            writer.close()

    uvloop.run(main())
