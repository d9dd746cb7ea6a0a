"""End to end: bodies of cached blocks sent from their files (sendfile) by the node's own
server, through boto3: whole objects and ranges byte-exact, and a block damaged on disk
after its check found by the check the zero-copy policy promises (docs/cache.md, "Zero-copy
sends"): the first send after `zero_copy_recheck` seconds reads and checks it first."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.gateway import GatewayNode, start_gateway
from tests.support.net import eventually

MIB = 1 << 20
BIG = random.Random(7).randbytes(6 * MIB + 12345)  # 7 blocks of 1 MiB, the last short
ONE = random.Random(8).randbytes(MIB - 100)  # one block, above the memory tier


@pytest.fixture(scope="module")
def node(module_dir: Path) -> Iterator[GatewayNode]:
    files = module_dir / "files"
    files.mkdir()
    (files / "big.bin").write_bytes(BIG)
    (files / "one.bin").write_bytes(ONE)
    node = start_gateway(
        module_dir / "node",
        # Unsealed: a test here damages a block through the file system, which a sealed
        # file refuses (tests/e2e/test_sealed_blocks.py is the sealed case).
        args=("--workers", "1", "--zero-copy-recheck", "2", "--no-fast-hits", "--no-seal-blocks"),
    )
    node.cli("mount", "add", "zcopy", files.as_uri(), "-o", "block_size=1MiB")
    eventually(lambda: "zcopy" in node.buckets())
    yield node
    node.stop()


def _zero_copy(node: GatewayNode) -> float:
    return node.metric("gateway_cache_zero_copy")


def test_whole_objects_and_ranges_are_byte_exact(node: GatewayNode) -> None:
    s3 = node.client()
    for _ in range(2):  # filled, then read back from disk (checked)
        assert s3.get_object(Bucket="zcopy", Key="big.bin")["Body"].read() == BIG
        assert s3.get_object(Bucket="zcopy", Key="one.bin")["Body"].read() == ONE
    before = _zero_copy(node)
    got = s3.get_object(Bucket="zcopy", Key="big.bin")
    assert got["Body"].read() == BIG
    assert got["ContentLength"] == len(BIG)
    assert s3.get_object(Bucket="zcopy", Key="one.bin")["Body"].read() == ONE
    # 6 whole blocks and 1, each sent from its file (the short last block of 12,345 bytes is
    # in the memory tier); the workers publish their figures once a second.
    eventually(lambda: _zero_copy(node) >= before + 7)
    rng = random.Random(1)
    cases = [(0, 0), (MIB - 1, MIB), (MIB - 10, 3 * MIB + 10), (len(BIG) - 5, len(BIG) - 1)]
    cases += [(a, a + rng.randrange(1, 2 * MIB)) for a in rng.sample(range(len(BIG) - 1), 12)]
    for a, b in cases:
        b = min(b, len(BIG) - 1)
        got = s3.get_object(Bucket="zcopy", Key="big.bin", Range=f"bytes={a}-{b}")
        assert got["Body"].read() == BIG[a : b + 1], (a, b)
        assert got["ContentRange"] == f"bytes {a}-{b}/{len(BIG)}"
    got = s3.get_object(Bucket="zcopy", Key="one.bin", Range="bytes=1000-")
    assert got["Body"].read() == ONE[1000:]
    # Every range but the one inside the short last block touches a block on disk.
    eventually(lambda: _zero_copy(node) >= before + 7 + len(cases) - 1)


def _blocks(node: GatewayNode) -> list[Path]:
    return [p for p in (node.data_dir / "cache" / "blocks").rglob("*") if p.is_file()]


def test_a_block_damaged_after_its_check_is_found_at_the_recheck(node: GatewayNode) -> None:
    s3 = node.client()
    assert s3.get_object(Bucket="zcopy", Key="big.bin")["Body"].read() == BIG
    blocks = [p for p in _blocks(node) if p.stat().st_size > MIB]  # whole 1 MiB blocks
    assert blocks
    for path in blocks:  # one byte flipped in each, through the page cache
        fd = os.open(path, os.O_RDWR)
        try:
            byte = os.pread(fd, 1, 4321)
            os.pwrite(fd, bytes([byte[0] ^ 0xFF]), 4321)
        finally:
            os.close(fd)
    corrupt = node.metric("gateway_cache_corrupt_blocks")
    # Within the recheck interval a send may carry the damage (the policy's risk); the first
    # send after it checks the block, drops it and serves the store's bytes.
    # The object read whole is right only once each of its damaged blocks has been found.
    eventually(lambda: s3.get_object(Bucket="zcopy", Key="big.bin")["Body"].read() == BIG)
    eventually(lambda: node.metric("gateway_cache_corrupt_blocks") >= corrupt + 6)
    assert s3.get_object(Bucket="zcopy", Key="big.bin")["Body"].read() == BIG
