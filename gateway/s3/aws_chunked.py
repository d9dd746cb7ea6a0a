"""An incremental decoder of aws-chunked bodies (the STREAMING-* payload modes of SigV4), with
the error codes S3 answers for each fault (IncompleteBody for broken framing)."""

from __future__ import annotations

import hashlib
import hmac

from gateway.errors import (
    IncompleteBody,
    InvalidChunkSizeError,
    MalformedTrailerError,
    S3Error,
    SignatureDoesNotMatch,
)
from gateway.s3.sigv4 import AuthResult
from gateway.s3.sigv4_chunked import (
    STREAMING_PAYLOAD,
    STREAMING_PAYLOAD_TRAILER,
    canonical_trailer,
    chunk_signature,
    chunk_string_to_sign,
    verify_trailer_signature,
)

STREAMING_UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
TRAILER_SIGNATURE = "x-amz-trailer-signature"
MAX_LINE = 4096  # a chunk header or trailer line, CRLF included
MAX_TRAILER = 16384  # the whole trailer section
# S3 ignores bytes after the final empty line; a Content-Length bounds them, but a
# Transfer-Encoding: chunked body does not, so cap them.
MAX_AFTER_END = 65536
MIN_SIGNED_CHUNK = 8192  # every signed chunk but the last (S3: InvalidChunkSizeError)

_SIZE, _DATA, _DATA_END, _TRAILER, _DONE = range(5)
_HEX = frozenset("0123456789abcdefABCDEF")
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_TERMINATED = "The request body terminated unexpectedly"
_SHORT = "You did not provide the number of bytes specified by the Content-Length HTTP header"


def _terminated() -> S3Error:
    return IncompleteBody(_TERMINATED)


