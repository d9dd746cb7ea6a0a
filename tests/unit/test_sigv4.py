"""SigV4 verification against requests signed by botocore and AWS's published examples."""

from __future__ import annotations

import calendar
import hashlib
import time
from collections.abc import Callable, Iterator
from email.utils import formatdate, mktime_tz, parsedate_tz
from typing import Any, NamedTuple
from urllib.parse import unquote, urlsplit

import boto3
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSPreparedRequest, AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from hypothesis import given
from hypothesis import strategies as st

from gateway import errors
from gateway.s3 import sigv4
from gateway.s3.sigv4 import AuthResult, SigV4Verifier
from gateway.s3.sigv4_canonical import canonical_query, canonical_uri, presigned_query
from gateway.s3.sigv4_chunked import (
    canonical_trailer,
    chunk_string_to_sign,
    verify_chunk_signature,
    verify_trailer_signature,
)

ACCESS_KEY = "AKIAIOSFODNN7EXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
# 2013-05-24T00:00:00Z, the instant of every example in AWS's SigV4 documentation for S3.
AWS_EXAMPLE_TIME = 1369353600.0
AWS_EXAMPLE_HOST = "examplebucket.s3.amazonaws.com"

AWKWARD_KEYS = [
    "plain.txt",
    "with space.txt",
    "a+b+c",
    "ünïcødé/日本語.txt",
    "100%.txt",
    "k=v&x=y",
    "tilde~name",
    "bang!star*(paren)",
    "quote'dollar$comma,semi;colon:at@",
    "dir//double/./dot/../x",
]


class Wire(NamedTuple):
    """A request as the gateway's ASGI app would see it."""

    method: str
    raw_path: str
    query: str
    headers: dict[str, str]


class _Sent(Exception):
    def __init__(self, request: AWSPreparedRequest) -> None:
        super().__init__("captured")
        self.request = request


def _text(value: str | bytes) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


def wire_from_url(method: str, url: str, headers: dict[str, str] | None = None) -> Wire:
    parts = urlsplit(url)
    sent = {name.lower(): _text(value).strip() for name, value in (headers or {}).items()}
    sent.setdefault("host", parts.netloc)  # what urllib3 adds on the wire
    return Wire(method, parts.path, parts.query, sent)


def make_client(
    *, addressing: str = "path", secret: str = SECRET, signing: bool | None = None
) -> Any:
    endpoint = "http://127.0.0.1:9000" if addressing == "path" else "http://s3.gateway.test:9000"
    s3_config: dict[str, Any] = {"addressing_style": addressing}
    if signing is not None:
        s3_config["payload_signing_enabled"] = signing
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=secret,
        config=Config(signature_version="s3v4", s3=s3_config, retries={"max_attempts": 1}),
    )


def capture(client: Any, operation: str, **params: Any) -> Wire:
    """Run a botocore call up to the socket and return the request it would have sent."""

    def stop(request: AWSPreparedRequest, **_: Any) -> None:
        raise _Sent(request)

    client.meta.events.register("before-send.s3", stop)
    try:
        with pytest.raises(_Sent) as sent:
            getattr(client, operation)(**params)
    finally:
        client.meta.events.unregister("before-send.s3", stop)
    request = sent.value.request
    return wire_from_url(request.method, request.url, dict(request.headers.items()))


def presign(client: Any, operation: str, expires: int = 3600, **params: Any) -> Wire:
    url = client.generate_presigned_url(operation, Params=params, ExpiresIn=expires)
    method = {"get_object": "GET", "put_object": "PUT", "head_object": "HEAD"}[operation]
    return wire_from_url(method, url)


def sign_raw(method: str, url: str, headers: dict[str, str]) -> Wire:
    """Sign with botocore's signer alone, for URLs and headers a client would not build."""
    request = AWSRequest(method=method, url=url, headers=headers)
    S3SigV4Auth(Credentials(ACCESS_KEY, SECRET), "s3", "us-east-1").add_auth(request)
    return wire_from_url(method, request.url, dict(request.headers.items()))


def verifier(
    clock: Callable[[], float] = time.time, secrets: dict[str, str] | None = None, **kw: Any
) -> SigV4Verifier:
    table = {ACCESS_KEY: SECRET} if secrets is None else secrets
    return SigV4Verifier(table.get, clock=clock, **kw)


def verify(wire: Wire, v: SigV4Verifier | None = None) -> AuthResult | None:
    return (v or verifier()).verify(*wire)


def with_headers(wire: Wire, **changes: str | None) -> Wire:
    headers = dict(wire.headers)
    for name, value in changes.items():
        name = name.replace("_", "-")
        if value is None:
            headers.pop(name, None)
        else:
            headers[name] = value
    return wire._replace(headers=headers)


