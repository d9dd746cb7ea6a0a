"""Chunk and trailer signatures of aws-chunked uploads (STREAMING-AWS4-HMAC-SHA256-PAYLOAD*).

Each chunk's signature chains from the previous one, starting at the request's seed signature
(`AuthResult.signature`); the trailer signature chains from the final, empty chunk's.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from gateway.errors import SignatureDoesNotMatch
from gateway.s3.sigv4 import AuthResult

STREAMING_PAYLOAD = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
STREAMING_PAYLOAD_TRAILER = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def chunk_string_to_sign(auth: AuthResult, previous_signature: str, chunk_sha256_hex: str) -> str:
    return (
        f"AWS4-HMAC-SHA256-PAYLOAD\n{auth.amz_date}\n{auth.scope}\n{previous_signature}\n"
        f"{_EMPTY_SHA256}\n{chunk_sha256_hex}"
    )


def chunk_signature(auth: AuthResult, previous_signature: str, chunk_sha256_hex: str) -> str:
    """The signature a chunk with this SHA-256 must carry; for callers that hash incrementally."""
    string_to_sign = chunk_string_to_sign(auth, previous_signature, chunk_sha256_hex)
    return _sign(auth, string_to_sign)


def verify_chunk_signature(
    auth: AuthResult, previous_signature: str, chunk_data: bytes | memoryview, claimed: str
) -> None:
    """Raise SignatureDoesNotMatch unless `claimed` signs `chunk_data` after `previous_signature`.

    On success `claimed` is the previous signature of the next chunk.
    """
    digest = hashlib.sha256(chunk_data).hexdigest()
    _compare(chunk_signature(auth, previous_signature, digest), claimed)


def canonical_trailer(trailers: Iterable[tuple[str, str]]) -> bytes:
    """Trailer headers as signed: `name:value\\n` each, names lower-cased, in the order sent."""
    return "".join(
        f"{name.strip().lower()}:{value.strip()}\n"
        for name, value in trailers
        if name.strip().lower() != "x-amz-trailer-signature"
    ).encode()


def trailer_string_to_sign(
    auth: AuthResult, previous_signature: str, trailer_sha256_hex: str
) -> str:
    return (
        f"AWS4-HMAC-SHA256-TRAILER\n{auth.amz_date}\n{auth.scope}\n{previous_signature}\n"
        f"{trailer_sha256_hex}"
    )


def verify_trailer_signature(
    auth: AuthResult, previous_signature: str, trailer: bytes, claimed: str
) -> None:
    """Check `x-amz-trailer-signature`; `trailer` is `canonical_trailer(...)` of what was sent
    and `previous_signature` the final (zero-length) chunk's signature."""
    string_to_sign = trailer_string_to_sign(
        auth, previous_signature, hashlib.sha256(trailer).hexdigest()
    )
    _compare(_sign(auth, string_to_sign), claimed)


def _sign(auth: AuthResult, string_to_sign: str) -> str:
    return hmac.new(auth.signing_key, string_to_sign.encode(), hashlib.sha256).hexdigest()


def _compare(expected: str, claimed: str) -> None:
    if not (claimed.isascii() and hmac.compare_digest(expected, claimed)):
        raise SignatureDoesNotMatch(SignatureProvided=claimed)
