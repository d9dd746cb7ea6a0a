"""The limits S3 puts on what a request names and carries, checked at the edge before any store
or database is asked: key length, user metadata size, header values the reply echoes, and
the NUL character, which the metadata database cannot hold."""

from __future__ import annotations

from collections.abc import Mapping

from gateway import errors

MAX_KEY_BYTES = 1024  # of the key's UTF-8 form
MAX_USER_METADATA_BYTES = 2048  # x-amz-meta-* names (without the prefix) plus values
META_PREFIX = "x-amz-meta-"
# What a header value may not hold on the wire: controls but tab (CR and LF above all, which
# would end the header), and anything beyond latin-1, which HTTP/1.1 cannot carry.
_HEADER_SAFE = frozenset("\t" + "".join(map(chr, [*range(0x20, 0x7F), *range(0xA0, 0x100)])))


def check_request(key: str | None, query: Mapping[str, str]) -> None:
    """What every request must pass once authenticated, whatever its operation."""
    if key is not None:
        check_key(key)
    for name, value in query.items():
        if "\x00" in name or "\x00" in value:
            raise errors.InvalidArgument(
                "A query parameter may not contain the NUL character.", ArgumentName=name
            )


def check_key(key: str) -> None:
    """KeyTooLongError past 1,024 bytes, as S3. A NUL is refused too: the metadata database
    (PostgreSQL text) cannot hold one, and S3 clients never send it."""
    size = len(key.encode("utf-8"))
    if size > MAX_KEY_BYTES:
        raise errors.KeyTooLongError(Size=str(size), MaxSizeAllowed=str(MAX_KEY_BYTES))
    if "\x00" in key:
        raise errors.InvalidArgument(
            "An object key may not contain the NUL character.", ArgumentName="key"
        )


def user_metadata(headers: Mapping[str, str]) -> dict[str, str]:
    """The request's x-amz-meta-* headers by name without the prefix, refused with
    MetadataTooLarge past 2 KB counted as S3 counts them (bytes of each name and value)."""
    metadata = {k[len(META_PREFIX) :]: v for k, v in headers.items() if k.startswith(META_PREFIX)}
    # Header text is the wire bytes decoded as latin-1: one character per byte sent.
    size = sum(len(name) + len(value) for name, value in metadata.items())
    if size > MAX_USER_METADATA_BYTES:
        raise errors.MetadataTooLarge(Size=str(size), MaxSizeAllowed=str(MAX_USER_METADATA_BYTES))
    return {name: header_text(value) for name, value in metadata.items()}


def header_text(value: str) -> str:
    """The text a header value was sent as. SDKs (botocore, the AWS CLI, Go's and Java's) send
    non-ASCII header text as UTF-8, which arrives here one latin-1 character per byte: bytes
    that are valid UTF-8 are taken as it, others as latin-1 text, as they came."""
    if value.isascii():
        return value
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return value


def is_header_safe(value: str) -> bool:
    """Whether `value` can go out as an HTTP/1.1 header value as it is."""
    if value.isascii() and value.isprintable():  # nearly always: two C-speed scans
        return True
    return _HEADER_SAFE.issuperset(value)
