"""Key arithmetic in S3's order (UTF-8 bytes, which is code point order): the bound above a
prefix, the common prefix a key rolls up into, and the catalog's continuation tokens."""

from __future__ import annotations

import base64
import binascii

_MAX = 0x10FFFF
_SURROGATES = range(0xD800, 0xE000)  # not characters: no UTF-8 form, never in a key
TOKEN_MARK = "c1."  # a continuation token of the catalog's, not of a store's


def successor(prefix: str) -> str | None:
    """The least string above every string that begins with `prefix` (None: there is none,
    or `prefix` is empty and every key begins with it)."""
    chars = list(prefix)
    while chars:
        code = ord(chars.pop()) + 1
        if code in _SURROGATES:
            code = _SURROGATES.stop
        if code <= _MAX:
            return "".join(chars) + chr(code)
    return None


def rolled_up(key: str, prefix: str, delimiter: str | None) -> str | None:
    """The common prefix `key` is listed under (prefix, then up to and with the first
    delimiter after it), or None when it is listed as itself."""
    if not delimiter:
        return None
    at = key.find(delimiter, len(prefix))
    return None if at < 0 else key[: at + len(delimiter)]


def encode_token(last: str) -> str:
    """A continuation token that goes on after `last` (a key or a common prefix)."""
    return TOKEN_MARK + base64.urlsafe_b64encode(last.encode("utf-8")).decode("ascii")


def decode_token(token: str) -> str | None:
    """The entry a catalog token goes on after; None for a token that is not the catalog's
    (a store's, given before the prefix was synced). ValueError for a malformed one."""
    if not token.startswith(TOKEN_MARK):
        return None
    try:
        raw = token[len(TOKEN_MARK) :].encode("ascii")
        return base64.b64decode(raw, altchars=b"-_", validate=True).decode("utf-8")
    except (ValueError, binascii.Error) as exc:
        raise ValueError("malformed continuation token") from exc
