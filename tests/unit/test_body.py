"""Request bodies: decoding and verification of what S3 clients send, fed through the ASGI
receive() contract itself (scripted messages, split anywhere).

Bodies come from botocore where it can build them (plain PUTs over HTTP, aws-chunked with an
unsigned trailer over HTTPS) and from AWS's published STREAMING-AWS4-HMAC-SHA256-PAYLOAD
example for signed chunks.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import os
import zlib
from collections.abc import Iterable
from itertools import pairwise
from typing import Any
from urllib.parse import urlsplit

import boto3
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSPreparedRequest, AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

from gateway import errors
from gateway.s3.body import PIECE, RequestBody
from gateway.s3.checksums import ALGORITHMS, Checksummer
from gateway.s3.http import Message
from gateway.s3.sigv4 import AuthResult, SigV4Verifier
from gateway.s3.sigv4_chunked import chunk_signature, trailer_string_to_sign
from tests.unit.test_sigv4 import (
    _CHUNKS,
    ACCESS_KEY,
    AWS_EXAMPLE_TIME,
    AWS_EXAMPLES,
    SECRET,
    verifier,
    verify,
)

pytestmark = pytest.mark.anyio

SIGNED = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
SIGNED_TRAILER = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
GiB = 1 << 30


class Script:
    """receive() playing `parts` as http.request messages, then the end (or a disconnect)."""

    def __init__(self, parts: Iterable[bytes], *, disconnect: bool = False) -> None:
        self.messages: list[Message] = [
            {"type": "http.request", "body": p, "more_body": True} for p in parts
        ]
        if disconnect:
            self.messages.append({"type": "http.disconnect"})
        elif self.messages:
            self.messages[-1]["more_body"] = False
        else:
            self.messages.append({"type": "http.request", "body": b"", "more_body": False})
        self.calls = 0

    async def __call__(self) -> Message:
        self.calls += 1
        if self.calls > len(self.messages):
            return {"type": "http.disconnect"}  # what uvicorn answers after the end
        return self.messages[self.calls - 1]


def sized(raw: bytes, size: int = 65536) -> list[bytes]:
    return [raw[i : i + size] for i in range(0, len(raw), size)] or [b""]


def cut(raw: bytes, *at: int) -> list[bytes]:
    edges = [0, *at, len(raw)]
    return [raw[a:b] for a, b in pairwise(edges)]


def body_of(
    parts: Iterable[bytes],
    headers: dict[str, str],
    auth: AuthResult | None,
    *,
    max_size: int = 5 * GiB,
    disconnect: bool = False,
    md5: bool = False,
) -> tuple[RequestBody, Script]:
    script = Script(parts, disconnect=disconnect)
    return RequestBody(script, headers, auth, max_size=max_size, md5=md5), script


async def read_all(body: RequestBody) -> tuple[bytes, list[int]]:
    pieces = [piece async for piece in body]
    return b"".join(pieces), [len(p) for p in pieces]


async def read_until_error(body: RequestBody) -> tuple[int, errors.S3Error]:
    """How many bytes a consumer saw before the body failed, and the error."""
    seen = 0
    with pytest.raises(errors.S3Error) as failure:
        async for piece in body:
            seen += len(piece)
    return seen, failure.value


def b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


def crc32_b64(data: bytes) -> str:
    return b64(zlib.crc32(data).to_bytes(4, "big"))


# -- what clients send --------------------------------------------------------------------


class _Sent(Exception):
    def __init__(self, request: AWSPreparedRequest) -> None:
        super().__init__("captured")
        self.request = request


def botocore_put(
    scheme: str, data: bytes, **params: Any
) -> tuple[dict[str, str], bytes, AuthResult]:
    """Headers, raw body and verified auth of the PutObject botocore would send."""
    client = boto3.client(
        "s3",
        endpoint_url=f"{scheme}://127.0.0.1:9000",
        region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET,
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )

    def stop(request: AWSPreparedRequest, **_: Any) -> None:
        raise _Sent(request)

    client.meta.events.register("before-send.s3", stop)
    with pytest.raises(_Sent) as sent:
        client.put_object(Bucket="b", Key="k", Body=data, **params)
    request = sent.value.request
    raw = request.body.read() if hasattr(request.body, "read") else request.body or b""
    headers = {
        k.lower(): v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()
    }
    parts = urlsplit(request.url)
    headers.setdefault("host", parts.netloc)
    auth = SigV4Verifier({ACCESS_KEY: SECRET}.get).verify(
        request.method, parts.path, parts.query, headers
    )
    assert auth is not None
    return headers, bytes(raw), auth


@pytest.fixture(scope="module")
def example_auth() -> AuthResult:
    """The seed of AWS's STREAMING-AWS4-HMAC-SHA256-PAYLOAD example, verified."""
    result = verify(AWS_EXAMPLES["streaming-seed"], verifier(clock=lambda: AWS_EXAMPLE_TIME))
    assert result is not None
    return result


