"""Text in HTTP headers of the stores whose attributes travel as headers (S3, Azure): values
that a header cannot carry as they are go as one RFC 2047 word, as S3 itself answers non-ASCII
user metadata, and come back as the text they were."""

from __future__ import annotations

import base64
import re

_ENCODED_WORD = re.compile(r"=\?UTF-8\?B\?([A-Za-z0-9+/=]*)\?=\Z", re.IGNORECASE)


def to_header(value: str) -> str:
    """`value` itself if it is printable ASCII with no space at either end (which HTTP would
    trim, and Azure refuses), else `=?UTF-8?B?<base64 of its UTF-8>?=`."""
    if value and value.isascii() and value.isprintable() and value == value.strip():
        return value
    return f"=?UTF-8?B?{base64.b64encode(value.encode('utf-8', 'surrogatepass')).decode()}?="


def from_header(value: str) -> str:
    """The text a header value stands for: an RFC 2047 UTF-8 word decoded (the form S3 answers
    non-ASCII metadata in, whoever wrote it), anything else as it is."""
    word = _ENCODED_WORD.match(value)
    if word is None:
        return value
    try:
        return base64.b64decode(word[1], validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return value
