"""A bucket's CORS configuration (PutBucketCors' XML, kept as JSON in the mount's `cors`
option) and how S3 answers browsers by it: a preflight OPTIONS (no authentication, as S3),
and the Access-Control-* headers of an actual request whose Origin and method a rule allows.

Rules are tried in order; the first that matches wins. AllowedOrigin and AllowedHeader may
hold one `*` wildcard each (S3 refuses more); origins match with their case, methods and
header names without."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from xml.sax.saxutils import escape

from gateway import decimals, errors
from gateway.s3 import xml_in

METHODS = ("GET", "PUT", "HEAD", "POST", "DELETE")
MAX_RULES = 100
MAX_BODY = 64 << 10
_NOT_ENABLED = "CORSResponse: CORS is not enabled for this bucket."
_NOT_ALLOWED = (
    "CORSResponse: This CORS request is not allowed. This is usually because the evalution of"
    " Origin, request method / Access-Control-Request-Method or Access-Control-Request-Headers"
    " are not whitelisted by the resource's CORS spec."
)


@dataclass(frozen=True, slots=True)
class Rule:
    origins: tuple[str, ...]
    methods: tuple[str, ...]
    headers: tuple[str, ...] = ()
    expose: tuple[str, ...] = ()
    max_age: int | None = None
    id: str | None = None

    def allows_origin(self, origin: str) -> bool:
        return any(_matches(p, origin) for p in self.origins)

    def allows_headers(self, names: list[str]) -> bool:
        return all(any(_matches(p.lower(), n) for p in self.headers) for n in names)


def _matches(pattern: str, value: str) -> bool:
    if "*" not in pattern:
        return pattern == value
    head, _, tail = pattern.partition("*")
    return len(value) >= len(head) + len(tail) and value.startswith(head) and value.endswith(tail)


# -- configuration in and out ------------------------------------------------------------------


def parse(data: bytes) -> list[Rule]:
    """The rules of a PutBucketCors body; MalformedXML or InvalidRequest as S3 answers."""
    if len(data) > MAX_BODY:
        raise errors.MalformedXML("The XML you provided was larger than the maximum allowed.")
    root = xml_in.parse(data)
    if xml_in._local(root.tag) != "CORSConfiguration":
        raise errors.MalformedXML()
    rules = []
    for element in root:
        if xml_in._local(element.tag) != "CORSRule":
            raise errors.MalformedXML()
        found: dict[str, list[str]] = {}
        for child in element:
            found.setdefault(xml_in._local(child.tag), []).append((child.text or "").strip())
        unknown = set(found) - {
            "AllowedOrigin", "AllowedMethod", "AllowedHeader", "ExposeHeader", "MaxAgeSeconds",
            "ID",
        }  # fmt: skip
        if unknown or not found.get("AllowedOrigin") or not found.get("AllowedMethod"):
            raise errors.MalformedXML()
        for method in found["AllowedMethod"]:
            if method not in METHODS:
                raise errors.InvalidRequest(
                    f"Found unsupported HTTP method in CORS config. Unsupported method is {method}"
                )
        for origin in found["AllowedOrigin"]:
            if origin.count("*") > 1:
                raise errors.InvalidRequest(
                    f'AllowedOrigin "{origin}" can not have more than one wildcard.'
                )
        for header in found.get("AllowedHeader", []):
            if header.count("*") > 1:
                raise errors.InvalidRequest(
                    f'AllowedHeader "{header}" can not have more than one wildcard.'
                )
        max_age = None
        if "MaxAgeSeconds" in found:
            max_age = decimals.parse(found["MaxAgeSeconds"][0], decimals.INT32_MAX)
            if max_age is None or len(found["MaxAgeSeconds"]) > 1:
                raise errors.MalformedXML()
        ids = found.get("ID", [])
        if len(ids) > 1 or (ids and len(ids[0]) > 255):
            raise errors.MalformedXML()
        rules.append(
            Rule(
                tuple(found["AllowedOrigin"]),
                tuple(found["AllowedMethod"]),
                tuple(found.get("AllowedHeader", [])),
                tuple(found.get("ExposeHeader", [])),
                max_age,
                ids[0] if ids else None,
            )
        )
    if not rules:
        raise errors.MalformedXML()
    if len(rules) > MAX_RULES:
        raise errors.InvalidRequest(f"The number of CORS rules should not exceed {MAX_RULES}")
    return rules


def to_json(rules: list[Rule]) -> str:
    return json.dumps(
        [
            {"o": r.origins, "m": r.methods, "h": r.headers, "e": r.expose, "a": r.max_age,
             "i": r.id}
            for r in rules
        ],
        separators=(",", ":"),
    )  # fmt: skip


@functools.lru_cache(maxsize=256)
def from_json(text: str) -> tuple[Rule, ...]:
    """The rules kept in a mount's `cors` option (parsed once per distinct value)."""
    try:
        doc = json.loads(text)
        return tuple(
            Rule(tuple(d["o"]), tuple(d["m"]), tuple(d["h"]), tuple(d["e"]), d["a"], d["i"])
            for d in doc
        )
    except (ValueError, KeyError, TypeError):
        return ()  # not ours: no rules


