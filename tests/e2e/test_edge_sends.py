"""How the node's HTTP edge sends answers, tried with raw sockets against a real node at its
defaults: a connection that asks for a hot object and never reads its answer costs the node a
small buffer, not a copy of the object."""

from __future__ import annotations

import contextlib
import random
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.gateway import GatewayNode, children, run_cli, start_gateway
from tests.support.net import eventually

KiB = 1 << 10
MiB = 1 << 20
HOT = random.Random(38).randbytes(4 * MiB)  # one block at the default block size


@pytest.fixture(scope="module")
def node(module_dir: Path) -> Iterator[GatewayNode]:
    files = module_dir / "files"
    files.mkdir()
    (files / "hot.bin").write_bytes(HOT)
    data = module_dir / "data"
    # Public: anonymous readers, as an attacker without credentials is; versions trusted for
    # an hour, so that the object stays a hit however slow the machine is.
    run_cli(
        data, None, "mount", "add", "pub", files.as_uri(), "-o", "public_read=true",
        "-o", "metadata_ttl=3600",
    )  # fmt: skip
    # The default worker count, and the node's own server whatever GATEWAY_TEST_SERVER
    # says: uvicorn writes each answer whole (docs/configuration.md, "The HTTP edge").
    node = start_gateway(data, args=("--no-access-log",), server="gateway")
    try:
        node.wait_workers()
        yield node
    finally:
        node.stop()


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * KiB
    raise AssertionError("no VmRSS")


def _node_rss(node: GatewayNode) -> int:
    """The resident memory of all the node's processes, added."""
    return sum(_rss(pid) for pid in [node.proc.pid, *children(node.proc.pid)])


def _request(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()


def _read_answer(sock: socket.socket) -> bytes:
    """One answer with a content-length from `sock`: its body."""
    stream = sock.makefile("rb")
    status = stream.readline()
    assert status.startswith(b"HTTP/1.1 200 "), status
    length = 0
    while (line := stream.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return stream.read(length)


def test_connections_that_never_read_a_hot_object_cost_a_small_buffer_each(
    node: GatewayNode,
) -> None:
    """200 anonymous connections each ask for a hot 4 MiB object and never read a byte of the
    answer: the node's memory (all its processes) grows by at most a slice of a send a
    connection (256 KiB, against the 4 MiB a copy of the object costs: 200 copies took 0.5-0.8
    GiB before); then every connection reads its answer whole."""
    # Hot in every worker: each process answers from the block it has read before. Many new
    # connections reach each of the node's workers (the kernel spreads them).
    for _ in range(40):
        got = httpx.get(node.url + "/pub/hot.bin", headers={"connection": "close"})
        assert got.status_code == 200 and got.content == HOT
    before = _node_rss(node)
    count = 200
    bound = before + count * 256 * KiB
    socks: list[socket.socket] = []
    peak = before
    try:
        for _ in range(count):
            # The kernels hold some of each answer (our receive buffer, the node's send
            # buffer, within the sizes they start at while nothing is read): not the node's.
            sock = socket.create_connection(("127.0.0.1", node.port), timeout=30)
            sock.sendall(_request("/pub/hot.bin"))
            socks.append(sock)
            peak = max(peak, _node_rss(node))

        # Every request has been taken up: each connection has its answer's first bytes
        # waiting (the positive signal that the node is answering all of them).
        def all_answering() -> bool:
            for sock in socks:
                sock.setblocking(False)
                try:
                    if not sock.recv(1, socket.MSG_PEEK):
                        raise AssertionError("a connection closed")
                except BlockingIOError:
                    return False
                finally:
                    sock.setblocking(True)
            return True

        eventually(all_answering, timeout=60)
        for _ in range(20):  # the memory while they all wait, sampled a few times
            peak = max(peak, _node_rss(node))
        grown = (peak - before) / MiB
        assert peak < bound, f"grew {grown:.0f} MiB from {before / MiB:.0f} MiB for {count}"
        for sock in socks:
            assert _read_answer(sock) == HOT
    finally:
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.close()
