"""S3's object tags as clients send them (the x-amz-tagging header, PutObjectTagging's XML),
checked against S3's limits before any store is asked: at most 10 tags, keys of 1..128 and
values of 0..256 characters (Unicode letters, digits, spaces and `+ - = . _ : / @`), no key
twice, none beginning with `aws:`."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl

from gateway import errors

MAX_TAGS = 10
MAX_KEY, MAX_VALUE = 128, 256
_ALLOWED = re.compile(r"[\w +\-=._:/@]*\Z")


def check(pairs: list[tuple[str, str]]) -> dict[str, str]:
    """The tags, or InvalidTag with S3's message for the first fault."""
    if len(pairs) > MAX_TAGS:
        raise errors.InvalidTag(f"Object tags cannot be greater than {MAX_TAGS}")
    tags: dict[str, str] = {}
    for key, value in pairs:
        if key in tags:
            raise errors.InvalidTag("Cannot provide multiple Tags with the same key")
        if not key or not _ALLOWED.match(key):
            raise errors.InvalidTag("The TagKey you have provided is invalid", TagKey=key)
        if len(key) > MAX_KEY:
            raise errors.InvalidTag(
                f"The TagKey you have provided is too long, max {MAX_KEY}", TagKey=key
            )
        if key.lower().startswith("aws:"):
            raise errors.InvalidTag("Your TagKey cannot be prefixed with aws:", TagKey=key)
        if not _ALLOWED.match(value):
            raise errors.InvalidTag("The TagValue you have provided is invalid", TagKey=key)
        if len(value) > MAX_VALUE:
            raise errors.InvalidTag(
                f"The TagValue you have provided is too long, max {MAX_VALUE}", TagKey=key
            )
        tags[key] = value
    return tags


def from_header(raw: str | None) -> dict[str, str]:
    """The tags of an x-amz-tagging header: a URL-encoded query string (`a=1&b=2`); none
    for no header."""
    if raw is None or not raw.strip():
        return {}
    text = raw if raw.isascii() else raw.encode("latin-1").decode("utf-8", "replace")
    try:
        pairs = parse_qsl(text, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise errors.InvalidArgument(
            "The header 'x-amz-tagging' shall be encoded as UTF-8 then URLEncoded URL query"
            " parameters without tag name duplicates.",
            ArgumentName="x-amz-tagging",
            ArgumentValue=raw,
        ) from None
    return check(pairs)