def signed_body(
    auth: AuthResult, chunks: list[bytes], trailers: list[tuple[str, str]] | None = None
) -> bytes:
    """aws-chunked framing with chained chunk signatures (and a signed trailer section)."""
    out, previous = [], auth.signature
    for data in [*chunks, b""]:
        signature = chunk_signature(auth, previous, hashlib.sha256(data).hexdigest())
        out.append(b"%x;chunk-signature=%s\r\n%s" % (len(data), signature.encode(), data))
        if data or trailers is None:
            out.append(b"\r\n")
        previous = signature
    if trailers is not None:
        section = "".join(f"{n}:{v}\n" for n, v in trailers).encode() or b"\n"
        string_to_sign = trailer_string_to_sign(auth, previous, hashlib.sha256(section).hexdigest())
        # botocore derives the key from the secret by itself: an oracle independent of ours.
        request = AWSRequest(method="PUT", url="http://s3.amazonaws.com/")
        request.context["timestamp"] = auth.amz_date
        signer = S3SigV4Auth(Credentials(ACCESS_KEY, SECRET), "s3", "us-east-1")
        trailer_signature = signer.signature(string_to_sign, request)
        out += [f"{n}:{v}\r\n".encode() for n, v in trailers]
        out.append(f"x-amz-trailer-signature:{trailer_signature}\r\n\r\n".encode())
    return b"".join(out)


def streaming(auth: AuthResult, mode: str, size: int, **extra: str) -> tuple[dict, AuthResult]:
    headers = {
        "x-amz-content-sha256": mode,
        "content-encoding": "aws-chunked",
        "x-amz-decoded-content-length": str(size),
        **{k.replace("_", "-"): v for k, v in extra.items()},
    }
    return headers, dataclasses.replace(auth, payload_hash=mode)


def unsigned_trailer_body(chunks: list[bytes], trailer: str = "") -> bytes:
    framed = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks)
    return framed + b"0\r\n" + trailer.encode() + b"\r\n"


# -- round trips ---------------------------------------------------------------------------


async def test_plain_put_from_botocore_over_http_round_trips_with_its_checksum() -> None:
    data = os.urandom(3 * PIECE + 12345)
    headers, raw, auth = botocore_put("http", data)
    assert (
        auth.payload_hash == hashlib.sha256(data).hexdigest() and "x-amz-checksum-crc32" in headers
    )
    body, _ = body_of(sized(raw), headers, auth)
    got, sizes = await read_all(body)
    assert got == data and body.size == len(data)
    assert max(sizes) <= 2 * PIECE
    assert body.checksums == {"crc32": crc32_b64(data)}


@pytest.mark.parametrize("algorithm", ["CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256"])
async def test_aws_chunked_put_from_botocore_over_https_round_trips(algorithm: str) -> None:
    data = os.urandom(2 * PIECE + 777)  # botocore frames 1 MiB chunks: three of them
    headers, raw, auth = botocore_put("https", data, ChecksumAlgorithm=algorithm)
    assert auth.payload_hash == UNSIGNED_TRAILER and "content-length" not in headers
    name = algorithm.lower()
    trailer_value = raw.rsplit(f"x-amz-checksum-{name}:".encode(), 1)[1].split(b"\r\n")[0]
    body, _ = body_of(sized(raw, 50000), headers, auth)
    got, _ = await read_all(body)
    assert got == data
    assert body.checksums == {name: trailer_value.decode()}


