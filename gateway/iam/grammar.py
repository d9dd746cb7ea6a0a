"""Policy documents: parsed strictly (MalformedPolicy with S3's reason) into compiled
statements that `evaluate` checks cheaply (actions as a set, resources as matchers)."""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import dates
from .actions import ACTIONS, BY_LOWER
from .wildcard import Matcher, wildcard

ANONYMOUS = "*"  # the principal of a statement that applies to everyone, signed or not
S3_ARN = "arn:aws:s3:::"
_VERSIONS = frozenset({"2012-10-17", "2008-10-17"})
_USER_ARN = re.compile(r"arn:aws:iam::[^:]*:user/([A-Za-z0-9_+=,.@-]{1,64})")
_CONDITION_KEY = re.compile(r"(aws|s3):[A-Za-z0-9_-]+", re.IGNORECASE)
# The condition keys the gateway knows a request's value of (lower case), and so the policy
# variables it can fill in. A policy that names any other key is refused when stored: a key
# it cannot evaluate must never decide by being absent, nor a variable by being taken as text.
# S3's condition keys that are a request header's value, by header (AWS's "Amazon S3 condition
# keys"): a policy that says "deny uploads without server-side encryption" is the common case.
HEADER_KEYS = {
    h: "s3:" + h
    for h in (
        "x-amz-server-side-encryption", "x-amz-server-side-encryption-aws-kms-key-id",
        "x-amz-server-side-encryption-customer-algorithm", "x-amz-acl", "x-amz-copy-source",
        "x-amz-metadata-directive", "x-amz-storage-class", "x-amz-content-sha256",
        "x-amz-object-ownership",
    )
}  # fmt: skip
KNOWN_KEYS = frozenset(
    {
        "aws:sourceip", "aws:securetransport", "aws:username", "aws:userid", "s3:prefix",
        "s3:delimiter", *HEADER_KEYS.values(),
    }
)  # fmt: skip
# The request's time (aws:CurrentTime, aws:EpochTime): a condition key of the Date operators
# (and, epoch seconds, of the Numeric ones) and of Null, never of a text comparison nor a
# policy variable (AWS's own rule for the Date operators).
TIME_KEYS = dates.TIME_KEYS
_VARIABLE = re.compile(r"\$\{([^}]*)\}")
_ESCAPES = {"*": "*", "?": "?", "$": "$"}  # ${*} ${?} ${$}: the character itself, as text
_STATEMENT_FIELDS = frozenset(
    {"Sid", "Effect", "Principal", "Action", "NotAction", "Resource", "NotResource", "Condition"}
)


class MalformedPolicy(ValueError):
    """The document is not a policy this gateway accepts; the message says why."""


def user_arn(name: str) -> str:
    """How a policy names a user of this gateway (as Ceph RGW names its users)."""
    return f"arn:aws:iam:::user/{name}"


Values = tuple[str, ...]
Test = Callable[[str, Values], bool]


class Unresolved(Exception):
    """A policy variable with no value in this request: the statement cannot be evaluated, so
    an Allow does not apply and a Deny does (a refusal, never a literal match)."""


@dataclass(frozen=True, slots=True)
class Template:
    """A Resource or a condition value with policy variables: text (with its wildcards) and,
    between, the condition keys whose request values go in as plain text."""

    parts: tuple[str, ...]  # text, key, text, key, ..., text (keys at odd places)
    written: str

    def fill(self, context: Mapping[str, str], quoted: bool) -> str:
        """The value with the request's values in; `quoted`: as a wildcard pattern, in which
        a filled-in `*` or `?` is text (\\* and \\?)."""
        out = []
        for i, part in enumerate(self.parts):
            if i % 2 == 0:
                out.append(part.replace("\\", "\\\\") if quoted else part)
                continue
            value = _ESCAPES.get(part)
            if value is None:
                value = context.get(part)
                if value is None:
                    raise Unresolved(part)
            out.append(_quote(value) if quoted else value)
        return "".join(out)

    def matcher(self, context: Mapping[str, str]) -> Matcher:
        return wildcard(self.fill(context, quoted=True), escaped=True)


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("*", "\\*").replace("?", "\\?")


