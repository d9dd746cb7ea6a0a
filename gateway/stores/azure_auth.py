"""Authorization of Azure Blob requests: Shared Key (HMAC-SHA256 over Microsoft's canonical
string, version 2009-09-19 and later), a SAS token, or none."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from email.utils import formatdate
from urllib.parse import parse_qsl

# The headers whose values stand, in this order, between the verb and the x-ms- headers.
_STANDARD = (
    "content-encoding",
    "content-language",
    "content-length",
    "content-md5",
    "content-type",
    "date",
    "if-modified-since",
    "if-match",
    "if-none-match",
    "if-unmodified-since",
    "range",
)


def _header_order(name: str) -> tuple[str, str]:
    """Azure sorts x-ms- header names with a culture-aware comparison, not by bytes: '-' is
    ignored and '_' comes before digits. Names here are lowercase ASCII letters, digits, '-'
    and '_' (metadata names are kept to that), for which this key gives the same order."""
    return name.replace("-", "").replace("_", "!"), name


def string_to_sign(
    method: str, account: str, path: str, query: str, headers: Mapping[str, str]
) -> str:
    """Microsoft's "Shared Key for Blob" string: `path` as sent (percent-encoded, with the
    account segment for path-style endpoints), `query` as sent, `headers` lowercase."""
    standard = [headers.get(name, "") for name in _STANDARD]
    if standard[2] == "0":
        standard[2] = ""  # since version 2015-02-21 a zero Content-Length signs as empty
    ms = sorted((n for n in headers if n.startswith("x-ms-")), key=_header_order)
    # Header values are unfolded: runs of whitespace become one space.
    canonical_headers = "".join(f"{n}:{' '.join(headers[n].split())}\n" for n in ms)
    params: dict[str, list[str]] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        params.setdefault(name.lower(), []).append(value)
    resource = f"/{account}{path}" + "".join(
        f"\n{name}:{','.join(sorted(values))}" for name, values in sorted(params.items())
    )
    return "\n".join([method.upper(), *standard, canonical_headers + resource])


class SharedKey:
    """Signs requests with the account key; the key never appears in messages or reprs."""

    def __init__(self, account: str, key: str) -> None:
        try:
            self._key = base64.b64decode(key, validate=True)
        except ValueError:
            raise ValueError("azure account_key must be the base64 key of the account") from None
        self.account = account

    def __repr__(self) -> str:
        return f"SharedKey({self.account})"

    def authorization(self, method: str, path: str, query: str, headers: Mapping[str, str]) -> str:
        text = string_to_sign(method, self.account, path, query, headers)
        digest = hmac.new(self._key, text.encode("utf-8"), hashlib.sha256).digest()
        return f"SharedKey {self.account}:{base64.b64encode(digest).decode()}"


def http_date() -> str:
    """x-ms-date: RFC 1123 in GMT, which Azure takes within 15 minutes of its clock."""
    return formatdate(usegmt=True)
