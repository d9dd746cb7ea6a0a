"""Where the page store keeps things under its root, and the format of one block file.

    <root>/blocks/<mount id>/<ab>/<name>        committed blocks (name: 64 hex digits)
    <root>/keys.db                              which version of a key is cached: the name
                                                of its block 0 (keyrecords.py)
    <root>/inflight/<name>                      blocks being filled (the filler holds an flock)
    <root>/inflight/.w.<token>[.<index>]        a write-through's lock and its spooled blocks
    <root>/spare/<name>                         empty files a fill takes instead of making one
                                                (spare.py)
    <root>/retired/<name>                       blocks of invalidated versions, kept a while for
                                                the reads of them under way
    <root>/journal/<pid>-<token>.log            each process's record of fills, uses and drops
    <root>/index.snap                           the janitor's snapshot of the index
    <root>/janitor.lock                         flocked by the one process that evicts
    <root>/claims.lock                          a byte a block, locked while one process claims
                                                its sub-blocks (blockfile.claim_all)
    <root>/stats.json                           the janitor's figures, read by every worker

A block file is the block's bytes, a 32-byte trailer (magic, data length, CRC32C of the data,
flags, piece size), then a table: for every PIECE bytes of data, the CRC32C of the data from its
start to the end of that piece (4 bytes each, little endian). Any run of whole pieces is then
checked with one CRC over just its bytes, seeded with the entry before it: a read of a few
bytes of a large block reads and checks one piece, not the block. The bytes of a block start
at offset 0 and can be sent with sendfile. Blocks written before the table (magic S3GWBLK1:
the trailer last) are still read, checked whole.
"""

from __future__ import annotations

import os
import re
import struct
from array import array

from awscrt.checksums import crc32c

BLOCKS_DIR = "blocks"
KEYS_DIR = "keys"  # where an older cache kept its key records (symlinks)
INFLIGHT_DIR = "inflight"
RETIRED_DIR = "retired"
SPARE_DIR = "spare"
JOURNAL_DIR = "journal"
SNAPSHOT = "index.snap"
CLAIMS_LOCK = "claims.lock"  # a byte a block: its sub-blocks' claims one process at a time
JANITOR_LOCK = "janitor.lock"
STATS = "stats.json"

MAGIC = b"S3GWBLK2"
MAGIC_V1 = b"S3GWBLK1"  # no piece table: the trailer ends the file
TRAILER = struct.Struct(">8sQIIQ")  # magic, data length, crc32c, flags, piece size (v1: 0)
TRAILER_SIZE = TRAILER.size  # 32
PIECE = 16 << 10  # what a small range reads and checks at least: ~2 us here
FLAG_PINNED = 1

NAME = re.compile(r"[0-9a-f]{64}")


class Corrupt(Exception):
    """A block file whose size, trailer or checksum is wrong: drop it, never serve it."""


def block_path(root: str, mount_id: int, name: str) -> str:
    """256 directories under each mount, all made with the mount's first block (fan_out), so
    a miss never makes one: 1,000,000 blocks are ~4,000 a directory, which ext4's and XFS's
    hashed directories look up as fast as 15 (two levels of 256 made a directory, an inode,
    on most misses of a cache that had seen fewer than ~65,000 blocks, and cost 256 MiB of
    directories a mount once all were there)."""
    return f"{root}/{BLOCKS_DIR}/{mount_id}/{name[:2]}/{name}"


_HEX2 = re.compile(r"[0-9a-f]{2}")


def is_mount_folder(name: str) -> bool:
    """Whether `name` is a mount's folder under blocks/ as the page store names them (a mount
    id written plainly): anything else there is left alone."""
    return name.isdigit() and name == str(int(name)) and int(name) < 1 << 32


def fan_dirs(path: str) -> list[os.DirEntry[str]]:
    """The fan-out directories (two hex digits) in the folder at `path`."""
    with os.scandir(path) as entries:
        return [e for e in entries if _HEX2.fullmatch(e.name) and e.is_dir(follow_symlinks=False)]


def fan_out(block: str) -> None:
    """Make the folder of the mount of the block at path `block`, and its 256 directories
    (blocking; once a mount)."""
    top = os.path.dirname(os.path.dirname(block))
    os.makedirs(top, exist_ok=True)
    for i in range(256):
        os.makedirs(f"{top}/{i:02x}", exist_ok=True)


def inflight_path(root: str, name: str) -> str:
    return f"{root}/{INFLIGHT_DIR}/{name}"


def retired_path(root: str, name: str) -> str:
    return f"{root}/{RETIRED_DIR}/{name}"


def pieces(length: int) -> int:
    return -(-length // PIECE)


def tail_size(length: int) -> int:
    """Bytes after the data: the trailer and the piece table."""
    return TRAILER_SIZE + 4 * pieces(length)


def file_size(length: int) -> int:
    """Bytes on disk of a block holding `length` bytes of data."""
    return length + tail_size(length)


def trailer(length: int, crc: int, flags: int) -> bytes:
    """A trailer without its table: what blocks written before the piece table ended with."""
    return TRAILER.pack(MAGIC_V1, length, crc, flags, 0)


class Checksums:
    """The CRC32C of a block's data and at the end of each of its pieces, computed as the data
    passes in chunks of any size; tail() is what follows the data in the block's file."""

    __slots__ = ("crc", "length", "table")

    def __init__(self) -> None:
        self.crc = 0
        self.length = 0
        self.table = array("I")

    def update(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        while view:
            take = PIECE - self.length % PIECE
            self.crc = crc32c(view[:take], self.crc)
            self.length += min(take, len(view))
            view = view[take:]
            if self.length % PIECE == 0:
                self.table.append(self.crc)

    def tail(self, flags: int) -> bytes:
        table = array("I", self.table)
        if self.length % PIECE:
            table.append(self.crc)
        if _BIG_ENDIAN:
            table.byteswap()
        return TRAILER.pack(MAGIC, self.length, self.crc, flags, PIECE) + table.tobytes()


_BIG_ENDIAN = array("I", [1]).tobytes()[0] == 0


def piece_crcs(raw: bytes) -> array[int]:
    """The piece table's bytes as numbers."""
    table = array("I")
    table.frombytes(raw)
    if _BIG_ENDIAN:
        table.byteswap()
    return table


def parse_trailer(raw: bytes) -> tuple[bytes, int, int, int, int] | None:
    """(magic, data length, crc32c, flags, piece size), or None when these are not the bytes of
    a trailer."""
    if len(raw) != TRAILER_SIZE:
        return None
    magic, length, crc, flags, piece = TRAILER.unpack(raw)
    if magic not in (MAGIC, MAGIC_V1):
        return None
    return magic, length, crc, flags, piece
