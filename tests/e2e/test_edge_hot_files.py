"""Hits of blocks in the memory tier past `hot_file_min` sent from their files by the node's own
server (gateway/cache/hotfiles.py, PageStore.hot_region), tried with raw sockets against a
real node: byte-exact, counted as zero-copy sends where a smaller object is not, out of the
page cache sent from memory instead, and a file damaged after its check no longer sent once
the check falls due (docs/cache.md, "Zero-copy sends")."""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_edge_fast import _block_file, _evict
from tests.support.gateway import GatewayNode, run_cli, start_gateway
from tests.support.net import eventually

HOT = random.Random(3).randbytes(200 << 10)  # in the memory tier, past hot_file_min
SMALL = random.Random(4).randbytes(100 << 10)  # in the memory tier, below it
RECHECK = 2.0  # zero_copy_recheck of the node, seconds


@pytest.fixture(scope="module")
def node(module_dir: Path) -> Iterator[GatewayNode]:
    files = module_dir / "files"
    files.mkdir()
    (files / "hot.bin").write_bytes(HOT)
    (files / "small.bin").write_bytes(SMALL)
    data = module_dir / "data"
    run_cli(data, None, "mount", "add", "hot", files.as_uri(), "-o", "metadata_ttl=3600")
    # One worker: a hit's file is sent by the process that filled or read the block. Unsealed:
    # a test damages a block file through the file system, which a sealed file refuses.
    node = start_gateway(
        data,
        args=("--workers", "1", "--no-seal-blocks", "--zero-copy-recheck", str(RECHECK)),
    )
    try:
        yield node
    finally:
        node.stop()


def _get_many(node: GatewayNode, key: str, count: int) -> list[bytes]:
    """`count` GETs of `key` over one kept-alive connection, by its presigned URL (a plain
    hit the edge answers): the bodies, each with x-cache: hit."""
    url = node.client().generate_presigned_url(
        "get_object", Params={"Bucket": "hot", "Key": key}, ExpiresIn=3600
    )
    target = ("/" + url.split("/", 3)[3]).encode()
    request = b"GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % (target, node.port)
    bodies = []
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as sock:
        stream = sock.makefile("rb")
        for _ in range(count):
            sock.sendall(request)
            assert stream.readline().startswith(b"HTTP/1.1 200 ")
            headers: dict[str, str] = {}
            while (line := stream.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            assert headers["x-cache"] == "hit"
            bodies.append(stream.read(int(headers["content-length"])))
    return bodies


def _zero_copy(node: GatewayNode) -> float:
    return node.metric("gateway_cache_zero_copy")


def _warm(node: GatewayNode) -> None:
    s3 = node.client()
    for key, body in (("hot.bin", HOT), ("small.bin", SMALL)):
        for _ in range(2):  # a miss (filled, in the memory tier), then a hit
            assert s3.get_object(Bucket="hot", Key=key)["Body"].read() == body


def test_a_hot_block_past_the_threshold_is_sent_from_its_file(node: GatewayNode) -> None:
    _warm(node)
    before = _zero_copy(node)
    assert _get_many(node, "hot.bin", 20) == [HOT] * 20
    eventually(lambda: _zero_copy(node) >= before + 20)
    # Below the threshold the memory tier's bytes are written: no file sent.
    sent = _zero_copy(node)
    assert _get_many(node, "small.bin", 20) == [SMALL] * 20
    assert _get_many(node, "hot.bin", 1) == [HOT]  # published after the small ones
    eventually(lambda: _zero_copy(node) >= sent + 1)
    assert _zero_copy(node) == sent + 1


def test_a_hot_file_out_of_the_page_cache_is_not_sent_its_memory_copy_is(
    node: GatewayNode,
) -> None:
    _warm(node)
    block = eventually(lambda: _block_file(node, len(HOT)))
    eventually(lambda: _evict(block))
    # A send from it would wait for the disk on the event loop: the memory tier's bytes go.
    sent = _zero_copy(node)
    assert _get_many(node, "hot.bin", 1) == [HOT]
    assert _get_many(node, "small.bin", 1) == [SMALL]  # published after the hot one
    assert _zero_copy(node) == sent
    # Hits that follow may go from the file again once it is back in the page cache: CI saw
    # 4 of 5 in a row sent from it after this test's first (what read it back in so soon
    # was not pinned down; a send checks the page cache first, cachestat, either way).
    assert _get_many(node, "hot.bin", 4) == [HOT] * 4


def test_a_hot_file_damaged_after_its_check_is_not_sent_once_the_check_falls_due(
    node: GatewayNode,
) -> None:
    _warm(node)
    assert _get_many(node, "hot.bin", 3) == [HOT] * 3
    block = eventually(lambda: _block_file(node, len(HOT)))
    assert len(block.read_bytes()) > len(HOT)  # all of it in the page cache again
    with open(block, "r+b") as f:  # in the page cache: what a send would read
        f.seek(5000)
        byte = f.read(1)
        f.seek(5000)
        f.write(bytes([byte[0] ^ 0xFF]))
    # Within the window the damage may be sent (the documented risk); once the check falls
    # due the file fails it and is dropped, and the memory tier's bytes (checked when read
    # in) are sent.
    corrupt = node.metric("gateway_cache_corrupt_blocks")
    eventually(lambda: _get_many(node, "hot.bin", 1) == [HOT])
    # A right answer can come from the memory tier before any send has checked the file
    # (its pages not all in the page cache): the hits go on until one finds the damage.
    eventually(lambda: _get_many(node, "hot.bin", 1) == [HOT] and (
        node.metric("gateway_cache_corrupt_blocks") > corrupt
    ))  # fmt: skip
    eventually(lambda: not block.exists())
    sent = _zero_copy(node)
    assert _get_many(node, "hot.bin", 20) == [HOT] * 20
    assert _get_many(node, "small.bin", 1) == [SMALL]
    assert _zero_copy(node) == sent
