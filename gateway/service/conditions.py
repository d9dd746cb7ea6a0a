"""Conditional requests and byte ranges, evaluated against an object's metadata.

S3 follows RFC 7232's order: If-Match / If-Unmodified-Since fail with 412 before
If-None-Match / If-Modified-Since answer 304; If-Match wins over If-Unmodified-Since and
If-None-Match over If-Modified-Since.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime
from email.utils import format_datetime, parsedate_to_datetime

from gateway import decimals, errors
from gateway.stores.base import ObjectInfo


@dataclass(frozen=True, slots=True)
class Conditions:
    if_match: str | None = None
    if_none_match: str | None = None
    if_modified_since: str | None = None
    if_unmodified_since: str | None = None

    def __bool__(self) -> bool:
        return any(
            (self.if_match, self.if_none_match, self.if_modified_since, self.if_unmodified_since)
        )


def _etag_in(header: str, etag: str) -> bool:
    if header.strip() == "*":
        return True
    bare = etag.strip('"')
    for candidate in header.split(","):
        c = candidate.strip()
        if c.startswith("W/"):
            c = c[2:]
        if c.strip('"') == bare:
            return True
    return False


def _http_date(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):  # year 99999999999: Overflow
        return None  # S3 ignores an unparsable date rather than failing the request
    return parsed if parsed.tzinfo else None


def check_conditions(cond: Conditions, info: ObjectInfo) -> None:
    """Raise PreconditionFailed (412) or NotModified (304) as S3 would for a GET/HEAD."""
    if not cond:
        return
    modified = info.last_modified.replace(microsecond=0)
    if cond.if_match is not None:
        if not _etag_in(cond.if_match, info.etag):
            raise errors.PreconditionFailed(Condition="If-Match")
    else:
        since = _http_date(cond.if_unmodified_since)
        if since is not None and modified > since:
            raise errors.PreconditionFailed(Condition="If-Unmodified-Since")
    if cond.if_none_match is not None:
        if _etag_in(cond.if_none_match, info.etag):
            raise _not_modified(info)
    else:
        since = _http_date(cond.if_modified_since)
        if since is not None and modified <= since:
            raise _not_modified(info)


@functools.lru_cache(maxsize=1 << 16)
def http_date(dt: datetime) -> str:
    """RFC 7231 date of a Last-Modified; cached, since hot objects ask for the same ones."""
    return format_datetime(dt, usegmt=True)


def _not_modified(info: ObjectInfo) -> errors.S3Error:
    exc = errors.NotModified()
    exc.headers["etag"] = info.etag
    exc.headers["last-modified"] = http_date(info.last_modified)
    return exc


@dataclass(frozen=True, slots=True)
class ByteRange:
    """A parsed `Range: bytes=...` header: first-last, first- (last None) or -suffix."""

    first: int | None
    last: int | None

    @classmethod
    def parse(cls, header: str | None) -> ByteRange | None:
        """None for no header or one S3 ignores: a unit other than bytes, several ranges, or
        a range that does not parse (only ASCII digits count: `+1`, `1_0` or ` 1` make the
        header invalid, not a number; a position past 2^63 - 1 too) or ends before it
        starts. Unsatisfiable ranges parse; `resolve` refuses them."""
        if not header:
            return None
        unit, eq, spec = header.strip().partition("=")
        if not eq or unit.lower() != "bytes":
            return None
        first_s, dash, last_s = spec.partition("-")
        if not dash or (not first_s and not last_s):
            return None
        first = decimals.parse(first_s, decimals.INT64_MAX) if first_s else None
        last = decimals.parse(last_s, decimals.INT64_MAX) if last_s else None
        if (first_s and first is None) or (last_s and last is None):
            return None
        if first is not None and last is not None and last < first:
            return None
        return cls(first, last)

    def resolve(self, size: int) -> tuple[int, int]:
        """[start, end) within an object of `size` bytes, or InvalidRange (416)."""
        if self.first is None:
            assert self.last is not None
            if self.last == 0 or size == 0:
                raise errors.InvalidRange(ActualObjectSize=str(size), RangeRequested=str(self))
            return max(0, size - self.last), size
        if self.first >= size:
            raise errors.InvalidRange(ActualObjectSize=str(size), RangeRequested=str(self))
        end = size if self.last is None else min(self.last + 1, size)
        return self.first, end

    def __str__(self) -> str:
        first = "" if self.first is None else str(self.first)
        last = "" if self.last is None else str(self.last)
        return f"bytes={first}-{last}"
