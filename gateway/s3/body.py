"""The body of a PUT or UploadPart: the ASGI receive stream turned into the object's verified
bytes (lengths, aws-chunked, x-amz-content-sha256, Content-MD5, checksums), in bounded memory."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

from gateway import decimals
from gateway.errors import (
    BadDigest,
    EntityTooLarge,
    IncompleteBody,
    InvalidArgument,
    InvalidDigest,
    InvalidRequest,
    MissingContentLength,
    NotImplementedError_,
    S3Error,
    XAmzContentSHA256Mismatch,
)
from gateway.s3.aws_chunked import STREAMING_UNSIGNED_TRAILER, AwsChunkedDecoder
from gateway.s3.checksums import Checksummer, Declared, declared
from gateway.s3.http import Receive
from gateway.s3.sigv4 import UNSIGNED_PAYLOAD, AuthResult
from gateway.s3.sigv4_chunked import STREAMING_PAYLOAD, STREAMING_PAYLOAD_TRAILER

PIECE = 1 << 20  # decoded bytes per yielded piece (at most twice this)
_MODES = frozenset({STREAMING_PAYLOAD, STREAMING_PAYLOAD_TRAILER, STREAMING_UNSIGNED_TRAILER})
_TRAILER_MODES = frozenset({STREAMING_PAYLOAD_TRAILER, STREAMING_UNSIGNED_TRAILER})
_SIGV4A = "STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD"
_SHORT = "You did not provide the number of bytes specified by the Content-Length HTTP header"
# What drain() reads at most before giving up: enough for small bodies so the client reads
# our answer instead of a reset; a big upload is cut off by the server closing instead.
_DRAIN_BYTES = 1 << 20
_DRAIN_SECONDS = 2.0


@dataclass(frozen=True, slots=True)
class _Plan:
    """What the headers say about the body, validated before a byte of it is read."""

    size: int | None  # decoded length; None for HTTP chunked framing with no length given
    mode: str | None  # the aws-chunked mode, None for a plain body
    sha256: str | None  # x-amz-content-sha256 to check the body against
    md5: bytes | None  # Content-MD5
    checksum: Declared


class RequestBody:
    """The decoded, verified bytes of a request body, as an async iterator of pieces.

    The last piece is held back until every check over the whole body has passed, so a
    consumer streaming to an origin never delivers a complete body S3 would refuse. (Data
    of a signed chunk flows before the chunk's signature is checked: a chunk may be GiBs.)

    Header problems raise from `size` (and from iterating) before anything is received:
    with `Expect: 100-continue`, the server sends the 100 on the first receive(), so such an
    error (or an auth failure) is answered before the client sends its body.

    Errors are S3's, as recorded by OpenStack Swift's s3api input-error tests (run against
    AWS): e.g. aws-chunked decoding is chosen by x-amz-content-sha256, not Content-Encoding,
    and only for header-signed SigV4 requests.

    `md5=True` computes `md5_hex` even without Content-MD5 (for an ETag).
    """

    def __init__(
        self,
        receive: Receive,
        headers: Mapping[str, str],
        auth: AuthResult | None,
        *,
        max_size: int,
        md5: bool = False,
    ) -> None:
        self._receive = receive
        self._headers = headers
        self._auth = auth
        self._max_size = max_size
        self._want_md5 = md5
        self._plan: _Plan | None = None
        self._iterated = False
        self._touched = False  # receive() was called: the 100 Continue is out
        self._ended = False  # the last message (or a disconnect) was received
        self._checksums: dict[str, str] | None = None
        self.md5_hex: str | None = None  # set once the whole body is verified

    @property
    def size(self) -> int | None:
        """The decoded length: x-amz-decoded-content-length for aws-chunked, else
        Content-Length; None for a plain body sent with Transfer-Encoding: chunked and no
        length, whose end only its framing tells (`read_unsized` reads it)."""
        return self._prepare().size

    async def read_unsized(self, limit: int) -> bytes:
        """The whole verified body of unknown length, read into memory: at most `limit`
        bytes, else MissingContentLength (a store write needs the length before its first
        byte, and past `limit` the gateway will not hold a body to learn it)."""
        data = bytearray()
        async for piece in self:
            data += piece
            if len(data) > limit:
                raise MissingContentLength(
                    f"A body sent without a Content-Length may be at most {limit} bytes;"
                    " send its length (Content-Length, or x-amz-decoded-content-length with"
                    " aws-chunked) for a larger one."
                )
        return bytes(data)

    @property
    def checksums(self) -> dict[str, str]:
        """Algorithm name -> base64 of the full-object checksum the client declared.

        A header's value is known at once (the body fails before its last byte if it does
        not match); a trailer's once the body has been read. Empty when none was declared.
        """
        if self._checksums is not None:
            return dict(self._checksums)
        declared_ = self._prepare().checksum
        if declared_.algorithm is None or declared_.expected is None:
            return {}
        return {declared_.algorithm.name: base64.b64encode(declared_.expected).decode()}

    def __aiter__(self) -> AsyncIterator[bytes]:
        if self._iterated:
            raise RuntimeError("a request body can be read only once")
        self._iterated = True
        return self._verified_pieces(self._prepare())

    async def drain(
        self, max_bytes: int = _DRAIN_BYTES, max_seconds: float = _DRAIN_SECONDS
    ) -> None:
        """Read and discard what is left, within bounds, before an early error answer."""
        if self._ended:
            return
        if not self._touched and "100-continue" in self._headers.get("expect", "").lower():
            return  # the client waits for a 100 it will never get: nothing to read
        self._touched = True
        read = 0
        try:
            async with asyncio.timeout(max_seconds):
                while not self._ended and read < max_bytes:
                    message = await self._receive()
                    if message["type"] != "http.request":
                        self._ended = True
                        break
                    read += len(message.get("body", b""))
                    self._ended = not message.get("more_body", False)
        except TimeoutError:
            pass

    # -- headers ---------------------------------------------------------------------------

    def _prepare(self) -> _Plan:
        if self._plan is None:
            self._plan = self._validate()
        return self._plan

    def _validate(self) -> _Plan:
        claim = self._payload_claim()
        if claim.startswith(_SIGV4A):
            raise NotImplementedError_(
                "SigV4a streaming payloads (STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD) are not"
                " implemented."
            )
        size = self._declared_size(streaming=claim.startswith("STREAMING-"))
        if size is not None and size > self._max_size:
            raise EntityTooLarge(ProposedSize=str(size), MaxSizeAllowed=str(self._max_size))
        md5 = self._content_md5()
        # S3 decodes aws-chunked only for header-signed SigV4; elsewhere a STREAMING-* value
        # is just a hash that cannot match (XAmzContentSHA256Mismatch, as S3 answers).
        auth = self._auth
        header_signed = auth is not None and bool(auth.signing_key) and not auth.presigned
        mode = claim if header_signed and claim.startswith("STREAMING-") else None
        if mode is not None and mode not in _MODES:
            raise InvalidArgument(
                "Unsupported x-amz-content-sha256", ArgumentName="x-amz-content-sha256"
            )
        checksum = declared(self._headers, trailer_allowed=mode in _TRAILER_MODES)
        sha256 = None if mode is not None or claim in ("", UNSIGNED_PAYLOAD) else claim
        return _Plan(size, mode, sha256, md5, checksum)

    def _payload_claim(self) -> str:
        """x-amz-content-sha256 as the client means it."""
        auth = self._auth
        if auth is not None and auth.signing_key and not auth.presigned:
            return auth.payload_hash
        # SigV2 and presigned URLs bind no header, yet S3 still checks one that is sent.
        header = self._headers.get("x-amz-content-sha256")
        if header is not None:
            return header
        return auth.payload_hash if auth is not None else ""

    def _declared_size(self, *, streaming: bool) -> int | None:
        if streaming:
            # S3 answers 411 for a missing or malformed decoded length too.
            size = _length(self._headers.get("x-amz-decoded-content-length"))
            if size is None:
                raise MissingContentLength()
            return size
        raw = self._headers.get("content-length")
        if raw is None:
            if "chunked" in self._headers.get("transfer-encoding", "").lower():
                return None  # HTTP's framing ends it; boto3 sends this when asked to
            raise MissingContentLength()
        size = _length(raw)
        if size is None:
            raise InvalidArgument(
                "Content-Length is not a valid length.",
                ArgumentName="Content-Length",
                ArgumentValue=raw,
            )
        return size

    def _content_md5(self) -> bytes | None:
        raw = self._headers.get("content-md5")
        if raw is None:
            return None
        try:
            digest = base64.b64decode(raw.strip(), validate=True)
        except (binascii.Error, ValueError):
            digest = b""
        if len(digest) != 16:
            raise InvalidDigest(
                "The Content-MD5 you specified was invalid.", **{"Content-MD5": raw}
            )
        return digest

    # -- body ------------------------------------------------------------------------------

    async def _verified_pieces(self, plan: _Plan) -> AsyncIterator[bytes]:
        sha256 = hashlib.sha256() if plan.sha256 is not None else None
        md5 = hashlib.md5() if plan.md5 is not None or self._want_md5 else None
        summer = Checksummer(plan.checksum.algorithm) if plan.checksum.algorithm else None
        # Only the digests this request needs: each costs a pass over every byte.
        updates: list[Callable[[memoryview], None]] = [
            h.update for h in (sha256, md5) if h is not None
        ]
        if summer is not None:
            updates.append(summer.update)
        decoder = None
        if plan.mode is not None:
            assert plan.size is not None  # aws-chunked always declares its decoded length
            decoder = AwsChunkedDecoder(plan.size, plan.mode, self._auth, plan.checksum.trailer)
        held: bytes | None = None
        async for piece in self._pieces(plan, decoder, updates):
            if held is not None:
                yield held
            held = piece
        self._verify(plan, sha256, md5, summer, decoder)
        if held is not None:
            yield held

    async def _pieces(
        self,
        plan: _Plan,
        decoder: AwsChunkedDecoder | None,
        updates: list[Callable[[memoryview], None]],
    ) -> AsyncIterator[bytes]:
        """Decoded bytes, hashed, coalesced into pieces of PIECE to 2 * PIECE bytes."""
        parts: list[memoryview] = []
        pending = 0
        async for body in self._messages(None if decoder else plan.size):
            for data in decoder.feed(body) if decoder else (memoryview(body),):
                for start in range(0, len(data), PIECE):
                    part = data[start : start + PIECE]
                    for update in updates:
                        update(part)
                    parts.append(part)
                    pending += len(part)
                    if pending >= PIECE:
                        yield b"".join(parts)
                        parts.clear()
                        pending = 0
        if decoder is not None:
            decoder.end()
        if parts:
            yield b"".join(parts)

    async def _messages(self, plain_size: int | None) -> AsyncIterator[bytes]:
        """Raw body bytes as received; `plain_size` is checked when the body is not framed."""
        received = 0
        self._touched = True
        while not self._ended:
            message = await self._receive()
            if message["type"] != "http.request":  # http.disconnect: the client went away
                self._ended = True
                break
            body = message.get("body", b"")
            self._ended = not message.get("more_body", False)
            if body:
                received += len(body)
                if plain_size is not None and received > plain_size:
                    raise _short(plain_size, received)
                yield body
        if plain_size is None:
            return  # aws-chunked framing knows when it is complete
        if received != plain_size:
            raise _short(plain_size, received)

    def _verify(
        self,
        plan: _Plan,
        sha256: hashlib._Hash | None,
        md5: hashlib._Hash | None,
        summer: Checksummer | None,
        decoder: AwsChunkedDecoder | None,
    ) -> None:
        """The whole-body checks, in the order S3 reports them (x-amz-content-sha256 first)."""
        if sha256 is not None and plan.sha256 is not None:
            computed = sha256.hexdigest()
            if plan.sha256.lower() != computed:
                raise XAmzContentSHA256Mismatch(
                    ClientComputedContentSHA256=plan.sha256, S3ComputedContentSHA256=computed
                )
        if md5 is not None:
            digest = md5.digest()
            if plan.md5 is not None and digest != plan.md5:
                raise BadDigest(
                    "The Content-MD5 you specified did not match what we received.",
                    ExpectedDigest=plan.md5.hex(),
                    CalculatedDigest=base64.b64encode(digest).decode(),
                )
            self.md5_hex = digest.hex()
        self._checksums = {}
        if summer is None:
            return
        algorithm = summer.algorithm
        expected = plan.checksum.expected
        if expected is None:  # declared as a trailer, which the decoder made sure came
            assert decoder is not None and decoder.trailer_value is not None
            expected = algorithm.decode(decoder.trailer_value)
            if expected is None:
                raise InvalidRequest(f"Value for {algorithm.header} trailing header is invalid.")
        if summer.digest() != expected:
            raise BadDigest(
                f"The {algorithm.title} you specified did not match the calculated checksum."
            )
        self._checksums = {algorithm.name: base64.b64encode(expected).decode()}


def _length(raw: str | None) -> int | None:
    """A decimal length; None unless plain ASCII digits (int() would take ' +1_0 ')."""
    return None if raw is None else decimals.parse(raw.strip(), decimals.INT64_MAX)


def _short(expected: int, provided: int) -> S3Error:
    return IncompleteBody(
        _SHORT, NumberBytesExpected=str(expected), NumberBytesProvided=str(provided)
    )
