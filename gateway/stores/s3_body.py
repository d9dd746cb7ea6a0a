"""What an S3 request carries for a write: attributes and checksums as botocore arguments,
and bodies streamed from an async iterator without ever holding them whole."""

from __future__ import annotations

import contextlib
import io
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

from gateway.stores.base import IncompleteBody, WriteAttrs

# Bytes of a streamed body kept for a retry of its request.
REPLAY_LIMIT = 1 << 20
# Parts are handed to aiohttp in slices of this size.
SLICE = 256 << 10

# Our checksum names -> S3's algorithm names; the first one a writer gives goes to the origin.
ALGORITHMS = {
    "sha256": "SHA256",
    "sha1": "SHA1",
    "crc64nvme": "CRC64NVME",
    "crc32c": "CRC32C",
    "crc32": "CRC32",
}


def attr_args(attrs: WriteAttrs) -> dict[str, Any]:
    args: dict[str, Any] = {"Metadata": dict(attrs.metadata)}
    for name, value in (
        ("ContentType", attrs.content_type),
        ("ContentEncoding", attrs.content_encoding),
        ("ContentDisposition", attrs.content_disposition),
        ("ContentLanguage", attrs.content_language),
        ("CacheControl", attrs.cache_control),
    ):
        if value is not None:
            args[name] = value
    if attrs.expires is not None:
        # botocore takes only a date here; an unparsable Expires is as good as none to a cache.
        with contextlib.suppress(TypeError, ValueError):
            args["Expires"] = parsedate_to_datetime(attrs.expires)
    return args


def checksum_args(checksums: Mapping[str, str]) -> dict[str, str]:
    """One checksum for the origin to verify and keep (S3 takes one a request)."""
    for name, algorithm in ALGORITHMS.items():
        if name in checksums:
            return {"ChecksumAlgorithm": algorithm, f"Checksum{algorithm}": checksums[name]}
    return {}


def checksums_of(response: Mapping[str, Any]) -> dict[str, str]:
    """The full-object checksums in an origin's answer; a multipart's composite ones are not."""
    if response.get("ChecksumType") == "COMPOSITE":
        return {}
    found = {n: response.get(f"Checksum{a}") for n, a in ALGORITHMS.items()}
    return {n: v for n, v in found.items() if isinstance(v, str) and "-" not in v}


def answered_at(response: Mapping[str, Any]) -> datetime:
    """The origin's clock at its answer: S3 gives no Last-Modified to a PUT."""
    date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    with contextlib.suppress(TypeError, ValueError):
        return parsedate_to_datetime(date).astimezone(UTC)
    return datetime.now(UTC)


class StreamedBody:
    """A body aiohttp streams from an async iterator while botocore sees a file-like object.

    The last chunk is held back until the iterator has ended cleanly with exactly `size`
    bytes: a body that raises, even after its last byte, leaves the request short of its
    Content-Length, so the connection is cut and the origin never commits it.

    The first REPLAY_LIMIT bytes handed out are kept, so that botocore can retry a request
    that failed early (typically a pooled connection the origin had closed) from the start.
    """

    def __init__(self, source: AsyncIterator[bytes], size: int, key: str) -> None:
        self._source = source
        self._size = size
        self._key = key
        self._taken = 0  # bytes taken from the source
        self._held: bytes | None = None
        self._sent: list[bytes] | None = []  # None: too much went out to replay
        self._sent_bytes = 0
        self.error: BaseException | None = None

    def read(self, *_: Any) -> bytes:
        # botocore reads bodies only to sign or checksum them, which our client config turns off.
        raise io.UnsupportedOperation("a streamed body is sent by aiohttp, not read")

    def seek(self, offset: int, whence: int = 0) -> int:
        # botocore rewinds before a retry.
        if offset == 0 and whence == 0 and self._sent is not None and self.error is None:
            return 0
        raise io.UnsupportedOperation("this streamed body cannot be sent again")

    def tell(self) -> int:
        return 0

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    def _out(self, chunk: bytes) -> bytes:
        if self._sent is not None:
            self._sent_bytes += len(chunk)
            if self._sent_bytes <= REPLAY_LIMIT:
                self._sent.append(chunk)
            else:
                self._sent = None
        return chunk

    async def _chunks(self) -> AsyncGenerator[bytes, None]:
        # A retry first sends again what the failed attempt had sent, then goes on.
        for chunk in list(self._sent or ()):
            yield chunk
        try:
            async for chunk in self._source:
                if not chunk:
                    continue
                self._taken += len(chunk)
                if self._taken > self._size:
                    raise IncompleteBody(f"{self._key}: the body is longer than {self._size} bytes")
                held, self._held = self._held, chunk
                if held is not None:
                    yield self._out(held)
            if self._taken != self._size:
                raise IncompleteBody(
                    f"{self._key}: the body ended after {self._taken} of {self._size} bytes"
                )
        except Exception as exc:  # not GeneratorExit: aiohttp closing a failed attempt
            self.error = exc
            raise
        held, self._held = self._held, None
        if held is not None:
            yield self._out(held)


async def drain(body: AsyncIterator[bytes], size: int, key: str) -> None:
    """Consume an empty body, so that it can still fail the write before the request."""
    async for chunk in body:
        if chunk:
            raise IncompleteBody(f"{key}: the body is longer than its declared {size} bytes")


class PartBody:
    """One part of a large PUT, held in memory and sent in slices; unlike a streamed body it
    can be sent again, so botocore may retry it."""

    def __init__(self, data: bytearray) -> None:
        self._data = data

    def release(self) -> None:
        """Drop the bytes: a failed attempt's frames may keep this object until a GC cycle."""
        self._data = bytearray()

    def __len__(self) -> int:
        return len(self._data)

    def read(self, *_: Any) -> bytes:
        raise io.UnsupportedOperation("a part is sent by aiohttp, not read")

    def seek(self, offset: int, whence: int = 0) -> int:
        if offset == 0 and whence == 0:
            return 0
        raise io.UnsupportedOperation("a part is sent from its start only")

    def tell(self) -> int:
        return 0

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._slices()

    async def _slices(self) -> AsyncGenerator[bytes, None]:
        # Copies, not views: a view held by a failed attempt would pin the whole part.
        for at in range(0, len(self._data), SLICE):
            yield bytes(memoryview(self._data)[at : at + SLICE])


async def split(
    body: AsyncIterator[bytes], size: int, part_size: int, key: str
) -> AsyncGenerator[PartBody, None]:
    """The body as parts of part_size bytes (the last one shorter), each gathered into one
    buffer as it arrives; IncompleteBody unless the body has exactly `size` bytes."""
    taken = have = 0
    part = bytearray(min(part_size, size))
    async for chunk in body:
        taken += len(chunk)
        if taken > size:
            raise IncompleteBody(f"{key}: the body is longer than its declared {size} bytes")
        view = memoryview(chunk)
        while view:
            n = min(len(part) - have, len(view))
            part[have : have + n] = view[:n]
            have, view = have + n, view[n:]
            if have == len(part):
                full, part = PartBody(part), bytearray()
                yield full
                # Allocated only now, the part before sent and dropped: one buffer lives.
                del full
                part, have = bytearray(min(part_size, size - (taken - len(view)))), 0
    if taken != size:
        raise IncompleteBody(f"{key}: the body ended after {taken} of {size} bytes")
