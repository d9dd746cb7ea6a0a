"""The edge renders a plain version's header lines in one formatting (handlers.plain_object_head)
where object_headers() builds and walks its fields: the two must give the same bytes for every
version the first takes, and the first must leave every other version to object_headers()."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from hypothesis import event, given, settings
from hypothesis import strategies as st

from gateway.s3.handlers import object_headers, plain_object_head
from gateway.s3.http import Reply
from gateway.stores import ObjectInfo

# Text as stores give it: mostly plain, sometimes what a header cannot carry as it is.
_text = st.one_of(
    st.none(),
    st.just(""),
    st.sampled_from(["image/jpeg", "application/x-tar", "text/plain; charset=utf-8"]),
    st.text(max_size=12),
)


def _rarely(value: object, empty: object = None) -> st.SearchStrategy[object]:
    """`empty` nine times in ten, else `value`: about a third of the versions drawn are plain,
    the others differ from plain in one way or a few."""
    return st.sampled_from([empty] * 9 + [value])


_infos = st.builds(
    ObjectInfo,
    key=st.text(min_size=1, max_size=20),
    size=st.integers(0, 1 << 40),
    etag=st.from_regex(r'"[0-9a-f]{32}(-[0-9]{1,4})?"', fullmatch=True),
    last_modified=st.datetimes(
        min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
    ),
    content_type=_text,
    content_encoding=_rarely("gzip"),
    content_disposition=_rarely('attachment; filename="a"'),
    content_language=_rarely("en"),
    cache_control=_rarely("max-age=60"),
    expires=_rarely("Thu, 01 Dec 2094 16:00:00 GMT"),
    metadata=st.one_of(
        _rarely({"a": "x"}, {}), st.dictionaries(st.just("b"), st.text(max_size=5), max_size=1)
    ),
    storage_class=st.sampled_from(["STANDARD"] * 8 + ["STANDARD_IA", ""]),
    tag_count=_rarely(2, 0),
    encryption=_rarely({"x-amz-server-side-encryption": "AES256"}, {}),
    version_id=_rarely("v1"),
    store_version=_rarely("3HL4kqtJlcpXroDTDmJ"),
)


def _lines(info: ObjectInfo) -> bytes:
    reply = Reply()
    object_headers(reply, info, {})
    return b"".join(b"%s: %s\r\n" % (name, value) for name, value in reply.headers)


@settings(max_examples=400)
@given(_infos)
def test_a_plain_head_is_the_bytes_object_headers_renders(info: ObjectInfo) -> None:
    plain = plain_object_head(info)
    event("plain" if plain is not None else "object_headers")
    if plain is not None:
        assert plain == _lines(info)


def test_a_datasets_object_is_plain() -> None:
    info = ObjectInfo(
        key="train/00000001.jpg",
        size=102400,
        etag='"0f343b0931126a20f133d67c2b018a3b"',
        last_modified=datetime(2026, 1, 1, 12, 0, 7, tzinfo=UTC),
        content_type="image/jpeg",
    )
    assert plain_object_head(info) == (
        b'etag: "0f343b0931126a20f133d67c2b018a3b"\r\n'
        b"last-modified: Thu, 01 Jan 2026 12:00:07 GMT\r\n"
        b"accept-ranges: bytes\r\n"
        b"content-type: image/jpeg\r\n"
    )
    assert plain_object_head(replace(info, content_type=None)) == (
        _lines(info).replace(b"image/jpeg", b"binary/octet-stream")
    )
