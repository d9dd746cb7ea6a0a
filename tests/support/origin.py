"""Real origins for tests: moto's S3 server in a subprocess, and a counting reverse proxy.

The proxy sits between a store and its origin so a test can assert what reached the origin
("the second read made no request"), on the wire rather than by mocking.
"""

from __future__ import annotations

import http.client
import http.server
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.support import procs
from tests.support.gateway import GatewayNode, start_gateway
from tests.support.net import eventually, free_port, wait_http

# Hop-by-hop headers (RFC 9110 §7.6.1) belong to one connection and are never forwarded.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",
    }
)
_BUFFER = 64 * 1024


class MotoServer:
    """`moto_server` listening on 127.0.0.1 at a free port; S3 at `.url`, data in memory."""

    def __init__(self, tmpdir: str | os.PathLike[str]) -> None:
        # moto_server, with its ETags computed under the key's lock (moto_main.py says why).
        main = Path(__file__).with_name("moto_main.py")
        self.log_path = Path(tmpdir) / "moto.log"
        last: Exception | None = None
        for _ in range(3):  # the free port may be taken between the probe and moto's bind
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            with open(self.log_path, "ab") as log:
                self.proc = procs.start(
                    [sys.executable, str(main), "-H", "127.0.0.1", "-p", str(self.port)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            try:
                wait_http(f"{self.url}/moto-api/", timeout=30, proc=self.proc)
                return
            except RuntimeError as exc:
                last = exc
                self.stop()
        raise RuntimeError(f"moto_server did not start (log: {self.log_path}): {last}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        procs.end(self.proc)


def start_moto(tmpdir: str | os.PathLike[str]) -> MotoServer:
    return MotoServer(tmpdir)


@dataclass(frozen=True, slots=True)
class ProxiedRequest:
    """One request as the proxy saw it, before it reached the upstream (path percent-encoded)."""

    method: str
    path: str
    query: str
    range: str | None
    if_match: str | None = None
    at: float = field(default_factory=time.monotonic)  # when the proxy received it
    peer: tuple[str, int] | None = None  # the connection it came on (the client's address)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive towards the client, as a real origin allows
    server: _ProxyServer
    _conn: http.client.HTTPConnection | None = None

    def log_message(self, format: str, *args: object) -> None:
        pass  # tests read .requests, not stderr

    def do_any(self) -> None:
        path, _, query = self.path.partition("?")
        self.server.owner._record(
            ProxiedRequest(
                self.command,
                path,
                query,
                self.headers["Range"],
                self.headers["If-Match"],
                peer=self.client_address[:2],
            )
        )
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
        if chunked:
            headers["Transfer-Encoding"] = "chunked"
        body = self._request_body(chunked)
        # A request without a body is sent again once on a new upstream connection when the
        # first try fails before any answer (a loaded moto resetting a connection): the
        # client sees one request, as it would from a real origin, not a 502 it retries.
        for attempt in (1, 2) if body is None else (1,):
            try:
                upstream = self._upstream()
                upstream.request(
                    self.command, self.path, body=body, headers=headers, encode_chunked=chunked
                )
                response = upstream.getresponse()
                break
            except (OSError, http.client.HTTPException) as exc:
                self._drop_upstream()
                self.server.owner._upstream_failed(self.command, path, exc)
                if attempt == 2 or body is not None:
                    self._bad_gateway(exc)
                    return
        try:
            self._relay(response)
        except (OSError, http.client.HTTPException):
            # Headers are out: the only honest signal left is a cut connection.
            self._drop_upstream()
            self.close_connection = True

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = do_OPTIONS = do_any

    def _upstream(self) -> http.client.HTTPConnection:
        # One upstream connection per client connection, reused while both stay open.
        conn = self._conn
        if conn is None:
            conn = http.client.HTTPConnection(self.server.upstream_host, timeout=60)
            self._conn = conn
        return conn

    def _drop_upstream(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def finish(self) -> None:
        self._drop_upstream()
        super().finish()

    def _request_body(self, chunked: bool) -> Iterator[bytes] | bytes | None:
        if chunked:
            return self._read_chunked()
        length = int(self.headers.get("Content-Length") or 0)
        if length <= 0:
            return None if self.command in ("GET", "HEAD", "DELETE") else b""
        return self._read_exactly(length)

    def _read_exactly(self, length: int) -> Iterator[bytes]:
        while length > 0:
            data = self.rfile.read(min(_BUFFER, length))
            if not data:
                raise ConnectionError("client closed mid-body")
            length -= len(data)
            yield data

    def _read_chunked(self) -> Iterator[bytes]:
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip(), 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers are dropped: http.client cannot send them
                return
            yield from self._read_exactly(size)
            self.rfile.readline()

    def _relay(self, response: http.client.HTTPResponse) -> None:
        self.send_response_only(response.status, response.reason)
        length = response.getheader("Content-Length")
        for name, value in response.getheaders():
            if name.lower() not in _HOP_BY_HOP:
                self.send_header(name, value)
        bodiless = self.command == "HEAD" or response.status in (204, 304) or response.status < 200
        chunk_out = not bodiless and length is None
        if chunk_out:
            self.send_header("Transfer-Encoding", "chunked")
        # An upstream that closes after each response (moto does) costs us an upstream
        # reconnect, not the client's connection: the client was told nothing of a close.
        self.end_headers()
        if bodiless:
            response.read()
        else:
            sent = 0
            gate = self.server.owner._body_gate(self.command, self.path, self.headers["Range"])
            while data := response.read1(_BUFFER):
                # Counted before it is written: a test that has read the whole answer through
                # the gateway finds every byte counted.
                self.server.owner._sent(self.command, len(data))
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if chunk_out else data)
                sent += len(data)
                if gate is not None:  # held after its first piece (CountingProxy.hold_bodies)
                    self.wfile.flush()
                    gate.wait(60)
                    gate = None
            if chunk_out:
                self.wfile.write(b"0\r\n\r\n")
            elif sent < int(length or 0):
                # Upstream cut the body short: cut ours too, or the client waits for the rest.
                self.close_connection = True
        self.wfile.flush()
        # read1() never marks a fully read response closed, and http.client refuses the next
        # request on this connection until it is.
        response.close()
        if response.will_close:
            self._drop_upstream()

    def _bad_gateway(self, exc: Exception) -> None:
        body = f"proxy: upstream failed: {type(exc).__name__}: {exc}\n".encode()
        self.send_response_only(502, "Bad Gateway")
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.wfile.flush()


class _ProxyServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    upstream_host: str
    owner: CountingProxy

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class CountingProxy:
    """A reverse proxy on 127.0.0.1 that forwards everything to `upstream` and records it."""

    def __init__(self, upstream: str) -> None:
        target = urlsplit(upstream)
        if target.scheme != "http" or not target.netloc:
            raise ValueError(f"CountingProxy forwards to http://host:port only, not {upstream!r}")
        self.requests: list[ProxiedRequest] = []
        self.upstream_failures: list[str] = []  # tries the upstream failed (see do_any)
        self.body_bytes: dict[str, int] = {}  # response body bytes relayed, by method
        self._body_holds: list[tuple[str, int, threading.Event]] = []  # see hold_bodies()
        self._lock = threading.Lock()
        self._server = _ProxyServer(("127.0.0.1", 0), _Handler)
        self._server.upstream_host = target.netloc
        self._server.owner = self
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def hold_bodies(self, path_contains: str, from_byte: int = 0) -> threading.Event:
        """GET answers of paths containing `path_contains`, of ranges that start at or past
        `from_byte` (a GET without a range starts at 0), stop after their first piece until
        the event returned is set: fills of the gateway's cache held in flight, for a test to
        look at (or kill) while they are."""
        gate = threading.Event()
        with self._lock:
            self._body_holds.append((path_contains, from_byte, gate))
        return gate

    def _body_gate(self, method: str, path: str, range_: str | None) -> threading.Event | None:
        if method != "GET":
            return None
        start = 0
        if range_ and range_.startswith("bytes="):
            first = range_[6:].partition("-")[0]
            start = int(first) if first.isdigit() else 0
        with self._lock:
            for part, from_byte, gate in self._body_holds:
                if part in path and start >= from_byte and not gate.is_set():
                    return gate
        return None

    def _record(self, request: ProxiedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def _upstream_failed(self, method: str, path: str, exc: Exception) -> None:
        with self._lock:
            self.upstream_failures.append(f"{method} {path}: {type(exc).__name__}: {exc}")

    def _sent(self, method: str, n: int) -> None:
        with self._lock:
            self.body_bytes[method] = self.body_bytes.get(method, 0) + n

    def bytes_sent(self, method: str = "GET") -> int:
        with self._lock:
            return self.body_bytes.get(method, 0)

    def count(self, method: str | None = None, path_contains: str | None = None) -> int:
        with self._lock:
            return sum(
                1
                for r in self.requests
                if (method is None or r.method == method)
                and (path_contains is None or path_contains in r.path)
            )

    def repeated(self, method: str = "GET") -> list[tuple[ProxiedRequest, ...]]:
        """The requests for one path and range that came more than once, together: what a
        test of single flight names when it fails."""
        with self._lock:
            seen: dict[tuple[str, str | None], list[ProxiedRequest]] = {}
            for r in self.requests:
                if r.method == method:
                    seen.setdefault((r.path, r.range), []).append(r)
        return [tuple(rs) for rs in seen.values() if len(rs) > 1]

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.body_bytes.clear()
            self.upstream_failures.clear()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def seeded_node(
    folder: Path, origin: CountingProxy, origin_s3: Any, bucket: str,
    bodies: dict[str, bytes], ttls: dict[str, float],
) -> GatewayNode:  # fmt: skip
    """A gateway node over an origin bucket made and filled with `bodies`, mounted through the
    counting proxy once per entry of `ttls` (mount name -> metadata_ttl), its workers up."""
    origin_s3.create_bucket(Bucket=bucket)
    for key, body in bodies.items():
        origin_s3.put_object(Bucket=bucket, Key=key, Body=body)
    node = start_gateway(folder)
    opts = ["-o", f"endpoint_url={origin.url}", "-o", "access_key=ak", "-o", "secret_key=sk"]
    for name, ttl in ttls.items():
        node.cli("mount", "add", name, f"s3://{bucket}", *opts, "-o", f"metadata_ttl={ttl:g}")
    eventually(lambda: set(ttls) <= node.buckets())
    node.wait_workers()
    return node