async def test_aws_documentation_streaming_example_decodes(example_auth: AuthResult) -> None:
    raw = b"".join(b"%x;chunk-signature=%s\r\n%s\r\n" % (len(d), s.encode(), d) for d, s in _CHUNKS)
    headers = dict(AWS_EXAMPLES["streaming-seed"].headers)
    assert len(raw) == int(headers["content-length"])  # the framing AWS documents
    body, _ = body_of(sized(raw, 4000), headers, example_auth)
    got, _ = await read_all(body)
    assert got == b"a" * 66560 and body.checksums == {}


@pytest.mark.parametrize("mode", [SIGNED, SIGNED_TRAILER, UNSIGNED_TRAILER])
async def test_aws_chunked_split_at_every_framing_position(
    example_auth: AuthResult, mode: str
) -> None:
    chunks = [os.urandom(8192), os.urandom(9000), os.urandom(100)]
    data = b"".join(chunks)
    checksum = ("x-amz-checksum-crc32", crc32_b64(data))
    headers, auth = streaming(example_auth, mode, len(data), x_amz_trailer=checksum[0])
    if mode == UNSIGNED_TRAILER:
        raw = unsigned_trailer_body(chunks, f"{checksum[0]}:{checksum[1]}\r\n")
    else:
        raw = signed_body(auth, chunks, [checksum] if mode == SIGNED_TRAILER else None)
        if mode == SIGNED:
            del headers["x-amz-trailer"]
    # Every byte that is not data, and its neighbours, as a message boundary.
    starts = [raw.index(c[:16]) for c in chunks]
    data_bytes = {s + i for s, c in zip(starts, chunks, strict=True) for i in range(2, len(c) - 1)}
    positions = [p for p in range(1, len(raw)) if p not in data_bytes]
    for at in [*positions, starts[1] + 4567]:
        body, _ = body_of(cut(raw, at), headers, auth)
        assert (await read_all(body))[0] == data, at
    body, _ = body_of(sized(raw, 1), headers, auth)  # every position at once
    assert (await read_all(body))[0] == data
    if mode != SIGNED:
        assert body.checksums == {"crc32": checksum[1]}


async def test_plain_body_split_into_one_byte_messages_round_trips() -> None:
    data = os.urandom(5000)
    headers = {"content-length": "5000", "x-amz-content-sha256": hashlib.sha256(data).hexdigest()}
    body, _ = body_of(sized(data, 1), headers, None)
    assert (await read_all(body))[0] == data


async def test_zero_length_objects_in_every_encoding(example_auth: AuthResult) -> None:
    headers, raw, auth = botocore_put("http", b"")
    body, _ = body_of([raw], headers, auth)
    assert await read_all(body) == (b"", [])
    headers, raw, auth = botocore_put("https", b"")
    assert raw.startswith(b"0\r\n")
    body, _ = body_of([raw], headers, auth)
    assert await read_all(body) == (b"", []) and body.checksums == {"crc32": crc32_b64(b"")}
    headers, auth = streaming(example_auth, SIGNED, 0)
    body, _ = body_of([signed_body(auth, [])], headers, auth)
    assert await read_all(body) == (b"", [])


async def test_one_huge_message_is_still_yielded_in_bounded_pieces() -> None:
    data = os.urandom(8 * PIECE + 1)
    body, _ = body_of([data], {"content-length": str(len(data))}, None, md5=True)
    got, sizes = await read_all(body)
    assert got == data and max(sizes) <= 2 * PIECE and len(sizes) >= 4
    assert body.md5_hex == hashlib.md5(data).hexdigest()


async def test_content_md5_that_matches_is_reported() -> None:
    data = b"hello md5"
    md5 = hashlib.md5(data).digest()
    body, _ = body_of([data], {"content-length": "9", "content-md5": b64(md5)}, None)
    assert (await read_all(body))[0] == data and body.md5_hex == md5.hex()


# -- failures: raised before the last piece, so no consumer ever gets a whole bad body ------


async def test_wrong_sha256_fails_after_streaming_but_before_the_last_piece() -> None:
    data = os.urandom(5 * PIECE)
    wrong = hashlib.sha256(b"other").hexdigest()
    body, _ = body_of(
        sized(data), {"content-length": str(len(data)), "x-amz-content-sha256": wrong}, None
    )
    seen, error = await read_until_error(body)
    assert isinstance(error, errors.XAmzContentSHA256Mismatch)
    assert 0 < seen < len(data)  # earlier pieces flowed; the last never did
    assert error.fields["S3ComputedContentSHA256"] == hashlib.sha256(data).hexdigest()


