"""A TCP proxy that puts a WAN's round trip (and optionally a bandwidth cap) before an origin.

Used where `tc netem` is missing from the kernel: inside the origin's network namespace (the
veth then carries a kernel `tbf` rate limit), or on loopback when no namespace can be made.
It also counts the bytes the origin sends, which is what "bytes fetched from the origin" means,
the connections it accepts, and the requests sent to the origin (request heads: the measured
loads send GET, HEAD and list requests, which have no body; data is seeded around the proxy).

    python -m loadtest.wan_proxy --listen HOST:PORT --upstream HOST:PORT --rtt-ms 20 \
        [--rate-bps N] [--stats HOST:PORT]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

_CHUNK = 256 * 1024
# Bytes held in flight per direction of one connection: a TCP window's worth (Linux's
# default tcp_rmem maximum is 6 MiB), so a slow reader pushes back on the sender.
_WINDOW = 6 * 1024 * 1024


@dataclass
class Stats:
    connections: int = 0
    requests: int = 0  # request heads sent towards the origin
    bytes_from_origin: int = 0
    bytes_to_origin: int = 0


class HeadCounter:
    """Counts the blank lines that end HTTP heads in one direction of a connection, across
    chunk boundaries. Right for requests without a body (a body could hold one too)."""

    def __init__(self) -> None:
        self._tail = b""

    def feed(self, data: bytes) -> int:
        joined = self._tail + data
        self._tail = joined[-3:]
        return joined.count(b"\r\n\r\n")


@dataclass
class Link:
    """One direction of the emulated wire: bytes leave one after another at `rate_bps`."""

    rate_bps: float | None
    free_at: float = 0.0

    def departure(self, now: float, nbytes: int) -> float:
        if not self.rate_bps:
            return now
        self.free_at = max(now, self.free_at) + nbytes * 8 / self.rate_bps
        return self.free_at


@dataclass
class _Pipe:
    """Bytes read from one side, each chunk released to the other side at its arrival time."""

    queue: deque[tuple[float, bytes | None]] = field(default_factory=deque)
    queued: int = 0
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    room: asyncio.Event = field(default_factory=asyncio.Event)


async def _read_side(
    reader: asyncio.StreamReader,
    pipe: _Pipe,
    link: Link,
    one_way: float,
    not_before: float,
    count: Callable[[int, bytes], None],
) -> None:
    loop = asyncio.get_running_loop()
    while True:
        data = await reader.read(_CHUNK)
        arrive = max(link.departure(loop.time(), len(data)) + one_way, not_before)
        pipe.queue.append((arrive, data or None))
        pipe.ready.set()
        if not data:
            return
        count(len(data), data)
        pipe.queued += len(data)
        while pipe.queued > _WINDOW:
            pipe.room.clear()
            await pipe.room.wait()


async def _write_side(writer: asyncio.StreamWriter, pipe: _Pipe) -> None:
    loop = asyncio.get_running_loop()
    while True:
        while not pipe.queue:
            pipe.ready.clear()
            await pipe.ready.wait()
        arrive, data = pipe.queue.popleft()
        delay = arrive - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if data is None:
            with contextlib.suppress(OSError):
                writer.write_eof()  # half-close, as TCP passes a FIN along
            return
        writer.write(data)
        await writer.drain()
        pipe.queued -= len(data)
        pipe.room.set()


class WanProxy:
    def __init__(self, upstream: tuple[str, int], rtt: float, rate_bps: float | None) -> None:
        self.upstream = upstream
        self.rtt = rtt
        self.up = Link(rate_bps)  # towards the origin
        self.down = Link(rate_bps)  # from the origin
        self.stats = Stats()

    def _down(self, n: int, data: bytes) -> None:
        self.stats.bytes_from_origin += n

    async def handle(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        accepted = loop.time()
        self.stats.connections += 1
        one_way = self.rtt / 2
        heads = HeadCounter()

        def up(n: int, data: bytes) -> None:
            self.stats.bytes_to_origin += n
            self.stats.requests += heads.feed(data)

        try:
            o_reader, o_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            c_writer.close()
            return
        # The client's connect() returned at once on loopback; over a WAN its first byte could
        # leave only after the SYN/SYN-ACK round trip, so it reaches the origin 1.5 RTT in.
        up_pipe, down = _Pipe(), _Pipe()
        tasks = [
            asyncio.create_task(
                _read_side(c_reader, up_pipe, self.up, one_way, accepted + 1.5 * self.rtt, up)
            ),
            asyncio.create_task(_write_side(o_writer, up_pipe)),
            asyncio.create_task(_read_side(o_reader, down, self.down, one_way, 0.0, self._down)),
            asyncio.create_task(_write_side(c_writer, down)),
        ]
        try:
            # Done when both directions have delivered their FIN, or either side failed.
            writers = {tasks[1], tasks[3]}
            pending = set(tasks)
            while writers & pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if any(t.exception() for t in done if not t.cancelled()):
                    break
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for w in (c_writer, o_writer):
                w.close()

    async def serve_stats(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            await reader.readuntil(b"\r\n\r\n")
            body = json.dumps(self.stats.__dict__).encode()
            head = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n"
            writer.write(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()
        writer.close()


def _hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def _main(args: argparse.Namespace) -> None:
    proxy = WanProxy(_hostport(args.upstream), args.rtt_ms / 1000, args.rate_bps or None)
    host, port = _hostport(args.listen)
    server = await asyncio.start_server(proxy.handle, host, port, backlog=1024)
    servers = [server]
    if args.stats:
        shost, sport = _hostport(args.stats)
        servers.append(await asyncio.start_server(proxy.serve_stats, shost, sport))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for s in servers:
        s.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--rate-bps", type=float, default=0.0, help="0: no cap")
    parser.add_argument("--stats", help="HOST:PORT answering GET with the byte counts as JSON")
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
