"""Where the page store keeps things under its root, and the format of one block file.

    <root>/blocks/<mount id>/<ab>/<cd>/<name>   committed blocks (name: 64 hex digits)
    <root>/inflight/<name>                      blocks being filled (the filler holds an flock)
    <root>/journal/<pid>-<token>.log            each process's record of fills, uses and drops
    <root>/index.snap                           the janitor's snapshot of the index
    <root>/janitor.lock                         flocked by the one process that evicts
    <root>/stats.json                           the janitor's figures, read by every worker

A block file is the block's bytes followed by a 32-byte trailer (magic, data length, CRC32C of
the data, flags), so the bytes of a block start at offset 0 and can be sent with sendfile.
Nothing here blocks but the functions that say so.
"""

from __future__ import annotations

import re
import struct

BLOCKS_DIR = "blocks"
INFLIGHT_DIR = "inflight"
JOURNAL_DIR = "journal"
SNAPSHOT = "index.snap"
JANITOR_LOCK = "janitor.lock"
STATS = "stats.json"

MAGIC = b"S3GWBLK1"
TRAILER = struct.Struct(">8sQIIQ")  # magic, data length, crc32c, flags, reserved
TRAILER_SIZE = TRAILER.size  # 32
FLAG_PINNED = 1

NAME = re.compile(r"[0-9a-f]{64}")


def block_path(root: str, mount_id: int, name: str) -> str:
    """Two levels of 256 directories under each mount keep every directory small."""
    return f"{root}/{BLOCKS_DIR}/{mount_id}/{name[:2]}/{name[2:4]}/{name}"


def inflight_path(root: str, name: str) -> str:
    return f"{root}/{INFLIGHT_DIR}/{name}"


def file_size(length: int) -> int:
    """Bytes on disk of a block holding `length` bytes of data."""
    return length + TRAILER_SIZE


def trailer(length: int, crc: int, flags: int) -> bytes:
    return TRAILER.pack(MAGIC, length, crc, flags, 0)


def parse_trailer(raw: bytes) -> tuple[int, int, int] | None:
    """(data length, crc32c, flags), or None when these are not the bytes of a trailer."""
    if len(raw) != TRAILER_SIZE:
        return None
    magic, length, crc, flags, _ = TRAILER.unpack(raw)
    if magic != MAGIC:
        return None
    return length, crc, flags
