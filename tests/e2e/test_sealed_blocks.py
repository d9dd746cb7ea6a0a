"""End to end: a node whose cache folder is on an ext4 image made for the test, with the
`verity` feature. A byte of a cached block is flipped in the image behind the node's back (as a
bad sector would) and the kernel made to read it again; then many reads with zero-copy sends
on. With sealed blocks (fs-verity) not one damaged byte reaches a client and every read is
right (docs/cache.md, "Sealed blocks"); without them, the flip is served for the recheck window,
which is what sealing is for and what shows that the flip is what the kernel reads.

Needs root, loop devices and mkfs.ext4; the sealed case also a kernel with CONFIG_FS_VERITY.
Skipped, saying which, where they are missing."""

from __future__ import annotations

import errno
import os
import random
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.cache import verity
from gateway.cache.layout import block_path
from gateway.cache.pages import BlockKey
from tests.support.gateway import GatewayNode, start_gateway
from tests.support.net import eventually

MIB = 1 << 20
BODY = random.Random(42).randbytes(3 * MIB)  # 3 blocks of 1 MiB: sent from their files
AT = MIB + 300_000  # the flipped byte: in block 1, at 300,000
READS = 60
PAGE = 4096


@dataclass(frozen=True)
class Image:
    path: Path  # the image file behind the loop device
    mnt: Path  # where it is mounted


@pytest.fixture
def ext4_verity(tmp_path: Path) -> Iterator[Image]:
    """A 256 MiB sparse ext4 image with the `verity` feature, loop-mounted for this test."""
    if os.geteuid() != 0:
        pytest.skip("loop-mounting an ext4 image needs root")
    missing = [t for t in ("mkfs.ext4", "mount", "umount", "filefrag") if not shutil.which(t)]
    if missing:
        pytest.skip(f"no {', '.join(missing)}")
    if not os.path.exists("/dev/loop-control"):
        pytest.skip("no loop devices (/dev/loop-control)")
    image = tmp_path / "fs.img"
    with image.open("wb") as f:
        f.truncate(256 * MIB)
    mkfs = ["mkfs.ext4", "-q", "-F", "-O", "verity", "-b", "4096", str(image)]
    made = subprocess.run(mkfs, capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"mkfs.ext4 -O verity failed: {made.stderr.decode().strip()}")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot loop-mount an ext4 image: {mounted.stderr.decode().strip()}")
    try:
        # Not shared with mount namespaces other processes make meanwhile.
        subprocess.run(["mount", "--make-private", str(mnt)], check=True)
        yield Image(image, mnt)
    finally:
        while os.path.ismount(mnt):
            subprocess.run(["umount", "-l", str(mnt)], check=True)


def _node(tmp_path: Path, image: Image, *args: str) -> GatewayNode:
    files = tmp_path / "files"
    files.mkdir()
    (files / "obj.bin").write_bytes(BODY)
    node = start_gateway(
        tmp_path / "node",
        args=(
            "--workers", "1", "--cache-dir", str(image.mnt / "cache"), "--cache-min-free", "0",
            "--cache-capacity", "128MiB", "--no-fast-hits",
            # A window longer than the test: what is sent unread is only what seals make safe.
            "--zero-copy-recheck", "600", *args,
        ),
    )  # fmt: skip
    node.cli("mount", "add", "sealed", files.as_uri(), "-o", "block_size=1MiB")
    eventually(lambda: "sealed" in node.buckets())
    return node


def _block_file(node: GatewayNode, image: Image, index: int) -> Path:
    etag = node.client().head_object(Bucket="sealed", Key="obj.bin")["ETag"]
    name = BlockKey(1, "obj.bin", etag, MIB, index).name
    return Path(block_path(str(image.mnt / "cache"), 1, name))