async def test_wrong_content_md5_is_bad_digest_and_malformed_one_invalid_digest() -> None:
    data = os.urandom(3 * PIECE)
    headers = {"content-length": str(len(data)), "content-md5": b64(hashlib.md5(b"x").digest())}
    body, _ = body_of(sized(data), headers, None)
    seen, error = await read_until_error(body)
    assert isinstance(error, errors.BadDigest) and seen < len(data)
    assert error.detail == "The Content-MD5 you specified did not match what we received."
    body, script = body_of([data], dict(headers, **{"content-md5": "bm90IG1kNQ=="}), None)
    with pytest.raises(errors.InvalidDigest):
        _ = body.size
    assert script.calls == 0  # refused before asking for (and 100-continuing) the body


async def test_wrong_checksum_header_is_bad_digest_with_s3s_message() -> None:
    data = os.urandom(PIECE + 5)
    headers, raw, auth = botocore_put("http", data, ChecksumAlgorithm="CRC32C")
    headers["x-amz-checksum-crc32c"] = b64(b"\0\0\0\0")
    body, _ = body_of(sized(raw), headers, auth)
    seen, error = await read_until_error(body)
    assert isinstance(error, errors.BadDigest) and seen < len(data)
    assert error.detail == "The CRC32C you specified did not match the calculated checksum."


async def test_wrong_trailer_checksum_is_bad_digest() -> None:
    data = os.urandom(3 * PIECE)
    headers, raw, auth = botocore_put("https", data, ChecksumAlgorithm="SHA256")
    good = b64(hashlib.sha256(data).digest()).encode()
    raw = raw.replace(good, b64(hashlib.sha256(b"x").digest()).encode())
    body, _ = body_of(sized(raw), headers, auth)
    seen, error = await read_until_error(body)
    assert isinstance(error, errors.BadDigest) and seen < len(data)
    assert error.detail == "The SHA256 you specified did not match the calculated checksum."


async def test_wrong_chunk_signature_is_signature_does_not_match(example_auth: AuthResult) -> None:
    chunks = [os.urandom(PIECE), os.urandom(PIECE), os.urandom(PIECE)]
    headers, auth = streaming(example_auth, SIGNED, 3 * PIECE)
    raw = signed_body(auth, chunks)
    third = raw.index(chunks[2][:32])
    tampered = raw[:third] + bytes([raw[third] ^ 1]) + raw[third + 1 :]
    body, _ = body_of(sized(tampered), headers, auth)
    seen, error = await read_until_error(body)
    assert isinstance(error, errors.SignatureDoesNotMatch) and error.status == 403
    assert seen < 3 * PIECE


async def test_signed_trailer_with_a_wrong_signature_is_refused(example_auth: AuthResult) -> None:
    data = os.urandom(9000)
    headers, auth = streaming(
        example_auth, SIGNED_TRAILER, len(data), x_amz_trailer="x-amz-checksum-crc32"
    )
    raw = signed_body(auth, [data], [("x-amz-checksum-crc32", crc32_b64(data))])
    signature_at = raw.index(b"x-amz-trailer-signature:") + 24
    tampered = raw[:signature_at] + b"0" * 64 + raw[signature_at + 64 :]
    body, _ = body_of([tampered], headers, auth)
    seen, error = await read_until_error(body)
    assert isinstance(error, errors.SignatureDoesNotMatch) and seen == 0


async def test_short_body_then_disconnect_is_incomplete_body() -> None:
    data = os.urandom(3 * PIECE)
    body, _ = body_of(sized(data[:-10]), {"content-length": str(len(data))}, None, disconnect=True)
    seen, error = await read_until_error(body)
    assert isinstance(error, errors.IncompleteBody) and seen < len(data)
    assert error.fields == {
        "NumberBytesExpected": str(len(data)),
        "NumberBytesProvided": str(len(data) - 10),
    }