class AwsChunkedDecoder:
    """Decodes one aws-chunked body; `feed` each raw slice, then `end` at the end of input.

    Framing: `hex-size[;chunk-signature=sig]\\r\\n data \\r\\n` ... `0[;chunk-signature=sig]\\r\\n`,
    then trailer lines `name:value\\r\\n` and an empty line. Slices may end anywhere (ASGI
    message boundaries fall mid-header); `feed` returns views of the data they carry.

    `decoded_length` is x-amz-decoded-content-length; `trailer` the checksum trailer the
    request declared in x-amz-trailer (its value lands in `trailer_value`).
    """

    def __init__(
        self, decoded_length: int, mode: str, auth: AuthResult | None, trailer: str | None
    ) -> None:
        self._expected = decoded_length
        self._signed = mode in (STREAMING_PAYLOAD, STREAMING_PAYLOAD_TRAILER)
        self._signed_trailer = mode == STREAMING_PAYLOAD_TRAILER
        if self._signed and (auth is None or not auth.signing_key):
            raise ValueError("signed aws-chunked bodies need the request's SigV4 result")
        self._auth = auth
        self._previous = auth.signature if auth is not None else ""
        self._trailer = trailer
        self._state = _SIZE
        self._line = bytearray()  # a partial header/trailer line or chunk-ending CRLF
        self._remaining = 0  # data bytes left in the current chunk
        self._total = 0  # decoded bytes announced by chunk headers so far
        self._chunks = 0
        self._last_size = -1
        self._claimed = ""  # the current chunk's signature
        self._chunk_hash = hashlib.sha256()
        self._trailer_bytes = 0
        self._after_end = 0
        self.trailers: list[tuple[str, str]] = []  # as sent, names lower-cased
        self.trailer_value: str | None = None

    def feed(self, data: bytes) -> list[memoryview]:
        """Decoded data in `data` (views of it), after checking what framing it completes."""
        out: list[memoryview] = []
        view = memoryview(data)
        pos, end = 0, len(data)
        while pos < end:
            state = self._state
            if state == _DATA:
                take = min(self._remaining, end - pos)
                piece = view[pos : pos + take]
                if self._signed:
                    self._chunk_hash.update(piece)
                out.append(piece)
                pos += take
                self._remaining -= take
                if not self._remaining:
                    self._state = _DATA_END
            elif state == _DATA_END:
                take = min(2 - len(self._line), end - pos)
                self._line += view[pos : pos + take]
                pos += take
                if len(self._line) == 2:
                    self._chunk_end()
            elif state == _DONE:
                self._after_end += end - pos
                if self._after_end > MAX_AFTER_END:
                    raise IncompleteBody("The request body went on past its aws-chunked end.")
                pos = end
            else:
                limit = min(end, pos + MAX_LINE - len(self._line))
                newline = data.find(b"\n", pos, limit)
                stop = limit if newline < 0 else newline + 1
                self._line += view[pos:stop]
                pos = stop
                if newline >= 0:
                    line = bytes(self._line)
                    self._line.clear()
                    self._on_line(line)
                elif len(self._line) >= MAX_LINE:
                    raise _terminated()
        return out

    def end(self) -> None:
        """The raw body is over: fail unless the framing is complete."""
        if self._state == _TRAILER and not self._line:
            # S3 accepts a body that stops right after its last trailer line.
            self._finish_trailers()
        elif self._state != _DONE:
            raise _terminated()

    # -- framing ---------------------------------------------------------------------------

    def _on_line(self, line: bytes) -> None:
        if not line.endswith(b"\r\n"):  # a bare LF: S3 refuses it
            raise _terminated()
        text = line[:-2].decode("latin-1")
        if self._state == _SIZE:
            self._chunk_header(text)
        else:
            self._trailer_line(text)

    def _chunk_header(self, text: str) -> None:
        size_text, sep, extension = text.partition(";")
        size_text = size_text.strip()  # S3 accepts `400 ;chunk-signature = sig `
        if not (0 < len(size_text) <= 16 and _HEX.issuperset(size_text)):
            raise _terminated()
        size = int(size_text, 16)
        self._chunks += 1
        if self._signed:
            key, _, signature = extension.partition("=")
            signature = signature.strip()
            if not sep or key.strip() != "chunk-signature" or not signature or ";" in signature:
                raise _terminated()
            self._claimed = signature
            if size and 0 <= self._last_size < MIN_SIGNED_CHUNK:
                # S3 notices at the next chunk and names that one: so do we.
                raise InvalidChunkSizeError(
                    Chunk=str(self._chunks), BadChunkSize=str(self._last_size)
                )
        self._last_size = size
        if self._total + size > self._expected or (size == 0 and self._total != self._expected):
            raise IncompleteBody(
                _SHORT,
                NumberBytesExpected=str(self._expected),
                NumberBytesProvided=str(self._total + size),
            )
        if size == 0:
            if self._signed:
                self._check_signature(_EMPTY_SHA256)
            self._state = _TRAILER
            return
        self._total += size
        self._remaining = size
        self._state = _DATA

    def _chunk_end(self) -> None:
        if self._line != b"\r\n":
            raise _terminated()
        self._line.clear()
        if self._signed:
            self._check_signature(self._chunk_hash.hexdigest())
            self._chunk_hash = hashlib.sha256()
        self._state = _SIZE

    def _check_signature(self, chunk_sha256_hex: str) -> None:
        assert self._auth is not None
        claimed = self._claimed
        expected = chunk_signature(self._auth, self._previous, chunk_sha256_hex)
        if not (claimed.isascii() and hmac.compare_digest(expected, claimed)):
            raise SignatureDoesNotMatch(
                AWSAccessKeyId=self._auth.access_key,
                StringToSign=chunk_string_to_sign(self._auth, self._previous, chunk_sha256_hex),
                SignatureProvided=claimed,
            )
        self._previous = claimed  # the chain goes on from the chunk's signature

    # -- trailers --------------------------------------------------------------------------

    def _trailer_line(self, text: str) -> None:
        self._trailer_bytes += len(text) + 2
        if self._trailer_bytes > MAX_TRAILER:
            raise MalformedTrailerError()
        if not text:
            self._finish_trailers()
            self._state = _DONE
            return
        name, sep, value = text.partition(":")
        if not sep:
            raise MalformedTrailerError()
        self.trailers.append((name.strip().lower(), value.strip()))

    def _finish_trailers(self) -> None:
        signature: str | None = None
        for name, value in self.trailers:
            if name == TRAILER_SIGNATURE and self._signed_trailer:
                signature = value
            elif name == self._trailer:
                self.trailer_value = value  # S3 takes the last of repeated trailers
            else:
                raise MalformedTrailerError()  # a trailer x-amz-trailer did not announce
        if self._signed_trailer:
            if signature is None:
                raise _terminated()
            assert self._auth is not None
            # An empty trailer section is signed as a lone newline (as S3 expects).
            canonical = canonical_trailer(self.trailers) or b"\n"
            verify_trailer_signature(self._auth, self._previous, canonical, signature)
        if self._trailer is not None and self.trailer_value is None:
            raise MalformedTrailerError()