@pytest.fixture(scope="module")
def path_client() -> Iterator[Any]:
    yield make_client()


# -- requests botocore signs --------------------------------------------------------------------


@pytest.mark.parametrize("addressing", ["path", "virtual"])
@pytest.mark.parametrize("key", AWKWARD_KEYS)
def test_botocore_get_object_verifies_for_awkward_keys(addressing: str, key: str) -> None:
    wire = capture(make_client(addressing=addressing), "get_object", Bucket="bucket", Key=key)
    if addressing == "virtual":
        assert wire.headers["host"] == "bucket.s3.gateway.test:9000"
    result = verify(wire)
    assert result is not None
    assert result.access_key == ACCESS_KEY
    assert result.payload_hash == EMPTY_SHA256
    assert not result.presigned
    assert result.scope.endswith("/us-east-1/s3/aws4_request")


@pytest.mark.parametrize(
    ("operation", "params"),
    [
        ("head_object", {"Bucket": "b", "Key": "a b/ü", "VersionId": "v1+/="}),
        ("get_object", {"Bucket": "b", "Key": "k", "Range": "bytes=0-9", "PartNumber": 2}),
        (
            "list_objects_v2",
            {"Bucket": "b", "Prefix": "a b+c/ü=!", "Delimiter": "/", "StartAfter": "x&y=z"},
        ),
        ("list_objects", {"Bucket": "b", "Marker": "m~ %", "MaxKeys": 7, "EncodingType": "url"}),
        ("get_bucket_location", {"Bucket": "b"}),
        ("list_buckets", {}),
        ("list_object_versions", {"Bucket": "b", "KeyMarker": "k", "VersionIdMarker": "v"}),
    ],
)
def test_botocore_requests_with_query_parameters_verify(
    path_client: Any, operation: str, params: dict[str, Any]
) -> None:
    assert verify(capture(path_client, operation, **params)) is not None


def test_signed_payload_hash_is_reported_as_claimed(path_client: Any) -> None:
    body = b"hello, gateway"
    result = verify(capture(path_client, "put_object", Bucket="b", Key="k", Body=body))
    assert result is not None
    assert result.payload_hash == hashlib.sha256(body).hexdigest()


