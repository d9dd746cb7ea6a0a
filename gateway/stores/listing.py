"""What the stores that list by walking their keys in order (file, HDFS, GCS) share: their
continuation tokens, where a page resumes, and how a key rolls up into a common prefix."""

from __future__ import annotations

import base64
import binascii

from gateway.stores.base import ListRequest


def encode_token(last: str) -> str:
    """A continuation token that resumes a listing after `last`."""
    return base64.urlsafe_b64encode(last.encode("utf-8")).decode("ascii")


def decode_token(token: str) -> str:
    try:
        return base64.urlsafe_b64decode(token.encode("ascii")).decode("utf-8")
    except (ValueError, binascii.Error) as exc:
        raise ValueError("malformed continuation token") from exc


def resume_after(request: ListRequest) -> str:
    """The key a page starts after: the later of start_after and where the token left off
    (ValueError for a token this module did not make)."""
    after = request.start_after or ""
    return max(after, decode_token(request.token)) if request.token else after


def rollup(key: str, prefix: str, delimiter: str | None) -> str | None:
    """The common prefix `key` rolls up into under `prefix` and `delimiter`, if any: the key
    up to and with the first delimiter after the prefix."""
    if not delimiter or not key.startswith(prefix):
        return None
    at = key.find(delimiter, len(prefix))
    return None if at < 0 else key[: at + len(delimiter)]