def _template(text: str, where: str) -> Template | None:
    """The policy variables of `text`, or None if it has none; MalformedPolicy for a variable
    the gateway cannot fill in."""
    if "${" not in text:
        return None
    parts: list[str] = []
    at = 0
    for m in _VARIABLE.finditer(text):
        name = m.group(1).strip()
        key = name if name in _ESCAPES else name.lower()
        if key not in _ESCAPES and key not in KNOWN_KEYS:
            raise MalformedPolicy(
                f"{where} has a policy variable the gateway cannot evaluate: {m.group(0)}"
            )
        parts += [text[at : m.start()], key]
        at = m.end()
    parts.append(text[at:])
    if any("${" in p for p in parts[::2]):
        raise MalformedPolicy(f"{where} has an unterminated policy variable: {text}")
    return Template(tuple(parts), text)


def _string_equals(value: str, values: Values) -> bool:
    return value in values


def _string_equals_ic(value: str, values: Values) -> bool:
    folded = value.casefold()
    return any(folded == v.casefold() for v in values)


def _string_like(value: str, values: Values) -> bool:
    return any(wildcard(v)(value) for v in values)


def _string_like_escaped(value: str, values: Values) -> bool:
    return any(wildcard(v, escaped=True)(value) for v in values)


def _ip_address(value: str, values: Values) -> bool:
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return False
    return any(address in ipaddress.ip_network(v, strict=False) for v in values)


def _bool(value: str, values: Values) -> bool:
    return value.lower() in {v.lower() for v in values}


_TEXT_TESTS = (_string_equals, _string_equals_ic, _string_like)

# operator -> (test, negated)
_OPERATORS: dict[str, tuple[Test, bool]] = {
    "StringEquals": (_string_equals, False),
    "StringNotEquals": (_string_equals, True),
    "StringEqualsIgnoreCase": (_string_equals_ic, False),
    "StringNotEqualsIgnoreCase": (_string_equals_ic, True),
    "StringLike": (_string_like, False),
    "StringNotLike": (_string_like, True),
    "IpAddress": (_ip_address, False),
    "NotIpAddress": (_ip_address, True),
    "Bool": (_bool, False),
}
# The ordered operators: Date<comparison> and Numeric<comparison>, their tests made per
# condition (dates.Ordered) with the policy's values parsed once.
_ORDERED = frozenset(f"{kind}{name}" for kind in ("Date", "Numeric") for name in dates.COMPARISONS)


@dataclass(frozen=True, slots=True)
class Condition:
    operator: str
    key: str  # lower case: condition keys are not case-sensitive
    values: Values
    test: Test
    negated: bool
    if_exists: bool
    null: bool = False  # the Null operator: values say whether the key must be absent

    templates: tuple[Template | None, ...] = ()  # per value: its policy variables

    def holds(self, context: Mapping[str, str]) -> bool:
        value = context.get(self.key)
        test, values = self.test, self.values
        if value is not None and any(self.templates):
            # A filled-in value is text, even inside a StringLike pattern.
            like = test is _string_like
            values = tuple(
                t.fill(context, like) if t is not None else v.replace("\\", "\\\\") if like else v
                for v, t in zip(values, self.templates, strict=True)
            )
            test = _string_like_escaped if like else test
        if self.null:
            absent = value is None
            return any((v.lower() == "true") == absent for v in self.values)
        if value is None:
            # A key the request does not have: a negated operator holds, as in AWS.
            return self.if_exists or self.negated
        return test(value, values) != self.negated


