"""Hits at the edge of blocks on disk, not in the memory tier, sent from their files under the
zero-copy rules (PageStore.peek_sendable; docs/cache.md, "Zero-copy sends"), tried with raw
sockets against a real node: a block the memory tier takes goes out from its file at its
first disk hit and is read into the tier at its second (hot again); a block checked within
`zero_copy_recheck` is sent unread, and read and checked again once its window is up; a
block damaged on disk is found, dropped and fetched again."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_edge_fast import _block_file
from tests.e2e.test_edge_hot_files import _get_many
from tests.support.gateway import GatewayNode, run_cli, start_gateway
from tests.support.net import eventually

# Each object in the memory tier's range (<= 256 KiB) and past send_file_min (64 KiB), each of
# its own size (a block file is found by its size); the tier holds one of a pair at a time
# (--cache-memory 150KiB): reading one drops the other.
A = random.Random(11).randbytes(100 << 10)
B = random.Random(12).randbytes(112 << 10)
D = random.Random(13).randbytes(72 << 10)
E = random.Random(14).randbytes(124 << 10)
LARGE = random.Random(15).randbytes(300 << 10)  # past the memory tier's largest object
# A loop over two blocks whose bytes together pass the tier (150 KiB), after a third that it
# holds: each is sent from its file every time, none read into the tier (it keeps H).
F = random.Random(16).randbytes(96 << 10)
G = random.Random(17).randbytes(104 << 10)
H = random.Random(18).randbytes(88 << 10)
RECHECK = 4.0  # zero_copy_recheck of the node, seconds


@pytest.fixture(scope="module")
def node(module_dir: Path) -> Iterator[GatewayNode]:
    files = module_dir / "files"
    files.mkdir()
    bodies = (("a", A), ("b", B), ("d", D), ("e", E), ("large", LARGE), ("f", F), ("g", G),
              ("h", H))  # fmt: skip
    for name, body in bodies:
        (files / f"{name}.bin").write_bytes(body)
    data = module_dir / "data"
    run_cli(data, None, "mount", "add", "hot", files.as_uri(), "-o", "metadata_ttl=3600")
    # One worker: the edge's figures and checks are one process's. Unsealed: a test damages a
    # block file through the file system, which a sealed file refuses.
    node = start_gateway(
        data,
        args=(
            "--workers", "1", "--no-seal-blocks", "--zero-copy-recheck", str(RECHECK),
            "--cache-memory", "150KiB",
        ),
    )  # fmt: skip
    try:
        yield node
    finally:
        node.stop()


def _figure(node: GatewayNode, name: str) -> float:
    return node.metric(f"gateway_cache_{name}")


def _miss(node: GatewayNode, key: str, body: bytes) -> None:
    """A miss through the full path: the block filled (checked as it is written) and put in
    the memory tier, its file committed."""
    s3 = node.client()
    assert s3.get_object(Bucket="hot", Key=key)["Body"].read() == body
    eventually(lambda: _block_file_of(node, len(body)))


def _block_file_of(node: GatewayNode, size: int) -> Path | None:
    try:
        return _block_file(node, size)
    except AssertionError:
        return None


def test_a_block_on_disk_goes_out_from_its_file_then_into_the_memory_tier_when_hot_again(
    node: GatewayNode,
) -> None:
    _miss(node, "a.bin", A)
    _miss(node, "b.bin", B)  # in the memory tier now, a.bin out of it (on disk)
    sent, memory = _figure(node, "zero_copy"), _figure(node, "memory_hits")
    assert _get_many(node, "a.bin", 1) == [A]  # its first disk hit: from its file
    eventually(lambda: _figure(node, "zero_copy") == sent + 1)
    assert _get_many(node, "a.bin", 1) == [A]  # hot again: read into the tier, from memory
    assert _get_many(node, "a.bin", 1) == [A]  # from the tier
    eventually(lambda: _figure(node, "memory_hits") >= memory + 1)
    assert _figure(node, "zero_copy") == sent + 1  # published with the memory hits


def test_a_loop_over_more_bytes_than_the_memory_tier_holds_goes_out_from_the_files(
    node: GatewayNode,
) -> None:
    # Two blocks hit in turn are each hot again after the other: read into the tier at each
    # second hit, each would evict the other (and H), a copy and an eviction a hit. Their
    # reuse distance (the other's bytes, and their own) passes the tier: both stay on disk.
    _miss(node, "f.bin", F)
    _miss(node, "g.bin", G)
    _miss(node, "h.bin", H)  # the tier holds H alone now
    sent, memory = _figure(node, "zero_copy"), _figure(node, "memory_hits")
    for _ in range(3):
        assert _get_many(node, "f.bin", 1) == [F]
        assert _get_many(node, "g.bin", 1) == [G]
    eventually(lambda: _figure(node, "zero_copy") >= sent + 6)
    assert _get_many(node, "h.bin", 1) == [H]  # still in the tier: nothing displaced it
    eventually(lambda: _figure(node, "memory_hits") >= memory + 1)
    assert _figure(node, "zero_copy") == sent + 6  # published with the memory hit
    assert _figure(node, "memory_hits") == memory + 1


def test_a_block_checked_within_the_window_is_sent_unread_and_checked_again_after_it(
    node: GatewayNode,
) -> None:
    _miss(node, "large.bin", LARGE)  # checked as it was written
    checked = _figure(node, "rechecks")
    # Until its window is up it goes out from its file unread; after, one send reads and
    # checks it first, and those after it go unread again.
    eventually(lambda: _get_many(node, "large.bin", 1) == [LARGE] and (
        _figure(node, "rechecks") > checked
    ))  # fmt: skip
    checked, sent = _figure(node, "rechecks"), _figure(node, "zero_copy")
    assert _get_many(node, "large.bin", 5) == [LARGE] * 5
    eventually(lambda: _figure(node, "zero_copy") >= sent + 5)
    assert _figure(node, "rechecks") in (checked, checked + 1)  # at most a window's end


def test_a_block_damaged_on_disk_is_dropped_and_fetched_again(node: GatewayNode) -> None:
    _miss(node, "d.bin", D)
    _miss(node, "e.bin", E)  # d.bin out of the memory tier, on disk
    block = _block_file(node, len(D))
    with open(block, "r+b") as f:  # in the page cache: what a send would read
        f.seek(5000)
        byte = f.read(1)
        f.seek(5000)
        f.write(bytes([byte[0] ^ 0xFF]))
    # Within the window the damage may be sent from the file (the documented risk); a read
    # into the memory tier, or the check once the window is up, fails, the block is dropped
    # and the store's bytes are sent.
    corrupt = _figure(node, "corrupt_blocks")
    eventually(lambda: _get_many(node, "d.bin", 1) == [D])
    eventually(lambda: _figure(node, "corrupt_blocks") > corrupt)
    assert _get_many(node, "d.bin", 3) == [D] * 3