async def test_aws_chunked_disconnect_mid_chunk_is_incomplete_body() -> None:
    data = os.urandom(3 * PIECE)
    headers, raw, auth = botocore_put("https", data)
    body, _ = body_of(sized(raw[: len(raw) // 2]), headers, auth, disconnect=True)
    seen, error = await read_until_error(body)
    assert isinstance(error, errors.IncompleteBody) and seen < len(data)


@pytest.mark.parametrize("declared", [99, 101])
async def test_chunk_sizes_that_do_not_sum_to_the_decoded_length_are_refused(declared: int) -> None:
    headers, raw, auth = botocore_put("https", os.urandom(100))
    headers["x-amz-decoded-content-length"] = str(declared)
    body, _ = body_of([raw], headers, auth)
    seen, error = await read_until_error(body)
    assert isinstance(error, errors.IncompleteBody) and seen == 0
    assert error.fields["NumberBytesExpected"] == str(declared)


@pytest.mark.parametrize(
    "raw",
    [
        b"zz\r\nhello\r\n0\r\n\r\n",  # not hex
        b"-5\r\nhello\r\n0\r\n\r\n",  # negative
        b"5\nhello\n0\n\n",  # bare LF
        b"5\r\nhelloXY0\r\n\r\n",  # data not followed by CRLF
        b"5" * 5000 + b"\r\n",  # a header line past 4 KiB
        b"5\r\nhello\r\n",  # no final chunk
    ],
)
async def test_malformed_chunk_framing_is_incomplete_body(raw: bytes) -> None:
    headers = {"x-amz-content-sha256": UNSIGNED_TRAILER, "x-amz-decoded-content-length": "5"}
    auth = AuthResult("AK", UNSIGNED_TRAILER, False, "s" * 64, "20130524T000000Z", "scope", b"k")
    body, _ = body_of(sized(raw, 7), headers, auth)
    seen, error = await read_until_error(body)
    assert isinstance(error, errors.IncompleteBody) and seen == 0


async def test_small_signed_chunks_before_the_last_are_refused(example_auth: AuthResult) -> None:
    chunks = [b"x" * 1024, b"y" * 4096, b"z" * 3072]
    headers, auth = streaming(example_auth, SIGNED, 8192)
    body, _ = body_of([signed_body(auth, chunks)], headers, auth)
    _, error = await read_until_error(body)
    assert isinstance(error, errors.InvalidChunkSizeError)
    assert error.fields == {"Chunk": "2", "BadChunkSize": "1024"}


@pytest.mark.parametrize(
    ("trailer", "declared", "error"),
    [
        ("", "x-amz-checksum-crc32", errors.MalformedTrailerError),  # announced, never sent
        (
            "x-amz-checksum-crc32c:AAAAAA==\r\n",
            "x-amz-checksum-crc32",
            errors.MalformedTrailerError,
        ),
        ("bonus:trailer\r\n", None, errors.MalformedTrailerError),  # not announced
        ("x-amz-checksum-crc32:not=base64\r\n", "x-amz-checksum-crc32", errors.InvalidRequest),
    ],
)
async def test_trailer_faults(trailer: str, declared: str | None, error: type) -> None:
    data = b"trailer test"
    raw = unsigned_trailer_body([data], trailer)
    headers = {"x-amz-content-sha256": UNSIGNED_TRAILER, "x-amz-decoded-content-length": "12"}
    if declared:
        headers["x-amz-trailer"] = declared
    auth = AuthResult("AK", UNSIGNED_TRAILER, False, "s" * 64, "20130524T000000Z", "scope", b"k")
    body, _ = body_of(sized(raw, 5), headers, auth)
    seen, got = await read_until_error(body)
    assert isinstance(got, error) and seen == 0


# -- a plain body in HTTP chunked framing, with no length ------------------------------------


async def test_chunked_body_without_a_length_is_read_to_learn_it() -> None:
    data = b"x" * 3000
    headers = {"transfer-encoding": "chunked"}
    body, _ = body_of(sized(data, 1000), headers, None)
    assert body.size is None
    assert await body.read_unsized(3000) == data
    body, _ = body_of(sized(data, 1000), headers, None)
    with pytest.raises(errors.MissingContentLength):
        await body.read_unsized(2999)


async def test_chunked_body_without_a_length_is_still_checked_against_its_hash() -> None:
    headers = {"transfer-encoding": "chunked", "x-amz-content-sha256": "0" * 64}
    body, _ = body_of(sized(b"bar"), headers, None)
    with pytest.raises(errors.XAmzContentSHA256Mismatch):
        await body.read_unsized(100)


# -- header checks, all before the body is read ---------------------------------------------


@pytest.mark.parametrize(
    ("headers", "error"),
    [
        ({}, errors.MissingContentLength),
        ({"content-length": "12a"}, errors.InvalidArgument),
        ({"content-length": "2000"}, errors.EntityTooLarge),
        (
            {"x-amz-content-sha256": UNSIGNED_TRAILER, "content-length": "10"},
            errors.MissingContentLength,
        ),
        (
            {"x-amz-content-sha256": "STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD"},
            errors.NotImplementedError_,
        ),
        (
            {"content-length": "1", "x-amz-checksum-crc32": "AAAAAA==", "x-amz-checksum-sha1": "x"},
            errors.InvalidRequest,
        ),
        ({"content-length": "1", "x-amz-checksum-crc32": "AAAA"}, errors.InvalidRequest),
        ({"content-length": "1", "x-amz-checksum-bogus": "AAAAAA=="}, errors.InvalidRequest),
        ({"content-length": "1", "x-amz-sdk-checksum-algorithm": "CRC32"}, errors.InvalidRequest),
        (
            {
                "content-length": "1",
                "x-amz-sdk-checksum-algorithm": "SHA1",
                "x-amz-checksum-crc32": "AAAAAA==",
            },
            errors.InvalidRequest,
        ),
        (
            {"content-length": "1", "x-amz-trailer": "x-amz-checksum-crc32"},
            errors.MalformedTrailerError,
        ),
        ({"content-length": "1", "x-amz-trailer": ", x-amz-checksum-crc32"}, errors.InvalidRequest),
    ],
)
async def test_header_faults_are_raised_before_receiving(headers: dict, error: type) -> None:
    body, script = body_of([b"x"], headers, None, max_size=1000)
    with pytest.raises(error):
        _ = body.size
    with pytest.raises(error):
        async for _ in body:
            pass
    assert script.calls == 0


async def test_streaming_claim_without_header_signing_is_a_sha256_mismatch() -> None:
    """S3 decodes aws-chunked only for header-signed SigV4 (SigV2 and presigned: raw)."""
    raw = unsigned_trailer_body([b"hello"])
    headers = {
        "x-amz-content-sha256": UNSIGNED_TRAILER,
        "x-amz-decoded-content-length": str(len(raw)),
        "content-length": str(len(raw)),
    }
    sigv2 = AuthResult("AK", "UNSIGNED-PAYLOAD", False, "sig", "", "", b"")
    body, _ = body_of([raw], headers, sigv2)
    _, error = await read_until_error(body)
    assert isinstance(error, errors.XAmzContentSHA256Mismatch)


# -- drain -----------------------------------------------------------------------------------


async def test_drain_reads_the_rest_but_never_invites_a_waiting_100_continue() -> None:
    body, script = body_of([b"a"] * 5, {"content-length": "5", "expect": "100-continue"}, None)
    await body.drain()
    assert script.calls == 0
    body, script = body_of([b"a"] * 5, {"content-length": "5"}, None)
    await body.drain()
    assert script.calls == 5
    body, script = body_of([b"a" * 1000] * 50, {"content-length": "50000"}, None)
    await body.drain(max_bytes=10_000)
    assert script.calls == 10


# -- checksums ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "data", "expected"),
    [
        ("crc32", b"123456789", "cbf43926"),  # the CRC catalogue's check values
        ("crc32c", b"123456789", "e3069283"),
        ("crc64nvme", b"123456789", "ae8b14860a799888"),
        ("xxhash64", b"", "ef46db3751d8e999"),  # xxHash's published empty-input digests
        ("xxhash3", b"", "2d06800538d394c2"),
        ("xxhash128", b"", "99aa06d3014798d86001c324468d497f"),
        ("sha256", b"abc", hashlib.sha256(b"abc").hexdigest()),
    ],
)
def test_checksummer_known_answers_across_updates(name: str, data: bytes, expected: str) -> None:
    summer = Checksummer(ALGORITHMS[name])
    for i in range(len(data)):
        summer.update(memoryview(data)[i : i + 1])
    assert summer.digest().hex() == expected
    assert summer.b64() == b64(bytes.fromhex(expected))