@dataclass(frozen=True, slots=True)
class Statement:
    sid: str
    allow: bool
    actions: frozenset[str]  # the actions it covers, NotAction already inverted
    resources: tuple[Matcher, ...]
    not_resource: bool
    conditions: tuple[Condition, ...]
    principals: frozenset[str] | None = None  # None: an identity policy's (its holder)
    all_resources: bool = False  # Resource "*" (with no NotResource)
    patterns: tuple[str, ...] = ()  # the resources as written, less "arn:aws:s3:::"
    templates: tuple[Template | None, ...] = ()  # per resource: its policy variables
    variables: bool = False  # some resource or condition value has a policy variable
    timed: bool = False  # some condition names the request's time (dates.TIME_KEYS)

    def matches(self, action: str, resource: str, context: Mapping[str, str]) -> bool:
        if action not in self.actions:
            return False
        try:
            if not self.all_resources:
                hit = any(m(resource) for m in self._matchers(context))
                if hit == self.not_resource:
                    return False
            return all(c.holds(context) for c in self.conditions)
        except Unresolved:
            return not self.allow  # cannot be evaluated: a refusal either way

    def _matchers(self, context: Mapping[str, str]) -> tuple[Matcher, ...]:
        if not self.variables or not any(self.templates):
            return self.resources
        return tuple(
            t.matcher(context) if t is not None else m
            for m, t in zip(self.resources, self.templates, strict=True)
        )


@dataclass(frozen=True, slots=True)
class CompiledPolicy:
    statements: tuple[Statement, ...]
    has_deny: bool = False
    # An unconditional Allow of every action on every resource, and no Deny: nothing to check.
    allows_all: bool = False
    document: str = field(default="", compare=False)
    timed: bool = False  # some statement names the request's time


