"""Bodies of the stores that send them over HTTP in one request or in parts (S3, Azure),
streamed from an async iterator without ever holding them whole."""

from __future__ import annotations

import io
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from gateway.stores.base import IncompleteBody, StoreUnavailable

# Bytes of a streamed body kept for a retry of its request: every PUT sent in one request
# (s3.writes.MULTIPART_THRESHOLD) and every part up to this size can be sent again when the
# origin fails it (a 5xx, a pooled connection it had closed). Memory holds at most this much
# of a body, as it holds one part of a large PUT.
REPLAY_LIMIT = 16 << 20
# Parts are handed to aiohttp in slices of this size.
SLICE = 256 << 10


class StreamedBody:
    """A body aiohttp streams from an async iterator while botocore sees a file-like object.

    The last chunk is held back until the iterator has ended cleanly with exactly `size`
    bytes: a body that raises, even after its last byte, leaves the request short of its
    Content-Length, so the connection is cut and the origin never commits it.

    The first REPLAY_LIMIT bytes handed out are kept, so that botocore can retry a request
    the origin failed (a 5xx, a pooled connection it had closed) from the start; a longer
    body cannot be sent again, and `refused_replay` then says so.
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
        self.refused_replay = False

    def read(self, *_: Any) -> bytes:
        # botocore reads bodies only to sign or checksum them, which our client config turns off.
        raise io.UnsupportedOperation("a streamed body is sent by aiohttp, not read")

    def seek(self, offset: int, whence: int = 0) -> int:
        # botocore rewinds before a retry.
        if offset == 0 and whence == 0 and self._sent is not None and self.error is None:
            return 0
        self.refused_replay = self.error is None
        raise io.UnsupportedOperation("this streamed body cannot be sent again")

    def replay_failure(self, where: str) -> StoreUnavailable:
        """What to say when the origin failed the request and the body could not go again."""
        return StoreUnavailable(
            f"{where}: the origin failed the request after {self._sent_bytes} bytes of the"
            f" body had gone, and only the first {REPLAY_LIMIT} are kept to send again"
        )

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
