"""The signature on every request between nodes: an HMAC of the fleet secret over the method,
the canonical target and a timestamp, carried in one header; nodes refuse any other."""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from urllib.parse import parse_qsl, urlencode

AUTH_HEADER = "x-gateway-fleet"
MAX_SKEW = 60  # seconds an internal request's signature stays valid
# A stamp is whole seconds since the epoch in ASCII digits: no sign, fraction, exponent,
# underscore, space or other script's digits (all of which float() or int() would take).
_STAMP = re.compile(r"[0-9]{1,12}", re.ASCII)


def canonical(path: str, query: str) -> str:
    """The request as signed: path and sorted decoded parameters, so that how an HTTP library
    percent-encodes the query does not matter."""
    return path + "?" + urlencode(sorted(parse_qsl(query, keep_blank_values=True)))


def sign(secret: bytes, method: str, target: str, stamp: str) -> str:
    message = f"{method}\n{target}\n{stamp}".encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def auth_value(secret: bytes, method: str, target: str) -> str:
    stamp = str(int(time.time()))
    return f"{stamp}:{sign(secret, method, target, stamp)}"


def verify(secret: bytes, method: str, target: str, value: str | None) -> bool:
    """Whether `value` signs `target` (see canonical) for this fleet, with a stamp within
    MAX_SKEW seconds of now. A stamp that is not a plain integer is refused before any
    arithmetic: `nan` compares false with everything, so it would never have expired."""
    if not value or ":" not in value:
        return False
    stamp, _, signature = value.partition(":")
    if _STAMP.fullmatch(stamp) is None or abs(time.time() - int(stamp)) > MAX_SKEW:
        return False
    return hmac.compare_digest(signature, sign(secret, method, target, stamp))