def test_unsigned_payload_is_reported_as_unsigned() -> None:
    client = make_client(signing=False)
    wire = capture(client, "put_object", Bucket="b", Key="k", Body=b"data")
    assert wire.headers["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD"
    result = verify(wire)
    assert result is not None and result.payload_hash == "UNSIGNED-PAYLOAD"


def test_request_without_any_authentication_returns_none() -> None:
    assert verify(Wire("GET", "/b/k", "prefix=X-Amz-Date", {"host": "h"})) is None


def test_path_signed_as_sent_without_escaping_verifies() -> None:
    # Some clients sign the path exactly as they send it, reserved characters unescaped.
    wire = sign_raw("GET", "http://127.0.0.1:9000/b/k=v!*(x)", {})
    assert wire.raw_path == "/b/k=v!*(x)"
    assert verify(wire) is not None


def test_lower_case_escapes_on_the_wire_verify_against_the_canonical_upper_case() -> None:
    wire = sign_raw("GET", "http://127.0.0.1:9000/b/%C3%BC%20x", {})
    assert verify(wire._replace(raw_path="/b/%c3%bc%20x")) is not None


def test_plus_in_query_is_a_literal_plus() -> None:
    wire = sign_raw("GET", "http://127.0.0.1:9000/b?prefix=a%2Bb", {})
    assert verify(wire._replace(query="prefix=a+b")) is not None
    with pytest.raises(errors.SignatureDoesNotMatch):
        verify(wire._replace(query="prefix=a%20b"))


def test_query_parameter_without_value_and_order_do_not_matter() -> None:
    wire = sign_raw("GET", "http://127.0.0.1:9000/b?versions&prefix=p&delimiter=%2F", {})
    assert verify(wire._replace(query="delimiter=/&versions=&prefix=p")) is not None


def test_header_values_are_trimmed_and_inner_spaces_collapsed() -> None:
    wire = sign_raw("GET", "http://127.0.0.1:9000/b/k", {"x-amz-meta-note": "a    b  c"})
    assert verify(with_headers(wire, x_amz_meta_note="a b    c")) is not None
    with pytest.raises(errors.SignatureDoesNotMatch):
        verify(with_headers(wire, x_amz_meta_note="a b c d"))


def test_non_ascii_header_values_verify_as_latin_1_or_utf_8_bytes() -> None:
    wire = sign_raw("PUT", "http://127.0.0.1:9000/b/k", {"x-amz-meta-name": "ünï"})
    # http.client sends botocore's value as latin-1 bytes, which the app decodes as latin-1.
    assert verify(wire) is not None
    # Other SDKs send the UTF-8 bytes they signed.
    utf8_bytes_as_received = "ünï".encode().decode("latin-1")
    assert verify(with_headers(wire, x_amz_meta_name=utf8_bytes_as_received)) is not None
    with pytest.raises(errors.SignatureDoesNotMatch):
        verify(with_headers(wire, x_amz_meta_name="uni"))


def test_date_header_stands_in_for_missing_x_amz_date() -> None:
    # botocore signs with the Date header, and sends no X-Amz-Date, when a Date is given.
    wire = sign_raw("GET", "http://127.0.0.1:9000/b/k", {"Date": "to be replaced"})
    assert "x-amz-date" not in wire.headers
    assert wire.headers["date"].endswith(("GMT", "-0000"))
    assert verify(wire) is not None
    signed_at = mktime_tz(parsedate_tz(wire.headers["date"]))  # type: ignore[arg-type]
    # One second off, staying within the same day so that the scope date still agrees.
    moved = signed_at + (1 if signed_at % 60 < 59 else -1)
    with pytest.raises(errors.SignatureDoesNotMatch):
        verify(with_headers(wire, date=formatdate(moved, usegmt=True)))


_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def _aws_uri_encode(raw: bytes, keep_slash: bool) -> str:
    """UriEncode as AWS's SigV4 documentation defines it, written out independently."""
    return "".join(
        chr(b) if b in _UNRESERVED or (keep_slash and b == 0x2F) else f"%{b:02X}" for b in raw
    )


def test_every_byte_is_canonicalized_as_aws_uri_encode_defines() -> None:
    for byte in range(256):
        one = bytes([byte])
        cases = [
            (f"%{byte:02X}", one),
            (f"%{byte:02x}", one),
            (f"a%{byte:02X}b", b"a" + one + b"b"),
        ]
        if byte < 0x80 and chr(byte) not in "%&=#?":
            cases.append((chr(byte), one))  # sent unescaped
        for sent, raw in cases:
            assert canonical_uri(f"/{sent}") == "/" + _aws_uri_encode(raw, True), sent
            assert canonical_query(f"k={sent}") == "k=" + _aws_uri_encode(raw, False), sent


_names = st.sampled_from(
    ["X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Signature", "X-Amz-Date", "x-id", "a b", ""]
)
_values = st.sampled_from(
    ["", "AKID%2F20261206%2Fus-east-1%2Fs3%2Faws4_request", "a%2fb", "%41", "x+y", "%E2%82%AC",
     "host%3Bx-amz-date", "é", "%", "%zz", "0f3c"]
)  # fmt: skip


@given(st.lists(st.tuples(_names, st.booleans(), _values), max_size=8))
def test_a_presigned_query_is_read_in_one_pass_as_in_two(
    pieces: list[tuple[str, bool, str]],
) -> None:
    """presigned_query: the X-Amz-* parameters decoded, and the canonical query without the
    signature, as the two passes it replaced read them (the X-Amz-* values unquoted, and
    canonical_query of the pieces but the signature)."""
    query = "&".join(f"{n}={v}" if eq else n for n, eq, v in pieces)
    params, canonical = presigned_query(query)
    kept = [p for p in query.split("&") if p.partition("=")[0] != "X-Amz-Signature"]
    assert canonical == canonical_query("&".join(kept))
    decoded = {}
    for piece in query.split("&"):
        name, _, value = piece.partition("=")
        if name.startswith("X-Amz-"):
            decoded[name] = unquote(value)
    assert params == decoded


# -- header authentication failures -------------------------------------------------------------


def test_tampered_signature_does_not_match(path_client: Any) -> None:
    wire = capture(path_client, "get_object", Bucket="b", Key="k")
    authorization = wire.headers["authorization"]
    flipped = authorization[:-1] + ("0" if authorization[-1] != "0" else "1")
    with pytest.raises(errors.SignatureDoesNotMatch):
        verify(with_headers(wire, authorization=flipped))


def test_tampered_request_does_not_match(path_client: Any) -> None:
    wire = capture(path_client, "get_object", Bucket="b", Key="k", Range="bytes=0-9")
    for changed in (
        wire._replace(raw_path="/b/other"),
        wire._replace(method="DELETE"),
        wire._replace(query="x-id=DeleteObject"),
        with_headers(wire, range="bytes=0-99999"),
        with_headers(wire, host="evil.example:9000"),
    ):
        with pytest.raises(errors.SignatureDoesNotMatch):
            verify(changed)


def test_signature_mismatch_explains_itself_without_the_secret() -> None:
    wire = capture(make_client(secret="not-the-secret"), "get_object", Bucket="b", Key="a b")
    with pytest.raises(errors.SignatureDoesNotMatch) as info:
        verify(wire)
    assert info.value.status == 403
    assert info.value.fields["CanonicalRequest"].startswith("GET\n/b/a%20b\n")
    assert info.value.fields["StringToSign"].startswith("AWS4-HMAC-SHA256\n")
    body = info.value.to_xml("req-1").decode()
    assert "<Code>SignatureDoesNotMatch</Code>" in body
    assert SECRET not in body and "not-the-secret" not in body


def test_unknown_access_key_is_invalid_access_key_id(path_client: Any) -> None:
    wire = capture(path_client, "get_object", Bucket="b", Key="k")
    with pytest.raises(errors.InvalidAccessKeyId) as info:
        verify(wire, verifier(secrets={"SOMEONE-ELSE": SECRET}))
    assert info.value.fields["AWSAccessKeyId"] == ACCESS_KEY


def test_rotated_secret_is_not_served_from_the_key_cache(path_client: Any) -> None:
    secrets = {ACCESS_KEY: SECRET}
    v = verifier(secrets=secrets)
    wire = capture(path_client, "get_object", Bucket="b", Key="k")
    assert verify(wire, v) is not None
    secrets[ACCESS_KEY] = "rotated"
    with pytest.raises(errors.SignatureDoesNotMatch):
        verify(wire, v)


@pytest.mark.parametrize("offset", [-901.0, 901.0, -86400.0])
def test_clock_skew_beyond_fifteen_minutes_is_refused(path_client: Any, offset: float) -> None:
    wire = capture(path_client, "get_object", Bucket="b", Key="k")
    # The verifier's clock set from the request's own time (whole seconds), not from the
    # wall clock a moment later: -901 s is then 901 s, however long the capture took.
    signed = _signed_at(wire.headers["x-amz-date"])
    with pytest.raises(errors.RequestTimeTooSkewed) as info:
        verify(wire, verifier(clock=lambda: signed + offset))
    assert info.value.status == 403
    assert info.value.fields["RequestTime"] == wire.headers["x-amz-date"]


def test_clock_skew_within_fifteen_minutes_is_accepted(path_client: Any) -> None:
    wire = capture(path_client, "get_object", Bucket="b", Key="k")
    signed = _signed_at(wire.headers["x-amz-date"])
    for offset in (-899.0, 899.0):
        assert verify(wire, verifier(clock=lambda o=offset: signed + o)) is not None


def _signed_at(amz_date: str) -> float:
    return calendar.timegm(time.strptime(amz_date, "%Y%m%dT%H%M%SZ"))


def _auth(scope: str = "20130524/us-east-1/s3/aws4_request") -> str:
    credential = f"{ACCESS_KEY}/{scope}"
    return (
        f"AWS4-HMAC-SHA256 Credential={credential}, SignedHeaders=host;x-amz-content-sha256;"
        f"x-amz-date, Signature={'0' * 64}"
    )


Malformed = errors.AuthorizationHeaderMalformed


@pytest.mark.parametrize(
    ("authorization", "error"),
    [
        ("AWS4-HMAC-SHA256", Malformed),
        ("AWS4-HMAC-SHA256 Credential=x", Malformed),
        (_auth().rsplit(",", 1)[0], Malformed),
        (_auth().replace("Signature=", "Signature "), Malformed),
        (_auth().replace("SignedHeaders", "Signed"), Malformed),
        (_auth() + ", Extra=1", Malformed),
        (_auth("20130524/us-east-1/s3"), Malformed),
        (_auth("2013-5-24/us-east-1/s3/aws4_request"), Malformed),
        (_auth("20130524/us-east-1/ec2/aws4_request"), Malformed),
        (_auth("20130524/us-east-1/s3/aws5_request"), Malformed),
        (_auth("20130525/us-east-1/s3/aws4_request"), Malformed),
        (_auth().replace("host;", ""), errors.AccessDenied),
        ("AWS4-HMAC-SHA256X Credential=a", errors.InvalidArgument),
        ("Bearer abc", errors.InvalidArgument),
    ],
)  # fmt: skip
def test_malformed_authorization_headers_are_refused(
    authorization: str, error: type[errors.S3Error]
) -> None:
    headers = {
        "host": AWS_EXAMPLE_HOST,
        "x-amz-date": "20130524T000000Z",
        "x-amz-content-sha256": EMPTY_SHA256,
        "authorization": authorization,
    }
    with pytest.raises(error) as info:
        verify(Wire("GET", "/test.txt", "", headers), verifier(clock=lambda: AWS_EXAMPLE_TIME))
    assert type(info.value) is error


@pytest.mark.parametrize("separator", [", ", ",", " ", " ,  "])
def test_authorization_component_separators_clients_use_are_accepted(
    path_client: Any, separator: str
) -> None:
    wire = capture(path_client, "get_object", Bucket="b", Key="k")
    authorization = wire.headers["authorization"].replace(", ", separator)
    assert verify(with_headers(wire, authorization=authorization)) is not None


def test_sigv2_authorization_is_refused_with_a_pointer_to_sigv4() -> None:
    headers = {"host": "h", "date": "Fri, 24 May 2013 00:00:00 GMT", "authorization": "AWS AK:c2ln"}
    with pytest.raises(errors.InvalidRequest) as info:
        verify(Wire("GET", "/b/k", "", headers))
    assert info.value.status == 400
    assert "AWS4-HMAC-SHA256" in info.value.detail


def test_sigv2_query_authentication_is_refused() -> None:
    query = "AWSAccessKeyId=AK&Expires=1700000000&Signature=abc%3D"
    with pytest.raises(errors.InvalidRequest):
        verify(Wire("GET", "/b/k", query, {"host": "h"}))


def test_missing_date_is_access_denied(path_client: Any) -> None:
    wire = with_headers(capture(path_client, "get_object", Bucket="b", Key="k"), x_amz_date=None)
    with pytest.raises(errors.AccessDenied) as info:
        verify(wire)
    assert "Date or x-amz-date" in info.value.detail
    with pytest.raises(errors.AccessDenied):
        verify(with_headers(wire, x_amz_date="2013-05-24T00:00:00Z"))


def test_missing_content_sha256_is_invalid_request() -> None:
    wire = sign_raw("GET", "http://127.0.0.1:9000/b/k", {})
    with pytest.raises(errors.InvalidRequest) as info:
        verify(with_headers(wire, x_amz_content_sha256=None))
    assert "x-amz-content-sha256" in info.value.detail


def test_content_sha256_outside_the_signature_is_invalid_request() -> None:
    wire = sign_raw("GET", "http://127.0.0.1:9000/b/k", {})
    signed = wire.headers["authorization"].replace("x-amz-content-sha256;", "")
    with pytest.raises(errors.InvalidRequest):
        verify(with_headers(wire, authorization=signed))


def test_content_sha256_of_unknown_form_is_invalid_argument() -> None:
    wire = sign_raw("GET", "http://127.0.0.1:9000/b/k", {})
    with pytest.raises(errors.InvalidArgument) as info:
        verify(with_headers(wire, x_amz_content_sha256=EMPTY_SHA256.upper()))
    assert info.value.fields["ArgumentName"] == "x-amz-content-sha256"


def test_unsigned_amz_header_is_access_denied(path_client: Any) -> None:
    wire = capture(path_client, "get_object", Bucket="b", Key="k")
    with pytest.raises(errors.AccessDenied) as info:
        verify(with_headers(wire, x_amz_copy_source="/other/key"))
    assert info.value.fields["HeadersNotSigned"] == "x-amz-copy-source"


def test_header_and_query_authentication_together_are_refused(path_client: Any) -> None:
    wire = capture(path_client, "get_object", Bucket="b", Key="k")
    with pytest.raises(errors.InvalidArgument):
        verify(wire._replace(query="X-Amz-Algorithm=AWS4-HMAC-SHA256"))


def test_configured_region_refuses_other_regions(path_client: Any) -> None:
    wire = capture(path_client, "get_object", Bucket="b", Key="k")
    with pytest.raises(errors.AuthorizationHeaderMalformed) as info:
        verify(wire, verifier(region="eu-west-1"))
    assert info.value.fields["Region"] == "eu-west-1"
    assert verify(wire, verifier(region="us-east-1")) is not None


# -- presigned URLs -----------------------------------------------------------------------------


@pytest.mark.parametrize("key", AWKWARD_KEYS)
def test_presigned_get_verifies_for_awkward_keys(path_client: Any, key: str) -> None:
    result = verify(presign(path_client, "get_object", Bucket="b", Key=key))
    assert result is not None
    assert result.presigned and result.payload_hash == "UNSIGNED-PAYLOAD"


def test_a_presigned_url_of_botocores_form_verifies_without_parsing_its_query(
    path_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """boto3's presigned GETs and HEADs, and the same URL with its parameters in canonical
    order, are checked in one step (no query parsing), with the result the whole way gives."""
    wires = [presign(path_client, "get_object", Bucket="b", Key=key) for key in AWKWARD_KEYS]
    wires.append(presign(path_client, "head_object", Bucket="b", Key="k"))
    first = wires[0]
    order = (
        "X-Amz-SignedHeaders=host&X-Amz-Expires=3600",
        "X-Amz-Expires=3600&X-Amz-SignedHeaders=host",
    )
    assert order[0] in first.query
    wires.append(first._replace(query=first.query.replace(*order)))
    # The whole way: an x-amz-* header beside the URL (tolerated unsigned) takes it.
    whole = [verify(with_headers(w, **{"x-amz-content-sha256": "UNSIGNED-PAYLOAD"})) for w in wires]
    monkeypatch.setattr(sigv4, "presigned_query", _not_called)
    assert [verify(w) for w in wires] == whole
    tampered = first._replace(query=first.query[:-1] + ("0" if first.query[-1] != "0" else "1"))
    monkeypatch.undo()
    with pytest.raises(errors.SignatureDoesNotMatch):
        verify(tampered)


def _not_called(*_: object) -> None:
    raise AssertionError("the query was parsed")


def test_presigned_virtual_host_with_response_overrides_verifies() -> None:
    disposition = 'attachment; filename="a b+c.txt"'
    client = make_client(addressing="virtual")
    wire = presign(
        client, "get_object", Bucket="bucket", Key="k", ResponseContentDisposition=disposition
    )
    assert wire.headers["host"] == "bucket.s3.gateway.test:9000"
    assert verify(wire) is not None


def test_presigned_put_verifies_and_binds_no_payload(path_client: Any) -> None:
    wire = presign(path_client, "put_object", Bucket="b", Key="new key")
    result = verify(wire)
    assert result is not None and result.payload_hash == "UNSIGNED-PAYLOAD"


def test_presigned_url_expires(path_client: Any) -> None:
    wire = presign(path_client, "get_object", expires=60, Bucket="b", Key="k")
    assert verify(wire, verifier(clock=lambda: time.time() + 55)) is not None
    with pytest.raises(errors.AccessDenied) as info:
        verify(wire, verifier(clock=lambda: time.time() + 62))
    assert info.value.detail == "Request has expired"
    assert info.value.fields["X-Amz-Expires"] == "60"


def test_a_presigned_url_verified_once_is_kept_until_it_expires_or_its_key_changes(
    path_client: Any,
) -> None:
    wire = presign(path_client, "get_object", expires=60, Bucket="b", Key="k")
    now = [time.time()]
    secrets = {ACCESS_KEY: SECRET}
    lookups: list[str] = []

    def secret_for(access_key: str) -> str | None:
        lookups.append(access_key)
        return secrets.get(access_key)

    v = SigV4Verifier(secret_for, clock=lambda: now[0])
    first = verify(wire, v)
    assert first is not None
    assert verify(wire, v) is first  # from memory: the same result, not computed again
    # Another header beside it (here an unsigned x-amz-* one) is not the same request.
    with pytest.raises(errors.AccessDenied):
        verify(with_headers(wire, **{"x-amz-acl": "public-read"}), v)
    now[0] += 62
    with pytest.raises(errors.AccessDenied) as info:
        verify(wire, v)
    assert info.value.detail == "Request has expired"
    now[0] -= 62
    assert verify(wire, v) is not None
    secrets[ACCESS_KEY] = "another secret"  # the key's secret changed: checked again
    with pytest.raises(errors.SignatureDoesNotMatch):
        verify(wire, v)
    del secrets[ACCESS_KEY]
    with pytest.raises(errors.InvalidAccessKeyId):
        verify(wire, v)
    assert lookups


def test_presigned_url_from_the_future_is_not_yet_valid(path_client: Any) -> None:
    wire = presign(path_client, "get_object", Bucket="b", Key="k")
    with pytest.raises(errors.AccessDenied) as info:
        verify(wire, verifier(clock=lambda: time.time() - 1000))
    assert "not yet valid" in info.value.detail
    assert verify(wire, verifier(clock=lambda: time.time() - 800)) is not None


@pytest.mark.parametrize(
    ("expires", "message"),
    [
        ("604801", "X-Amz-Expires must be less than a week (in seconds); that is, the given"
         " X-Amz-Expires must be less than 604800 seconds"),
        ("-7", "X-Amz-Expires must be non-negative"),
    ],
)  # fmt: skip
def test_presigned_expiry_out_of_range_is_refused(
    path_client: Any, expires: str, message: str
) -> None:
    # Forged into the query: botocore's CRT signer refuses to make such URLs itself.
    wire = presign(path_client, "get_object", expires=3600, Bucket="b", Key="k")
    wire = wire._replace(query=wire.query.replace("X-Amz-Expires=3600", f"X-Amz-Expires={expires}"))
    with pytest.raises(errors.AuthorizationQueryParametersError) as info:
        verify(wire)
    assert info.value.detail == message


def test_presigned_expiry_of_zero_is_expired(path_client: Any) -> None:
    wire = presign(path_client, "get_object", expires=3600, Bucket="b", Key="k")
    wire = wire._replace(query=wire.query.replace("X-Amz-Expires=3600", "X-Amz-Expires=0"))
    with pytest.raises(errors.AccessDenied) as info:
        verify(wire)
    assert info.value.detail == "Request has expired"
    assert info.value.fields["X-Amz-Expires"] == "0"


def test_presigned_expiry_of_a_week_is_accepted(path_client: Any) -> None:
    wire = presign(path_client, "get_object", expires=604800, Bucket="b", Key="k")
    assert verify(wire) is not None


@pytest.mark.parametrize(
    "parameter", ["X-Amz-Signature", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires"]
)
def test_presigned_url_missing_a_parameter_is_refused(path_client: Any, parameter: str) -> None:
    wire = presign(path_client, "get_object", Bucket="b", Key="k")
    query = "&".join(p for p in wire.query.split("&") if not p.startswith(parameter + "="))
    with pytest.raises(errors.AuthorizationQueryParametersError):
        verify(wire._replace(query=query))


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("X-Amz-Algorithm=AWS4-HMAC-SHA256", "X-Amz-Algorithm=AWS4-HMAC-SHA1"),
        ("X-Amz-Expires=3600", "X-Amz-Expires=soon"),
        ("%2Fs3%2F", "%2Fec2%2F"),
    ],
)
def test_presigned_url_with_malformed_parameter_is_refused(
    path_client: Any, old: str, new: str
) -> None:
    wire = presign(path_client, "get_object", Bucket="b", Key="k")
    assert old in wire.query
    with pytest.raises(errors.AuthorizationQueryParametersError):
        verify(wire._replace(query=wire.query.replace(old, new)))


def test_presigned_url_tampering_does_not_match(path_client: Any) -> None:
    wire = presign(path_client, "get_object", Bucket="b", Key="k")
    signature = wire.query.rsplit("X-Amz-Signature=", 1)[1]
    for changed in (
        wire._replace(query=wire.query.replace(signature, signature[::-1])),
        wire._replace(query=wire.query + "&response-content-type=text%2Fhtml"),
        wire._replace(raw_path="/b/other"),
        wire._replace(method="DELETE"),
    ):
        with pytest.raises(errors.SignatureDoesNotMatch):
            verify(changed)


def test_presigned_url_with_unsigned_amz_header_is_refused(path_client: Any) -> None:
    wire = presign(path_client, "put_object", Bucket="b", Key="k")
    with pytest.raises(errors.AccessDenied):
        verify(with_headers(wire, x_amz_acl="public-read"))


def test_presigned_url_with_wrong_secret_or_unknown_key_is_refused() -> None:
    wire = presign(make_client(secret="wrong"), "get_object", Bucket="b", Key="k")
    with pytest.raises(errors.SignatureDoesNotMatch):
        verify(wire)
    with pytest.raises(errors.InvalidAccessKeyId):
        verify(wire, verifier(secrets={}))


# -- AWS's published examples -------------------------------------------------------------------


def _example(
    method: str, path: str, query: str, signed: str, signature: str, **headers: str
) -> Wire:
    sent = {name.replace("_", "-"): value for name, value in headers.items()}
    sent.setdefault("host", AWS_EXAMPLE_HOST)
    sent.setdefault("x-amz-date", "20130524T000000Z")
    sent.setdefault("x-amz-content-sha256", EMPTY_SHA256)
    sent["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/20130524/us-east-1/s3/aws4_request,"
        f"SignedHeaders={signed},Signature={signature}"
    )
    return Wire(method, path, query, sent)


_STREAMING_EXAMPLE = _example(
    "PUT",
    "/examplebucket/chunkObject.txt",
    "",
    "content-encoding;content-length;host;x-amz-content-sha256;x-amz-date;"
    "x-amz-decoded-content-length;x-amz-storage-class",
    "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9",
    host="s3.amazonaws.com",
    content_encoding="aws-chunked",
    content_length="66824",
    x_amz_content_sha256="STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
    x_amz_decoded_content_length="66560",
    x_amz_storage_class="REDUCED_REDUNDANCY",
)

AWS_EXAMPLES = {
    "get-object-range": _example(
        "GET", "/test.txt", "", "host;range;x-amz-content-sha256;x-amz-date",
        "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41", range="bytes=0-9",
    ),
    "put-object": _example(
        "PUT", "/test%24file.text", "",
        "date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class",
        "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd",
        date="Fri, 24 May 2013 00:00:00 GMT", x_amz_storage_class="REDUCED_REDUNDANCY",
        x_amz_content_sha256=hashlib.sha256(b"Welcome to Amazon S3.").hexdigest(),
    ),
    "get-bucket-lifecycle": _example(
        "GET", "/", "lifecycle", "host;x-amz-content-sha256;x-amz-date",
        "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543",
    ),
    "list-objects": _example(
        "GET", "/", "max-keys=2&prefix=J", "host;x-amz-content-sha256;x-amz-date",
        "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7",
    ),
    "streaming-seed": _STREAMING_EXAMPLE,
    "presigned-get": Wire(
        "GET",
        "/test.txt",
        "X-Amz-Algorithm=AWS4-HMAC-SHA256"
        f"&X-Amz-Credential={ACCESS_KEY}%2F20130524%2Fus-east-1%2Fs3%2Faws4_request"
        "&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host"
        "&X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404",
        {"host": AWS_EXAMPLE_HOST},
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(AWS_EXAMPLES))
def test_aws_documentation_examples_verify(name: str) -> None:
    result = verify(AWS_EXAMPLES[name], verifier(clock=lambda: AWS_EXAMPLE_TIME + 60))
    assert result is not None
    assert result.scope == "20130524/us-east-1/s3/aws4_request"


# -- aws-chunked bodies -------------------------------------------------------------------------

# AWS's STREAMING-AWS4-HMAC-SHA256-PAYLOAD example: 66560 bytes of 'a' in chunks of 64 KiB,
# 1 KiB and the final empty one, with the signatures the documentation prints.
_CHUNKS = [
    (b"a" * 65536, "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648"),
    (b"a" * 1024, "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497"),
    (b"", "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9"),
]


def _streaming_auth() -> AuthResult:
    result = verify(_STREAMING_EXAMPLE, verifier(clock=lambda: AWS_EXAMPLE_TIME))
    assert result is not None
    return result


def test_chunk_signatures_of_the_aws_example_chain_from_the_seed() -> None:
    auth = _streaming_auth()
    previous = auth.signature
    for data, signature in _CHUNKS:
        verify_chunk_signature(auth, previous, data, signature)
        previous = signature


def test_chunk_string_to_sign_has_the_documented_shape() -> None:
    auth = _streaming_auth()
    assert chunk_string_to_sign(auth, auth.signature, hashlib.sha256(b"").hexdigest()) == (
        "AWS4-HMAC-SHA256-PAYLOAD\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
        f"{auth.signature}\n{EMPTY_SHA256}\n{EMPTY_SHA256}"
    )


def test_tampered_or_reordered_chunks_do_not_match() -> None:
    auth = _streaming_auth()
    (first, first_sig), (second, second_sig), _ = _CHUNKS
    with pytest.raises(errors.SignatureDoesNotMatch):
        verify_chunk_signature(auth, auth.signature, b"b" + first[1:], first_sig)
    with pytest.raises(errors.SignatureDoesNotMatch):
        verify_chunk_signature(auth, auth.signature, second, second_sig)
    with pytest.raises(errors.SignatureDoesNotMatch):
        verify_chunk_signature(auth, auth.signature, first, "not-hex-ü")


def test_trailer_signature_matches_botocores_signing_of_the_documented_string() -> None:
    auth = _streaming_auth()
    final = _CHUNKS[-1][1]
    trailer = canonical_trailer([("X-Amz-Checksum-CRC32C", " sOO8/Q== ")])
    assert trailer == b"x-amz-checksum-crc32c:sOO8/Q==\n"
    string_to_sign = (
        "AWS4-HMAC-SHA256-TRAILER\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
        f"{final}\n{hashlib.sha256(trailer).hexdigest()}"
    )
    # botocore derives the key from the secret on its own: an oracle independent of ours.
    request = AWSRequest(method="PUT", url="http://s3.amazonaws.com/")
    request.context["timestamp"] = "20130524T000000Z"
    oracle = S3SigV4Auth(Credentials(ACCESS_KEY, SECRET), "s3", "us-east-1")
    expected = oracle.signature(string_to_sign, request)
    verify_trailer_signature(auth, final, trailer, expected)
    with pytest.raises(errors.SignatureDoesNotMatch):
        verify_trailer_signature(auth, final, b"x-amz-checksum-crc32c:AAAAAA==\n", expected)


def test_auth_result_repr_leaves_out_the_signing_key() -> None:
    auth = _streaming_auth()
    assert auth.signing_key.hex() not in repr(auth) and "signing_key" not in repr(auth)
