"""The node's HTTP edge under attack, tried with raw sockets against a real node: request
heads past their limits are answered (414, 431) and closed, heads that never finish are timed
out (408, or closed when nothing was sent), connections past the cap are answered 503
SlowDown at once, memory stays flat while connections stream header lines, and real clients
with long presigned URLs and many headers are served. The same limits hold on the fleet's
internal port."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from botocore.exceptions import ClientError

from gateway.config import build_settings
from gateway.edge import EdgeLimits
from tests.support.gateway import GatewayNode, run_cli, start_gateway
from tests.support.net import free_port, wait_http

KiB = 1 << 10
MiB = 1 << 20
LINE = 16 * KiB  # the defaults of docs/configuration.md
HEADERS = 32 * KiB
FIELDS = 128


# Each attack is tried on both HTTP servers a node can run: its own (the default) and
# uvicorn's, the plain-ASGI fallback (`--server uvicorn`).
SERVERS = ["gateway", "uvicorn"]


@pytest.fixture(scope="module", params=SERVERS)
def node(module_dir: Path, request: pytest.FixtureRequest) -> Iterator[GatewayNode]:
    files = module_dir / request.param / "files"
    files.mkdir(parents=True)
    data = module_dir / request.param / "data"
    run_cli(data, None, "mount", "add", "files", files.as_uri())
    node = start_gateway(data, args=("--no-access-log", "--server", request.param))
    try:
        yield node
    finally:
        node.stop()


def _exchange(port: int, payload: bytes, timeout: float = 10.0) -> bytes:
    """Send `payload` (as far as the server reads it) and return all it answers until it
    closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        # The server may answer and close while we are still sending.
        with contextlib.suppress(OSError):
            sock.sendall(payload)
        return _read_to_close(sock, timeout)


