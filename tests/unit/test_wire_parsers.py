"""Properties of the parsers that read numbers, ranges and XML off the wire, over arbitrary
input (hypothesis): they answer a value or S3's refusal, and never raise anything else."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway import decimals, errors
from gateway.s3 import xml_in
from gateway.s3.limits import header_text, is_header_safe
from gateway.service.conditions import ByteRange

FAST = settings(max_examples=300, deadline=None)
DIGITS = st.text(alphabet="0123456789", min_size=1, max_size=30)
# Text near numbers: digits, signs, underscores, spaces, Unicode digits and superscripts.
NUMBERISH = st.text(alphabet="0123456789+-_ .eEx²³¹\u0663\u0661\u0966\u00a0\t", max_size=30)


@FAST
@given(st.one_of(NUMBERISH, st.text(max_size=30), DIGITS))
@example("9" * 5000)
@example("²")
def test_decimal_is_ascii_digits_within_bounds_or_none(text: str) -> None:
    value = decimals.parse(text, decimals.INT64_MAX)
    digits = text.isascii() and text.isdigit()
    if digits and len(text.lstrip("0")) <= 19 and int(text) <= decimals.INT64_MAX:
        assert value == int(text)
    else:
        assert value is None


@pytest.mark.parametrize(
    ("text", "limit", "value"),
    [("0", 10, 0), ("0010", 10, 10), ("11", 10, None), ("00000000000000000000001", 1, 1)],
)
def test_decimal_bounds_and_leading_zeros(text: str, limit: int, value: int | None) -> None:
    assert decimals.parse(text, limit) == value


@FAST
@given(
    st.one_of(
        st.builds(lambda a, b: f"bytes={a}-{b}", st.one_of(NUMBERISH, DIGITS), NUMBERISH),
        st.text(max_size=40),
    )
)
@example("bytes=+1-2")
@example("bytes=1_0-20")
def test_range_parses_to_plain_positions_or_is_ignored(header: str) -> None:
    rng = ByteRange.parse(header)
    if rng is None:
        return
    spec = header.strip().split("=", 1)[1]
    first, last = spec.split("-")
    for raw, parsed in ((first, rng.first), (last, rng.last)):
        assert (parsed is None) == (raw == "")
        if raw:
            assert raw.isascii() and raw.isdigit() and parsed == int(raw)
    assert ByteRange.parse(str(rng)) == rng
    for size in (0, 1, 100):
        try:
            start, end = rng.resolve(size)
        except errors.InvalidRange:
            continue
        assert 0 <= start < end <= size


@FAST
@given(st.text(max_size=20), st.text(max_size=10))
def test_complete_multipart_body_parses_or_is_malformed_xml(number: str, etag: str) -> None:
    from xml.sax.saxutils import escape

    body = (
        f"<CompleteMultipartUpload><Part><PartNumber>{escape(number)}</PartNumber>"
        f"<ETag>{escape(etag)}</ETag></Part></CompleteMultipartUpload>"
    ).encode("utf-8", "surrogatepass")
    try:
        parts = xml_in.complete_multipart(body)
    except errors.MalformedXML:
        return
    [(value, _)] = parts
    assert number.strip().isascii() and number.strip().isdigit() and value == int(number)


@FAST
@given(st.text(max_size=30))
def test_header_safe_text_encodes_as_latin_1_without_line_breaks(value: str) -> None:
    if is_header_safe(value):
        assert "\r" not in value and "\n" not in value and "\x00" not in value
        value.encode("latin-1")


@FAST
@given(st.text(max_size=30))
@example("Hello World\u00e9")
def test_header_text_is_the_text_an_sdk_sent_as_utf_8(value: str) -> None:
    # A header value arrives one latin-1 character per byte sent.
    assert header_text(value.encode("utf-8", "surrogatepass").decode("latin-1")) == value


@pytest.mark.parametrize(
    ("sent", "text"),
    [(b"plain", "plain"), (b"Z\xc3\xbcrich", "Z\u00fcrich"), (b"caf\xe9", "caf\u00e9")],
)
def test_header_bytes_not_utf_8_are_latin_1_text(sent: bytes, text: str) -> None:
    assert header_text(sent.decode("latin-1")) == text


@FAST
@given(st.text(max_size=30), st.text(max_size=30))
def test_error_document_is_well_formed_whatever_it_echoes(message: str, value: str) -> None:
    doc = errors.InvalidArgument(message or None, ArgumentValue=value).to_xml("ID", value)
    root = ET.fromstring(doc)
    assert root.findtext("Code") == "InvalidArgument"
    assert root.findtext("RequestId") == "ID"
