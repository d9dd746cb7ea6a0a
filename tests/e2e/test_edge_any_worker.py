"""A warm epoch over a node of several workers is answered at the HTTP edge, whichever worker
filled each block: each object read once, over connections the kernel spreads across the
workers. Found with loadtest epochs: a worker answered at the edge only the blocks it had
filled or read itself, so about half of a warm epoch at two workers went the full path (its
ASGI cycle and a read on a thread). tests/unit/test_cache_siblings.py holds the page store's
side, with a damaged block."""

from __future__ import annotations

import os
import random
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.support.gateway import GatewayNode, run_cli, start_gateway

SIZE = 100 << 10  # a training image's size: the memory tier's, read from disk into it
COUNT = 64
READERS = 16


def _body(i: int) -> bytes:
    return (bytes([i]) + os.urandom(63)) * (SIZE // 64)


def _presigned(node: GatewayNode, key: str) -> bytes:
    url: str = node.client().generate_presigned_url(
        "get_object", Params={"Bucket": "warm", "Key": key}, ExpiresIn=3600
    )
    target = "/" + url.split("/", 3)[3]
    return f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{node.port}\r\n\r\n".encode()


def _read(sock: socket.socket) -> tuple[bytes, bytes]:
    """(head, body) of the next answer on the connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        assert more, "connection closed"
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    while len(body) < SIZE:
        more = sock.recv(SIZE - len(body))
        assert more, "connection closed"
        body += more
    return head.lower(), body


def _reader(port: int, requests: list[bytes]) -> list[tuple[bytes, bytes]]:
    """One reader of an epoch: its share of the requests in turn over one connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        answers = []
        for request in requests:
            sock.sendall(request)
            answers.append(_read(sock))
        return answers


def test_a_warm_epoch_over_several_workers_is_answered_at_the_edge(tmp_path: Path) -> None:
    files = tmp_path / "files"
    files.mkdir()
    bodies = {f"d{i:02d}": _body(i) for i in range(COUNT)}
    for key, body in bodies.items():
        (files / key).write_bytes(body)
    data = tmp_path / "data"
    run_cli(data, None, "mount", "add", "warm", files.as_uri(), "-o", "metadata_ttl=-1")
    node = start_gateway(data, args=("--workers", "2", "--cache-memory", "1MiB"))
    try:
        node.wait_workers()
        requests = {key: _presigned(node, key) for key in bodies}

        def epoch(cache: bytes, seed: int) -> None:
            # Sixteen readers at once, as a data loader's, in an order shuffled each epoch: the
            # kernel gives their connections to either worker.
            keys = list(requests)
            random.Random(seed).shuffle(keys)
            shares = [keys[i::READERS] for i in range(READERS)]
            with ThreadPoolExecutor(READERS) as pool:
                done = pool.map(lambda share: _reader(node.port, [requests[k] for k in share]),
                                shares)  # fmt: skip
                for share, answers in zip(shares, done, strict=True):
                    for key, (head, body) in zip(share, answers, strict=True):
                        assert body == bodies[key] and b"x-cache: " + cache in head, key

        epoch(b"miss", 1)  # each block filled by whichever worker got its request
        before = node.metric("gateway_edge_fast_answers")
        epoch(b"hit", 2)
        assert node.metric("gateway_edge_fast_answers") == before + COUNT
    finally:
        node.stop()