def _read_to_close(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    return out


def _status(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer.split(b" ", 2)[1])


def _code(answer: bytes) -> str:
    return answer.split(b"<Code>", 1)[1].split(b"</Code>", 1)[0].decode()


def _get(target: bytes, headers: bytes = b"") -> bytes:
    return b"GET " + target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers + b"\r\n"


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * KiB
    raise AssertionError("no VmRSS")


# -- the limits, at their edges --------------------------------------------------------------


def test_a_request_target_at_the_limit_is_served_and_one_byte_more_is_414(
    node: GatewayNode,
) -> None:
    fits = b"/healthz?" + b"p" * (LINE - len(b"/healthz?"))
    answer = _exchange(node.port, _get(fits, b"Connection: close\r\n"))
    assert _status(answer) == 200
    answer = _exchange(node.port, _get(fits + b"p"))
    assert _status(answer) == 414
    assert _code(answer) == "RequestURITooLong"
    assert b"x-amz-request-id: " in answer and b"connection: close" in answer


def test_a_100_mib_request_line_is_answered_414_after_its_first_bytes(node: GatewayNode) -> None:
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as sock:
        sock.sendall(b"GET /")
        sent = 0
        while sent < 100 * MiB:
            if select.select([sock], [], [], 0)[0]:
                break  # the server has answered
            try:
                sock.sendall(b"a" * 65536)
            except OSError:
                break
            sent += 65536
        answer = _read_to_close(sock, 10)
    assert _status(answer) == 414
    assert sent < 4 * MiB


def test_header_fields_at_the_limits_are_served_and_past_them_431(node: GatewayNode) -> None:
    # Names and values count: 127 more fields besides Host, and values to fill the budget.
    host = len(b"Host") + len(b"127.0.0.1")
    close = len(b"Connection") + len(b"close")
    each, rest = divmod(HEADERS - host - close, FIELDS - 2)
    fields = [b"X-F%03d" % i for i in range(FIELDS - 2)]
    values = [b"v" * (each - len(name)) for name in fields]
    values[0] += b"v" * rest
    block = b"".join(n + b": " + v + b"\r\n" for n, v in zip(fields, values, strict=True))
    answer = _exchange(node.port, _get(b"/healthz", block + b"Connection: close\r\n"))
    assert _status(answer) == 200

    one_byte_more = block.replace(b"X-F000: v", b"X-F000: vv", 1)
    answer = _exchange(node.port, _get(b"/healthz", one_byte_more + b"Connection: close\r\n"))
    assert _status(answer) == 431
    assert _code(answer) == "RequestHeaderSectionTooLarge"

    one_field_more = b"".join(b"X-G%03d: 1\r\n" % i for i in range(FIELDS))
    answer = _exchange(node.port, _get(b"/healthz", one_field_more))
    assert _status(answer) == 431


def test_one_endless_header_value_is_answered_431(node: GatewayNode) -> None:
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ")
        sent = 0
        while sent < 100 * MiB and not select.select([sock], [], [], 0)[0]:
            try:
                sock.sendall(b"b" * 65536)
            except OSError:
                break
            sent += 65536
        answer = _read_to_close(sock, 10)
    assert _status(answer) == 431
    # The node stopped reading at its limit: what got out is at most what the kernels
    # buffer in between (this socket's send buffer and the node's receive buffer, each
    # autotuned up to its maximum; on a busy machine the node reads late and they fill up).
    assert sent < _buffered_at_most() + MiB


def _buffered_at_most() -> int:
    """The largest TCP send and receive buffers this kernel gives a connection, added."""
    most = 0
    for name in ("tcp_rmem", "tcp_wmem"):
        with open(f"/proc/sys/net/ipv4/{name}") as f:
            most += int(f.read().split()[2])
    return most


def test_endless_trailers_of_a_chunked_body_are_answered_431(node: GatewayNode) -> None:
    # /healthz answers without reading the body; the trailers that follow must not pile up.
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n"
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as sock:
        sock.sendall(head + b"X-Trailer: ")
        answer = b""
        sent = 0
        with contextlib.suppress(OSError):  # the node closes as it answers
            while b" 431 " not in answer and sent < 100 * MiB:
                if select.select([sock], [], [], 0)[0]:
                    if not (chunk := sock.recv(65536)):
                        break
                    answer += chunk
                else:
                    sock.sendall(b"t" * 65536)
                    sent += 65536
        answer += _read_to_close(sock, 10)
    assert _status(answer) == 200  # the answer to the request itself
    assert b"HTTP/1.1 431 " in answer and b"RequestHeaderSectionTooLarge" in answer
    assert sent < 4 * MiB


def test_bytes_that_are_not_http_are_answered_400_invalid_request(node: GatewayNode) -> None:
    answer = _exchange(node.port, b"HELLO THERE\r\n\r\n")
    assert _status(answer) == 400
    assert _code(answer) == "InvalidRequest"


def _presigned(node: GatewayNode, op: str, key: str) -> bytes:
    """The request target of a presigned URL for `op` on `key` of the files bucket."""
    url = node.client().generate_presigned_url(
        op, Params={"Bucket": "files", "Key": key}, ExpiresIn=600
    )
    return ("/" + url.split("/", 3)[3]).encode()


def _answers(data: bytes) -> list[tuple[int, bytes]]:
    """The answers one after another on a connection (status and body; each with a length)."""
    out = []
    while data:
        head, sep, data = data.partition(b"\r\n\r\n")
        assert sep, head[:200]
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        out.append((_status(head), data[:length]))
        data = data[length:]
    return out


def test_requests_sent_with_a_malformed_one_are_answered_up_to_it_and_none_after_it_run(
    node: GatewayNode,
) -> None:
    """A PUT and a GET, a malformed request, and another PUT, in one write: the PUT and the
    GET are carried out and answered in order, the malformed request is answered 400, the
    connection closes, and the PUT after it is not carried out."""
    host = b"Host: 127.0.0.1:%d\r\n" % node.port
    key = f"pipelined-{node.port}"
    put = b"PUT " + _presigned(node, "put_object", key) + b" HTTP/1.1\r\n" + host
    get = b"GET " + _presigned(node, "get_object", key) + b" HTTP/1.1\r\n" + host + b"\r\n"
    after = b"PUT " + _presigned(node, "put_object", key + "-after") + b" HTTP/1.1\r\n" + host
    malformed = b"GET /healthz HTTP/1.1\r\nHost: x\r\nNo colon in this field\r\n\r\n"
    payload = put + b"Content-Length: 6\r\n\r\nbefore" + get + malformed
    payload += after + b"Content-Length: 5\r\n\r\nafter"
    for _ in range(3):  # each server, whatever the order its tasks run in
        answers = _answers(_exchange(node.port, payload))
        assert [status for status, _ in answers] == [200, 200, 400], answers
        assert answers[1][1] == b"before"
        assert b"<Code>InvalidRequest</Code>" in answers[2][1]
        with pytest.raises(ClientError, match=r"404|Not Found"):
            node.client().head_object(Bucket="files", Key=key + "-after")


def test_real_clients_with_long_presigned_urls_and_many_headers_are_served(
    node: GatewayNode,
) -> None:
    s3 = node.client()
    # A key of 1024 bytes (S3's longest) in two-byte characters: 3 KiB once percent-encoded.
    key = "/".join(["é" * 100] * 5) + "/" + "ü" * 9 + "x"
    assert len(key.encode()) == 1024
    metadata = {f"field-{i:02d}": "m" * 60 for i in range(28)}  # ~2 KB of user metadata
    s3.put_object(
        Bucket="files",
        Key=key,
        Body=b"payload",
        Metadata=metadata,
        ChecksumAlgorithm="SHA256",
        ContentType="application/octet-stream",
        ContentDisposition='attachment; filename="' + "d" * 200 + '"',
        CacheControl="max-age=" + "9" * 100,
    )
    url = s3.generate_presigned_url(
        "get_object",
        Params={
            "Bucket": "files",
            "Key": key,
            # Percent-encoded by the client once more: 5 KB in the URL.
            "ResponseContentDisposition": "attachment; filename*=UTF-8''" + "%C3%A9" * 500,
            "ResponseContentType": "application/x-" + "t" * 200,
        },
        ExpiresIn=600,
    )
    assert 8 * KiB < len(url) < LINE
    got = httpx.get(url)
    assert got.status_code == 200 and got.content == b"payload"
    head = s3.head_object(Bucket="files", Key=key)
    assert head["Metadata"] == metadata


# -- time limits ------------------------------------------------------------------------------


@pytest.mark.parametrize("server", SERVERS)
def test_heads_that_never_finish_and_silent_connections_are_closed(
    tmp_path: Path, server: str
) -> None:
    """500 connections that send half a request head, or nothing, are closed after the head
    timeout; the half heads are told 408 RequestTimeout, the silent ones get no answer."""
    node = start_gateway(
        tmp_path / "n", args=("--head-timeout", "2", "--no-access-log", "--server", server)
    )
    try:
        half = [socket.create_connection(("127.0.0.1", node.port)) for _ in range(250)]
        silent = [socket.create_connection(("127.0.0.1", node.port)) for _ in range(250)]
        for sock in half:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Half: ")
        answers = [_read_to_close(sock, 15) for sock in half]
        quiet = [_read_to_close(sock, 15) for sock in silent]
        for sock in half + silent:
            sock.close()
        assert {_status(a) for a in answers} == {408}
        assert {_code(a) for a in answers} == {"RequestTimeout"}
        assert set(quiet) == {b""}
        # The node is well and serves the next client at once.
        assert httpx.get(node.url + "/healthz").status_code == 200
    finally:
        node.stop()


def test_bodies_that_stop_coming_are_answered_408_and_write_nothing(tmp_path: Path) -> None:
    """Slow-body clients (a PUT's head, then a few bytes of its body, then silence) hold a
    connection and a request each: the node's own server answers each 408 RequestTimeout
    after `body_timeout` without a byte of body and closes it; nothing is written. (uvicorn,
    the fallback, has no such timeout: docs/configuration.md.)"""
    files = tmp_path / "files"
    files.mkdir()
    data = tmp_path / "n"
    run_cli(data, None, "mount", "add", "files", files.as_uri())
    # The own server's alone, whatever GATEWAY_TEST_SERVER says: uvicorn has no body timeout.
    node = start_gateway(data, args=("--body-timeout", "2", "--no-access-log"), server="gateway")
    try:
        url = node.client().generate_presigned_url(
            "put_object", Params={"Bucket": "files", "Key": "slow.bin"}, ExpiresIn=600
        )
        target = ("/" + url.split("/", 3)[3]).encode()
        head = b"PUT " + target + b" HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % node.port
        slow = [socket.create_connection(("127.0.0.1", node.port)) for _ in range(50)]
        for sock in slow:
            sock.sendall(head + b"Content-Length: 1000\r\n\r\n" + b"x" * 10)
        answers = [_read_to_close(sock, 20) for sock in slow]
        for sock in slow:
            sock.close()
        assert {_status(a) for a in answers} == {408}
        assert {_code(a) for a in answers} == {"RequestTimeout"}
        assert not (files / "slow.bin").exists()
        assert node.metric("gateway_edge_closed", 'reason="body_timeout"') >= 50
        assert httpx.get(node.url + "/healthz").status_code == 200
    finally:
        node.stop()


@pytest.mark.parametrize("server", SERVERS)
def test_an_idle_keep_alive_connection_is_closed(tmp_path: Path, server: str) -> None:
    node = start_gateway(
        tmp_path / "n", args=("--keepalive-timeout", "1", "--no-access-log", "--server", server)
    )
    try:
        with socket.create_connection(("127.0.0.1", node.port), timeout=10) as sock:
            sock.sendall(_get(b"/healthz"))
            answer = b""
            while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
                answer += sock.recv(65536)
            assert _status(answer) == 200
            started = time.monotonic()
            assert _read_to_close(sock, 10) == b""  # closed by the node, not by our timeout
            assert time.monotonic() - started < 5
    finally:
        node.stop()


# -- the connection cap ----------------------------------------------------------------------


@pytest.mark.parametrize("server", SERVERS)
def test_connections_past_the_cap_are_answered_503_slowdown_at_once(
    tmp_path: Path, server: str
) -> None:
    # One worker: the cap is each worker process's (docs/configuration.md).
    node = start_gateway(
        tmp_path / "n",
        args=("--max-connections", "40", "--no-access-log", "--workers", "1", "--server", server),
    )
    try:
        held = [socket.create_connection(("127.0.0.1", node.port)) for _ in range(40)]
        for sock in held:  # each is served: the node has them all open
            sock.sendall(_get(b"/healthz"))
            assert _status(sock.recv(65536)) == 200
        answer = _exchange(node.port, _get(b"/healthz"))
        assert _status(answer) == 503
        assert _code(answer) == "SlowDown"
        # boto3 sees SlowDown, a throttling error it knows.
        s3 = node.client()
        with pytest.raises(Exception, match="SlowDown"):
            s3.list_buckets()
        for sock in held[:5]:
            sock.close()
        # Room again, once the node has seen them go.
        wait_http(node.url + "/healthz", timeout=10)
        assert s3.list_buckets()["ResponseMetadata"]["HTTPStatusCode"] == 200
        for sock in held[5:]:
            sock.close()
    finally:
        node.stop()


# -- memory under attack ---------------------------------------------------------------------


@pytest.mark.parametrize("server", SERVERS)
def test_memory_stays_flat_while_connections_stream_header_lines(
    tmp_path: Path, server: str
) -> None:
    """Four connections stream header lines (reconnecting when cut off), one a request line,
    one a single header value, for a bounded time; the node's RSS is sampled before, during
    and after. Unbounded, the same load grew a node by gigabytes: the attack stops early
    when the node has grown past the bound, so that a failing run does not eat the machine."""
    node = start_gateway(tmp_path / "n", args=("--no-access-log", "--server", server))
    pid = node.proc.pid
    try:
        for _ in range(20):  # warm: the first requests allocate what every request needs
            assert httpx.get(node.url + "/healthz").status_code == 200
        before = _rss(pid)
        bound = before + 64 * MiB
        stop = threading.Event()
        answers: list[int] = []
        peak = [before]

        def header_lines(prefix: bytes, line: bytes) -> None:
            while not stop.is_set():
                sock = socket.create_connection(("127.0.0.1", node.port), timeout=10)
                try:
                    sock.sendall(prefix)
                    while not stop.is_set():
                        if select.select([sock], [], [], 0)[0]:
                            answer = _read_to_close(sock, 5)
                            if answer:
                                answers.append(_status(answer))
                            break
                        sock.sendall(line * (65536 // len(line)))
                except OSError:
                    pass
                finally:
                    sock.close()

        head = _get(b"/")[:-2]  # a request line and a Host field, then more fields
        streams = [(head, b"X-Pad: " + b"a" * 100 + b"\r\n")] * 4
        streams += [(b"GET /", b"a" * 1024), (head + b"X-Big: ", b"b" * 1024)]
        attackers = [threading.Thread(target=header_lines, args=s) for s in streams]
        for thread in attackers:
            thread.start()
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and peak[0] < bound:
            peak[0] = max(peak[0], _rss(pid))
            time.sleep(0.05)
        stop.set()
        for thread in attackers:
            thread.join(30)
        after = _rss(pid)
        assert httpx.get(node.url + "/healthz").status_code == 200
    finally:
        node.stop()
    grown = (peak[0] - before) / MiB
    assert peak[0] < bound, f"grew {grown:.0f} MiB from {before / MiB:.0f} MiB under attack"
    assert after < before + 32 * MiB
    # The attack was answered, over and over: 431 for header lines, 414 for the request line.
    assert answers.count(431) > 20 and 414 in answers


# -- the fleet's port ------------------------------------------------------------------------


def test_the_fleet_port_has_the_same_limits_and_a_cap_of_its_own(tmp_path: Path) -> None:
    internal = free_port()
    node = start_gateway(
        tmp_path / "n",
        args=(
            "--fleet-secret", "edge-secret", "--internal-port", str(internal),
            "--max-connections", "30", "--no-access-log",
            # The cap is per worker process: one worker, so that the 31st connection finds
            # the one that holds the 30.
            "--workers", "1",
        ),
    )  # fmt: skip
    try:
        answer = _exchange(internal, _get(b"/_fleet/block?" + b"q" * LINE))
        assert _status(answer) == 414
        answer = _exchange(internal, _get(b"/_fleet/block", b"X-Big: " + b"b" * HEADERS + b"\r\n"))
        assert _status(answer) == 431
        # The S3 port full does not crowd out the peers.
        held = [socket.create_connection(("127.0.0.1", node.port)) for _ in range(30)]
        for sock in held:
            sock.sendall(_get(b"/healthz"))
            assert _status(sock.recv(65536)) == 200
        assert _status(_exchange(node.port, _get(b"/healthz"))) == 503
        answer = _exchange(internal, _get(b"/_fleet/block", b"Connection: close\r\n"))
        assert _status(answer) == 403  # reached the internal API: unsigned, so refused
        for sock in held:
            sock.close()
    finally:
        node.stop()


# -- settings ---------------------------------------------------------------------------------


def test_edge_settings_take_sizes_and_refuse_nonsense(tmp_path: Path) -> None:
    given = {"max_request_line": "8KiB", "max_header_bytes": "64KiB", "max_headers": "200"}
    given |= {"head_timeout": "2.5", "keepalive_timeout": "7", "max_connections": "10"}
    limits = EdgeLimits.from_settings(build_settings({**given, "workers": "3"}))
    assert limits == EdgeLimits(8 * KiB, 64 * KiB, 200, 2.5, 7, 10)
    for flag, value, problem in [
        ("--max-connections", "0", "max_connections must be at least 1"),
        ("--head-timeout", "nan", "head_timeout must be a positive number"),
        ("--body-timeout", "0", "body_timeout must be a positive number"),
        ("--max-header-bytes", "0", "max_header_bytes must be at least 1"),
    ]:
        out = run_cli(tmp_path, None, "serve", flag, value, check=False)
        assert out.returncode == 2 and problem in out.stderr