def _disk_offset(path: Path, at: int) -> int:
    """Where byte `at` of the file is in its file system's image (filefrag's FIEMAP)."""
    out = subprocess.run(["filefrag", "-v", str(path)], capture_output=True, text=True, check=True)
    block = int(re.search(r"blocks of (\d+) bytes", out.stdout).group(1))  # type: ignore[union-attr]
    extents = re.findall(r"^\s*\d+:\s+(\d+)\.\.\s*(\d+):\s+(\d+)\.\.", out.stdout, re.M)
    for first, last, physical in extents:
        if int(first) <= at // block <= int(last):
            return (int(physical) + at // block - int(first)) * block + at % block
    raise AssertionError(f"byte {at} of {path} in no extent:\n{out.stdout}")


def _flip_on_disk(image: Image, path: Path, at: int) -> bytes | OSError:
    """Flip byte `at` of the block file in the image file (the loop device reads it from
    there), drop the file's pages from the page cache, and read the file again page by page
    as any reader of the disk would: what the kernel now gives of the page holding `at`, or
    its error."""
    os.sync()  # the block's data allocated and on the image, its pages clean
    offset = _disk_offset(path, at)
    with image.path.open("r+b") as f:
        f.seek(offset)
        old = f.read(1)
        f.seek(offset)
        f.write(bytes([old[0] ^ 0x01]))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        seen: bytes | OSError = b""
        for page in range(0, os.fstat(fd).st_size, PAGE):
            try:
                got: bytes | OSError = os.pread(fd, PAGE, page)
            except OSError as exc:
                got = exc
            if page <= at < page + PAGE:
                seen = got
        return seen
    finally:
        os.close(fd)


def _damaged_bytes_served(node: GatewayNode) -> tuple[int, int]:
    """READS ranges around the flipped byte, each within its block, so that each is answered
    as one region of the block's file (zero-copy) whenever the page store hands one over:
    (bytes that differ from the store's, reads that were not right)."""
    s3 = node.client()
    damaged = wrong = 0
    for n in range(READS):
        a, b = AT - 5000 - n, AT + 5000 + n
        got = s3.get_object(Bucket="sealed", Key="obj.bin", Range=f"bytes={a}-{b}")
        body, want = got["Body"].read(), BODY[a : b + 1]
        damaged += sum(x != y for x, y in zip(body, want, strict=False))
        wrong += body != want
    return damaged, wrong


def _warm(node: GatewayNode) -> None:
    """The object read until it is sent from its files unread: filled, read back from disk
    and checked, then sent. Read again until then: on a loaded machine the second read can
    come while the fill's commit is still under way, and is answered from the fill, so the
    blocks are first read from disk and checked by the third (CI, once)."""
    s3 = node.client()

    def sent_unread() -> bool:
        assert s3.get_object(Bucket="sealed", Key="obj.bin")["Body"].read() == BODY
        return node.metric("gateway_cache_zero_copy") >= 3

    eventually(sent_unread, timeout=60)


def test_a_byte_flipped_on_disk_under_a_sealed_block_is_never_served(
    tmp_path: Path, ext4_verity: Image
) -> None:
    why = verity.probe(str(ext4_verity.mnt))
    if why:
        pytest.skip(f"the image cannot seal files: {why}")
    node = _node(tmp_path, ext4_verity)
    try:
        assert "cache: sealed blocks on" in node.log()
        _warm(node)
        path = _block_file(node, ext4_verity, 1)
        fd = os.open(path, os.O_RDONLY)
        try:
            assert verity.is_sealed(fd)
        finally:
            os.close(fd)
        with pytest.raises(PermissionError):  # sealed files are read-only for good
            os.open(path, os.O_RDWR)
        seen = _flip_on_disk(ext4_verity, path, AT - MIB)
        assert isinstance(seen, OSError) and seen.errno == errno.EIO, "the kernel served it"
        corrupt = node.metric("gateway_cache_corrupt_blocks")
        sealed_sends = node.metric("gateway_cache_sealed_sends")
        assert _damaged_bytes_served(node) == (0, 0)
        assert node.client().get_object(Bucket="sealed", Key="obj.bin")["Body"].read() == BODY
        # Dropped as damaged and fetched again from the store, then sent from its new file.
        eventually(lambda: node.metric("gateway_cache_corrupt_blocks") >= corrupt + 1)
        eventually(lambda: node.metric("gateway_cache_sealed_sends") > sealed_sends)
    finally:
        node.stop()


def test_without_seals_a_byte_flipped_on_disk_is_served_for_the_window(
    tmp_path: Path, ext4_verity: Image
) -> None:
    """What the sealed test guards against, on the same image: the flip is what the kernel
    reads, and a block checked before it is sent unread until its recheck."""
    node = _node(tmp_path, ext4_verity, "--no-seal-blocks")
    try:
        _warm(node)
        path = _block_file(node, ext4_verity, 1)
        seen = _flip_on_disk(ext4_verity, path, AT - MIB)
        assert isinstance(seen, bytes) and seen[(AT - MIB) % PAGE] == BODY[AT] ^ 0x01
        damaged, wrong = _damaged_bytes_served(node)
        assert damaged == wrong == READS  # one byte in every read
    finally:
        node.stop()