def to_xml(rules: tuple[Rule, ...]) -> bytes:
    out = []
    for r in rules:
        parts = [f"<ID>{escape(r.id)}</ID>"] if r.id is not None else []
        parts += [f"<AllowedHeader>{escape(h)}</AllowedHeader>" for h in r.headers]
        parts += [f"<AllowedMethod>{m}</AllowedMethod>" for m in r.methods]
        parts += [f"<AllowedOrigin>{escape(o)}</AllowedOrigin>" for o in r.origins]
        parts += [f"<ExposeHeader>{escape(e)}</ExposeHeader>" for e in r.expose]
        if r.max_age is not None:
            parts.append(f"<MaxAgeSeconds>{r.max_age}</MaxAgeSeconds>")
        out.append(f"<CORSRule>{''.join(parts)}</CORSRule>")
    body = "".join(out)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<CORSConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/">{body}'
        "</CORSConfiguration>"
    ).encode()


# -- answering browsers ----------------------------------------------------------------------


def preflight(rules: tuple[Rule, ...] | None, headers: Mapping[str, str]) -> list[tuple[str, str]]:
    """The headers of a preflight's 200, or S3's error: 400 without Origin or
    Access-Control-Request-Method, 403 AccessForbidden when no rule allows it."""
    origin = headers.get("origin")
    if not origin:
        raise errors.BadRequest("Insufficient information. Origin request header needed.")
    method = headers.get("access-control-request-method")
    if not method:
        raise errors.BadRequest(
            "Insufficient information. Access-Control-Request-Method header needed."
        )
    if method not in METHODS:
        raise errors.BadRequest(f"Invalid Access-Control-Request-Method: {method}")
    if not rules:
        raise errors.AccessForbidden(_NOT_ENABLED, Method=method, ResourceType="BUCKET")
    asked = [
        h.strip().lower() for h in headers.get("access-control-request-headers", "").split(",")
    ]
    asked = [h for h in asked if h]
    for rule in rules:
        if rule.allows_origin(origin) and method in rule.methods and rule.allows_headers(asked):
            out = _allowed(rule, origin)
            if asked:
                out.append(("access-control-allow-headers", ", ".join(asked)))
            return out
    raise errors.AccessForbidden(_NOT_ALLOWED, Method=method, ResourceType="OBJECT")


def actual(rules: tuple[Rule, ...], origin: str, method: str) -> list[tuple[str, str]]:
    """The Access-Control-* headers of an actual request's answer; none when no rule
    allows its Origin and method."""
    for rule in rules:
        if rule.allows_origin(origin) and method in rule.methods:
            return _allowed(rule, origin)
    return []


def _allowed(rule: Rule, origin: str) -> list[tuple[str, str]]:
    wildcard = "*" in rule.origins
    out = [
        ("access-control-allow-origin", "*" if wildcard else origin),
        ("access-control-allow-methods", ", ".join(rule.methods)),
        ("vary", "Origin, Access-Control-Request-Headers, Access-Control-Request-Method"),
    ]
    if not wildcard:
        out.append(("access-control-allow-credentials", "true"))
    if rule.expose:
        out.append(("access-control-expose-headers", ", ".join(rule.expose)))
    if rule.max_age is not None:
        out.append(("access-control-max-age", str(rule.max_age)))
    return out
