"""The S3 transport's connections (gateway/stores/s3/http1.py) against a real local server: one
connection for GETs and HEADs in turn, a connection the origin closed while idle replaced, an
answer cut short is an error, never a short body, a chunked body refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from gateway.stores.s3.http1 import FAILURES, Pool

pytestmark = pytest.mark.anyio


@pytest.fixture(params=[{}, {"use_uvloop": True}], ids=["asyncio", "uvloop"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, bool]]:
    """The node's loop is uvloop's, whose transports differ from asyncio's in type."""
    return "asyncio", request.param


Answer = Callable[[bytes], "bytes | list[bytes]"]


class Origin:
    """An HTTP/1.1 server on 127.0.0.1 that answers each request head with `answer(head)`,
    then keeps the connection or closes it (`close_after` answers per connection)."""

    def __init__(self, answer: Answer, close_after: int | None = None) -> None:
        self.answer = answer
        self.close_after = close_after
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/bucket/"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        answered = 0
        try:
            while self.close_after is None or answered < self.close_after:
                head = await reader.readuntil(b"\r\n\r\n")
                self.requests.append(head)
                answer = self.answer(head)
                for part in answer if isinstance(answer, list) else [answer]:
                    writer.write(part)
                    await writer.drain()
                    await asyncio.sleep(0.01)  # each piece its own segment
                answered += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def ok(body: bytes) -> Answer:
    return lambda head: b'HTTP/1.1 200 OK\r\nContent-Length: %d\r\nETag: "e"\r\n\r\n%s' % (
        len(body),
        body,
    )


@pytest.fixture
async def started() -> AsyncIterator[Callable[..., asyncio.Future[tuple[Origin, Pool]]]]:
    made: list[tuple[Origin, Pool]] = []

    async def start(answer: Answer, close_after: int | None = None) -> tuple[Origin, Pool]:
        origin = Origin(answer, close_after)
        pool = Pool(await origin.start(), connect_timeout=5, read_timeout=5)
        made.append((origin, pool))
        return origin, pool

    yield start  # type: ignore[misc]
    for origin, pool in made:
        await pool.close()
        await origin.stop()


async def test_gets_in_turn_share_one_connection(started: Callable[..., object]) -> None:
    origin, pool = await started(ok(b"x" * 100_000))  # type: ignore[misc]
    for _ in range(5):
        response = await pool.request("GET", "/bucket/k", [("Host", "h")])
        assert response.status == 200 and ("ETag", '"e"') in response.headers
        assert await response.read() == b"x" * 100_000
        response.release()
    assert origin.connections == 1
    assert origin.requests[0].startswith(b"GET /bucket/k HTTP/1.1\r\nHost: h\r\n")


async def test_heads_and_gets_in_turn_share_one_connection(
    started: Callable[..., object],
) -> None:
    """A HEAD's answer says the object's Content-Length and sends no body: it is complete at
    its head, and the next request goes on the same connection."""

    def answer(head: bytes) -> bytes:
        if head.startswith(b"HEAD "):
            return b'HTTP/1.1 200 OK\r\nContent-Length: 100000\r\nETag: "e"\r\n\r\n'
        return ok(b"x" * 10)(head)  # type: ignore[return-value]

    origin, pool = await started(answer)  # type: ignore[misc]
    for method, body in (("HEAD", b""), ("GET", b"x" * 10), ("HEAD", b""), ("GET", b"x" * 10)):
        response = await pool.request(method, "/bucket/k", [("Host", "h")])
        assert response.status == 200 and await response.read() == body
        response.release()
    assert origin.connections == 1
    assert [r.split(b" ", 1)[0] for r in origin.requests] == [b"HEAD", b"GET", b"HEAD", b"GET"]


async def test_a_connection_closed_while_idle_is_replaced(started: Callable[..., object]) -> None:
    origin, pool = await started(ok(b"abc"), close_after=1)  # type: ignore[misc]
    for _ in range(3):
        response = await pool.request("GET", "/bucket/k", [("Host", "h")])
        await asyncio.sleep(0.05)  # the origin closes it meanwhile
        assert await response.read() == b"abc"
        response.release()
    assert origin.connections == 3


async def test_an_answer_cut_short_is_an_error(started: Callable[..., object]) -> None:
    def cut(head: bytes) -> bytes:
        return b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"y" * 10

    _, pool = await started(cut, close_after=1)  # type: ignore[misc]
    response = await pool.request("GET", "/bucket/k", [("Host", "h")])
    with pytest.raises(FAILURES):
        await response.read()
    response.release()


async def test_a_chunked_answer_is_read_in_any_pieces_and_its_connection_kept(
    started: Callable[..., object],
) -> None:
    """rclone sends its listings chunked: the body is the chunks' bytes, however the socket
    cuts them (sizes in hex, extensions and trailers ignored), and the connection is pooled."""
    answer = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n"
              b"1A\r\n" + b"x" * 26 + b"\r\n0\r\nX-Trailer: t\r\n\r\n")  # fmt: skip

    def chunked(head: bytes) -> list[bytes]:
        return [answer[i : i + 5] for i in range(0, len(answer), 5)]

    origin, pool = await started(chunked)  # type: ignore[misc]
    for _ in range(3):
        response = await pool.request("GET", "/bucket/?list-type=2", [("Host", "h")])
        assert response.status == 200 and await response.read() == b"abc" + b"x" * 26
        response.release()
    assert origin.connections == 1


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nabc",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n",
    ],
    ids=["another coding", "a size not hex", "a chunk longer than its size"],
)
async def test_an_answer_not_read_is_an_error_and_its_connection_dropped(
    started: Callable[..., object], answer: bytes
) -> None:
    """The transport reports such an answer as an error (transport.py)."""
    origin, pool = await started(lambda head: answer)  # type: ignore[misc]
    for _ in range(2):
        with pytest.raises(FAILURES):
            response = await pool.request("GET", "/bucket/k", [("Host", "h")])
            await response.read()
    assert origin.connections == 2


async def test_a_head_in_pieces_and_an_interim_answer(started: Callable[..., object]) -> None:
    def slow(head: bytes) -> list[bytes]:
        answer = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 206 Partial\r\nContent-Length: 2\r\n\r\nok"
        return [answer[i : i + 7] for i in range(0, len(answer), 7)]

    _, pool = await started(slow)  # type: ignore[misc]
    response = await pool.request("GET", "/bucket/k", [("Host", "h")])
    assert response.status == 206 and await response.read() == b"ok"
    response.release()


async def test_a_body_not_read_to_its_end_closes_its_connection(
    started: Callable[..., object],
) -> None:
    origin, pool = await started(ok(b"z" * 3_000_000))  # type: ignore[misc]
    response = await pool.request("GET", "/bucket/k", [("Host", "h")])
    assert len(await response.read(10)) == 10
    response.release()  # the rest would be read by the next answer's parser: not pooled
    response = await pool.request("GET", "/bucket/k", [("Host", "h")])
    assert await response.read() == b"z" * 3_000_000
    response.release()
    assert origin.connections == 2