def compile_policy(text: str | bytes, bucket: str | None = None) -> CompiledPolicy:
    """Parse a policy document. `bucket` set: a bucket policy of that bucket (Principal
    required, every Resource within the bucket); None: an identity policy (no Principal)."""
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeError) as exc:
        raise MalformedPolicy(f"Policies must be valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise MalformedPolicy("Policies must be valid JSON and the first byte must be '{'")
    unknown = set(doc) - {"Version", "Id", "Statement"}
    if unknown:
        raise MalformedPolicy(f"Unknown field {sorted(unknown)[0]}")
    version = doc.get("Version", "2008-10-17")
    if version not in _VERSIONS:
        raise MalformedPolicy(f"The policy has an invalid Version: {version!r}")
    if "Id" in doc and not isinstance(doc["Id"], str):
        raise MalformedPolicy("Id must be a string")
    raw = doc.get("Statement")
    if isinstance(raw, dict):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise MalformedPolicy("Missing required field Statement")
    # Policy variables are the 2012-10-17 grammar's; in an older document `${...}` would be
    # text, which the gateway never matches literally.
    if version != "2012-10-17" and "${" in json.dumps(raw):
        raise MalformedPolicy('Policy variables need "Version": "2012-10-17"')
    statements = tuple(_statement(s, bucket) for s in raw)
    sids = [s.sid for s in statements if s.sid]
    if len(sids) != len(set(sids)):
        raise MalformedPolicy("Statement IDs (SID) must be unique")
    has_deny = any(not s.allow for s in statements)
    allows_all = not has_deny and any(
        s.allow
        and s.all_resources
        and not s.conditions
        and s.principals is None
        and len(s.actions) == len(ACTIONS)
        for s in statements
    )
    document = text.decode() if isinstance(text, bytes) else text
    timed = any(s.timed for s in statements)
    return CompiledPolicy(statements, has_deny, allows_all, document, timed)


def _statement(raw: Any, bucket: str | None) -> Statement:
    if not isinstance(raw, dict):
        raise MalformedPolicy("Each Statement must be a JSON object")
    unknown = set(raw) - _STATEMENT_FIELDS
    if unknown:
        raise MalformedPolicy(f"Statement has an unknown field {sorted(unknown)[0]}")
    sid = raw.get("Sid", "")
    if not isinstance(sid, str):
        raise MalformedPolicy("Sid must be a string")
    effect = raw.get("Effect")
    if effect not in ("Allow", "Deny"):
        raise MalformedPolicy("Invalid effect: Effect must be Allow or Deny")
    actions = _actions(raw)
    resources, not_resource, all_resources, templates = _resources(raw, bucket)
    principals: frozenset[str] | None = None
    if bucket is not None:
        if "Principal" not in raw:
            raise MalformedPolicy("Missing required field Principal")
        principals = _principals(raw["Principal"])
    elif "Principal" in raw:
        raise MalformedPolicy("Policy document should not specify a principal.")
    conditions = _conditions(raw.get("Condition", {}))
    written = raw["NotResource" if not_resource else "Resource"]
    patterns = tuple(p[len(S3_ARN) :] if p != "*" else "*" for p in _strings(written, "Resource"))
    return Statement(
        sid=sid,
        allow=effect == "Allow",
        actions=actions,
        resources=resources,
        not_resource=not_resource,
        conditions=conditions,
        principals=principals,
        all_resources=all_resources,
        patterns=patterns,
        templates=templates,
        variables=any(templates) or any(any(c.templates) for c in conditions),
        timed=any(c.key in TIME_KEYS for c in conditions),
    )


def _strings(value: Any, what: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise MalformedPolicy(f"{what} must be a string or a non-empty list of strings")
    return value


def _actions(raw: Mapping[str, Any]) -> frozenset[str]:
    if ("Action" in raw) == ("NotAction" in raw):
        raise MalformedPolicy("Each statement must have exactly one of Action or NotAction")
    negated = "NotAction" in raw
    covered: set[str] = set()
    for pattern in _strings(raw["NotAction" if negated else "Action"], "Action"):
        if pattern == "*":
            covered.update(ACTIONS)
            continue
        service, colon, name = pattern.partition(":")
        if not colon or service.lower() != "s3" or not name:
            raise MalformedPolicy(f"Policy has invalid action: {pattern}")
        if "*" in name or "?" in name:
            match = wildcard(pattern.lower())
            found = [a for a in ACTIONS if match(a.lower())]
        else:
            exact = BY_LOWER.get(pattern.lower())
            found = [exact] if exact else []
        if not found:
            raise MalformedPolicy(f"Policy has invalid action: {pattern}")
        covered.update(found)
    return frozenset(ACTIONS) - covered if negated else frozenset(covered)


def _resources(
    raw: Mapping[str, Any], bucket: str | None
) -> tuple[tuple[Matcher, ...], bool, bool, tuple[Template | None, ...]]:
    if ("Resource" in raw) == ("NotResource" in raw):
        raise MalformedPolicy("Each statement must have exactly one of Resource or NotResource")
    negated = "NotResource" in raw
    patterns = _strings(raw["NotResource" if negated else "Resource"], "Resource")
    for pattern in patterns:
        if pattern == "*":
            if bucket is not None:
                raise MalformedPolicy(
                    f"Policy has invalid resource: {pattern} (a bucket policy's resources"
                    f" are within {S3_ARN}{bucket})"
                )
            continue
        if not pattern.startswith(S3_ARN) or len(pattern) == len(S3_ARN):
            raise MalformedPolicy(f"Policy has invalid resource: {pattern}")
        if bucket is not None:
            named = pattern[len(S3_ARN) :].split("/", 1)[0]
            if not wildcard(named)(bucket):
                raise MalformedPolicy(
                    f"Policy has invalid resource: {pattern} (not within {S3_ARN}{bucket})"
                )
    everything = not negated and "*" in patterns
    templates = tuple(_template(p, "Resource") for p in patterns)
    return tuple(wildcard(p) for p in patterns), negated, everything, templates


def _principals(raw: Any) -> frozenset[str]:
    if raw == "*":
        return frozenset({ANONYMOUS})
    if not isinstance(raw, dict) or set(raw) != {"AWS"}:
        raise MalformedPolicy('Invalid principal in policy: use "*" or {"AWS": [...]}')
    names: set[str] = set()
    for value in _strings(raw["AWS"], "Principal"):
        if value == "*":
            names.add(ANONYMOUS)
            continue
        m = _USER_ARN.fullmatch(value)
        if m is None:
            raise MalformedPolicy(
                f"Invalid principal in policy: {value} (name users as arn:aws:iam:::user/NAME)"
            )
        names.add(m.group(1))
    return frozenset(names)


def _conditions(raw: Any) -> tuple[Condition, ...]:
    if not isinstance(raw, dict):
        raise MalformedPolicy("Condition must be a JSON object")
    found = []
    for operator, block in raw.items():
        if_exists = operator.endswith("IfExists")
        base = operator[: -len("IfExists")] if if_exists else operator
        if base != "Null" and base not in _OPERATORS and base not in _ORDERED:
            raise MalformedPolicy(f"Invalid Condition type: {operator}")
        if not isinstance(block, dict) or not block:
            raise MalformedPolicy(f"Condition {operator} must map keys to values")
        for key, value in block.items():
            if not isinstance(key, str) or _CONDITION_KEY.fullmatch(key) is None:
                raise MalformedPolicy(f"Invalid Condition key: {key}")
            if key.lower() not in KNOWN_KEYS and key.lower() not in TIME_KEYS:
                raise MalformedPolicy(
                    f"The gateway cannot evaluate the condition key {key}: it knows "
                    + ", ".join(sorted(KNOWN_KEYS | TIME_KEYS))
                )
            if base in _ORDERED:
                found.append(_ordered(operator, base, key, value, if_exists))
                continue
            if key.lower() in TIME_KEYS and base != "Null":
                raise MalformedPolicy(
                    f"{key} is compared with the Date operators (DateLessThan, ...), not {operator}"
                )
            if isinstance(value, bool):
                value = "true" if value else "false"
            elif isinstance(value, list):
                value = ["true" if v is True else "false" if v is False else v for v in value]
            values = tuple(_strings(value, f"Condition {operator} {key}"))
            if base == "Null":
                if any(v.lower() not in ("true", "false") for v in values):
                    raise MalformedPolicy(f"Invalid Condition value for Null: {values}")
                found.append(Condition(operator, key.lower(), values, _bool, False, False, True))
                continue
            test, negated = _OPERATORS[base]
            templates = tuple(_template(v, f"Condition {operator} {key}") for v in values)
            if any(templates) and test not in _TEXT_TESTS:
                raise MalformedPolicy(f"Policy variables are for string conditions: {operator}")
            if test is _ip_address:
                for v in values:
                    try:
                        ipaddress.ip_network(v, strict=False)
                    except ValueError:
                        raise MalformedPolicy(f"Invalid IP address in {operator}: {v}") from None
            if test is _bool and any(v.lower() not in ("true", "false") for v in values):
                raise MalformedPolicy(f"Invalid Condition value for Bool: {values}")
            found.append(
                Condition(operator, key.lower(), values, test, negated, if_exists, False, templates)
            )
    return tuple(found)


def _ordered(operator: str, base: str, key: str, value: Any, if_exists: bool) -> Condition:
    """A Date or Numeric condition: on the request's time alone, the only date or number the
    gateway knows of a request (aws:CurrentTime and aws:EpochTime for Date, aws:EpochTime for
    Numeric), with every value read now: one that is not a date (or number) is refused."""
    date = base.startswith("Date")
    comparison = base[len("Date") :] if date else base[len("Numeric") :]
    lower = key.lower()
    keys = TIME_KEYS if date else {dates.EPOCH_TIME}
    if lower not in keys:
        known = " and ".join(sorted(keys))
        raise MalformedPolicy(f"{operator} compares {known} only, not {key}")
    # JSON numbers are numbers' (and epoch seconds') text, as AWS takes them.
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = json.dumps(value)
    elif isinstance(value, list):
        value = [
            json.dumps(v) if isinstance(v, int | float) and not isinstance(v, bool) else v
            for v in value
        ]
    values = tuple(_strings(value, f"Condition {operator} {key}"))
    parse = dates.instant if date else dates.number
    bounds = []
    for v in values:
        if "${" in v:
            raise MalformedPolicy(f"Policy variables are for string conditions: {operator}")
        parsed = parse(v)
        if parsed is None:
            said = "an ISO 8601 date or time, or epoch seconds" if date else "a number"
            raise MalformedPolicy(f"Invalid Condition value for {operator}: {v!r} is not {said}")
        bounds.append(parsed)
    compare, negated = dates.COMPARISONS[comparison]
    test = dates.Ordered(compare, tuple(bounds), parse)
    return Condition(operator, lower, values, test, negated, if_exists)
