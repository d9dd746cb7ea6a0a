"""ETags as S3 makes them, for the stores that compute their own (file, HDFS, GCS): MD5s,
multipart ETags, and the bare form in which two ETags compare; and S3's rules on the parts of
a multipart upload, for the stores that keep uploads of their own."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from gateway.stores.base import InvalidPart, PartInfo, same_etag

MAX_PART_NUMBER = 10000  # S3's: parts are numbered 1..10000


def new_md5() -> Any:
    return hashlib.md5(usedforsecurity=False)


def bare(etag: str) -> str:
    """The ETag without quotes or weak mark: the form in which two of them compare."""
    return etag.strip().removeprefix("W/").strip('"')


def same(a: str | None, b: str | None) -> bool:
    """Whether two ETags name one version, compared by value (base.same_etag)."""
    return same_etag(a, b)


def quoted(etag: str) -> str:
    """The ETag in S3's own form, '"VALUE"': what an origin's answer is made into before the
    gateway keeps it, so that a version has one name whichever form the origin gave."""
    return f'"{bare(etag)}"'


def multipart_etag(etags: Sequence[str]) -> str:
    """S3's ETag of a multipart object: the MD5 of the parts' binary MD5s, then '-N'."""
    md5 = new_md5()
    md5.update(b"".join(bytes.fromhex(bare(e)) for e in etags))
    return f'"{md5.hexdigest()}-{len(etags)}"'


def check_part_number(part_number: int) -> None:
    """ValueError unless `part_number` is one S3 takes."""
    if not 1 <= part_number <= MAX_PART_NUMBER:
        raise ValueError(f"part number {part_number} is not in 1..{MAX_PART_NUMBER}")


def check_part_order(parts: Sequence[PartInfo]) -> None:
    """InvalidPart unless a completion names parts in ascending order, each once."""
    numbers = [p.part_number for p in parts]
    if not parts or numbers != sorted(set(numbers)):
        raise InvalidPart("parts must be given in ascending order, each once")
