"""What one answer costs its sender, by way of sending the body: `python -m loadtest.sendcost`.

One loopback connection; a client process asks with one byte and reads the whole answer (a
330-byte head and the body); the sender's CPU (getrusage, user + system: on loopback the
receiving side's kernel work runs partly in the sender's context) per answer, median of
`--repeats`. Ways: `writev` (head and body from memory, one call: the edge's copy), `open`
(the block file opened, cachestat, fstat, head with MSG_MORE, sendfile, close), `kept` (a
descriptor kept open: dup, cachestat, head with MSG_MORE, sendfile, close of the dup: what
PageStore.hot_region and the outbox do). docs/performance.md, "Hot blocks sent from their
files", has a reading. No servers, no files but one in the work folder.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import socket
import statistics
import tempfile

from gateway.cache import resident

HEAD = b"HTTP/1.1 200 OK\r\nx-h: " + b"a" * 300 + b"\r\n\r\n"
WAYS = ("writev", "open", "kept")


def _client(port: int, size: int, count: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        want = len(HEAD) + size
        view = memoryview(bytearray(want))
        for _ in range(count):
            sock.sendall(b"G")
            got = 0
            while got < want:
                n = sock.recv_into(view[got:])
                if not n:
                    return
                got += n


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def one(way: str, size: int, count: int, path: str) -> float:
    """CPU µs an answer of `size` bytes sent `way`, over `count` answers."""
    body = os.urandom(size)
    with open(path, "wb") as f:
        f.write(body)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        client = multiprocessing.Process(
            target=_client, args=(listener.getsockname()[1], size, count)
        )
        client.start()
        conn, _ = listener.accept()
    kept = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    os.read(kept, size)  # in the page cache
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock = conn.fileno()
        start = _cpu()
        for _ in range(count):
            conn.recv(1)
            if way == "writev":
                conn.sendmsg([HEAD, body])
                continue
            if way == "open":
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                os.fstat(fd)
            else:
                fd = os.dup(kept)
            resident.in_page_cache(fd, 0, size)
            conn.send(HEAD, socket.MSG_MORE)
            offset = 0
            while offset < size:
                offset += os.sendfile(sock, fd, offset, size - offset)
            os.close(fd)
        spent = _cpu() - start
    os.close(kept)
    client.join()
    return spent / count * 1e6


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m loadtest.sendcost", description=__doc__)
    p.add_argument("--sizes", default="4,32,64,100,192,256", help="KiB, comma-separated")
    p.add_argument("--answers", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(dir=".") as work:
        path = os.path.join(work, "block")
        for kib in (int(k) for k in args.sizes.split(",")):
            figures: dict[str, list[float]] = {way: [] for way in WAYS}
            for _ in range(args.repeats):  # the ways alternated
                for way in WAYS:
                    figures[way].append(one(way, kib << 10, args.answers, path))
            cells = "  ".join(f"{w} {statistics.median(v):6.1f}" for w, v in figures.items())
            print(f"{kib:5d} KiB  µs an answer: {cells}", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
