# ruff: noqa: E501
"""gateway/iam: the policy grammar (strict), IAM wildcards, conditions and AWS's evaluation
order (explicit Deny, then Allow or ownership, else deny)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.iam import (
    ANONYMOUS,
    BUILTIN,
    MalformedPolicy,
    RequestContext,
    builtin_document,
    compile_policy,
    is_allowed,
    user_arn,
    wildcard,
)
from gateway.iam.actions import ACTIONS


def doc(*statements: dict[str, Any]) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": list(statements)})


def ctx(action: str, resource: str, **values: str) -> RequestContext:
    return RequestContext(action, resource, {k.replace("_", ":", 1): v for k, v in values.items()})


def allowed(policy: str, action: str, resource: str, **values: str) -> bool:
    return is_allowed([compile_policy(policy)], (), False, ctx(action, resource, **values))


# -- wildcards


@pytest.mark.parametrize(
    ("pattern", "value", "expected"),
    [
        ("arn:aws:s3:::b/*", "arn:aws:s3:::b/a/b/c", True),  # * crosses '/'
        ("arn:aws:s3:::b/a?c", "arn:aws:s3:::b/abc", True),
        ("arn:aws:s3:::b/a?c", "arn:aws:s3:::b/ac", False),
        ("arn:aws:s3:::b/a?c", "arn:aws:s3:::b/a/c", True),  # ? matches '/' too
        ("arn:aws:s3:::b", "arn:aws:s3:::b/x", False),  # whole value
        ("arn:aws:s3:::b/[ab]", "arn:aws:s3:::b/a", False),  # no fnmatch classes
        ("arn:aws:s3:::b/[ab]", "arn:aws:s3:::b/[ab]", True),
        ("arn:aws:s3:::b/a.c", "arn:aws:s3:::b/abc", False),  # '.' literal
        ("arn:aws:s3:::b/x*y*z", "arn:aws:s3:::b/x1y2\nz", True),
        ("arn:aws:s3:::B/*", "arn:aws:s3:::b/k", False),  # case-sensitive
        ("*", "anything at all", True),
    ],
)
def test_wildcards_are_iams(pattern: str, value: str, expected: bool) -> None:
    assert wildcard(pattern)(value) is expected


def test_wildcard_ignoring_case() -> None:
    assert wildcard("s3:get*", ignore_case=True)("S3:GetObject")
    assert wildcard("s3:getobject", ignore_case=True)("S3:GETOBJECT")


# -- actions


def test_action_wildcards_and_case() -> None:
    p = doc({"Effect": "Allow", "Action": "S3:get*", "Resource": "*"})
    assert allowed(p, "s3:GetObject", "arn:aws:s3:::b/k")
    assert allowed(p, "s3:GetBucketPolicy", "arn:aws:s3:::b")
    assert not allowed(p, "s3:PutObject", "arn:aws:s3:::b/k")
    q = doc({"Effect": "Allow", "Action": ["s3:*Object"], "Resource": "*"})
    assert allowed(q, "s3:DeleteObject", "arn:aws:s3:::b/k")
    assert not allowed(q, "s3:ListBucket", "arn:aws:s3:::b")
    star = doc({"Effect": "Allow", "Action": "*", "Resource": "*"})
    assert all(allowed(star, a, "arn:aws:s3:::b") for a in ACTIONS)


def test_not_action_covers_every_other_action() -> None:
    p = doc({"Effect": "Allow", "NotAction": ["s3:Delete*", "s3:Put*"], "Resource": "*"})
    assert allowed(p, "s3:GetObject", "arn:aws:s3:::b/k")
    assert allowed(p, "s3:ListBucket", "arn:aws:s3:::b")
    assert not allowed(p, "s3:PutObject", "arn:aws:s3:::b/k")
    assert not allowed(p, "s3:DeleteBucket", "arn:aws:s3:::b")


# -- resources


def test_bucket_and_prefix_resources() -> None:
    p = doc(
        {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::data/train/*"},
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::data"},
    )
    assert allowed(p, "s3:GetObject", "arn:aws:s3:::data/train/a/b.bin")
    assert not allowed(p, "s3:GetObject", "arn:aws:s3:::data/test/a.bin")
    assert not allowed(p, "s3:GetObject", "arn:aws:s3:::data2/train/a.bin")
    assert allowed(p, "s3:ListBucket", "arn:aws:s3:::data")
    assert not allowed(p, "s3:ListBucket", "arn:aws:s3:::other")


def test_not_resource() -> None:
    p = doc(
        {"Effect": "Allow", "Action": "s3:*", "Resource": "*"},
        {"Effect": "Deny", "Action": "s3:*", "NotResource": ["arn:aws:s3:::pub", "arn:aws:s3:::pub/*"]},
    )  # fmt: skip
    assert allowed(p, "s3:GetObject", "arn:aws:s3:::pub/k")
    assert not allowed(p, "s3:GetObject", "arn:aws:s3:::priv/k")
    only = doc({"Effect": "Allow", "Action": "s3:GetObject", "NotResource": "arn:aws:s3:::x/*"})
    assert allowed(only, "s3:GetObject", "arn:aws:s3:::y/k")
    assert not allowed(only, "s3:GetObject", "arn:aws:s3:::x/k")


# -- conditions


def test_prefix_condition_limits_listing() -> None:
    p = doc(
        {
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": "arn:aws:s3:::data",
            "Condition": {"StringLike": {"s3:prefix": ["team-a/*", "team-a"]}},
        }
    )
    assert allowed(p, "s3:ListBucket", "arn:aws:s3:::data", s3_prefix="team-a/x/")
    assert allowed(p, "s3:ListBucket", "arn:aws:s3:::data", s3_prefix="team-a")
    assert not allowed(p, "s3:ListBucket", "arn:aws:s3:::data", s3_prefix="team-b/")
    assert not allowed(p, "s3:ListBucket", "arn:aws:s3:::data", s3_prefix="")
    assert not allowed(p, "s3:ListBucket", "arn:aws:s3:::data")  # no such key: no match
    eq = doc(
        {
            "Effect": "Allow", "Action": "s3:ListBucket", "Resource": "*",
            "Condition": {"StringEquals": {"S3:Prefix": ""}},
        }
    )  # fmt: skip
    assert allowed(eq, "s3:ListBucket", "arn:aws:s3:::data", s3_prefix="")
    assert not allowed(eq, "s3:ListBucket", "arn:aws:s3:::data", s3_prefix="a")


def test_source_ip_conditions() -> None:
    p = doc(
        {
            "Effect": "Allow", "Action": "s3:GetObject", "Resource": "*",
            "Condition": {"IpAddress": {"aws:SourceIp": ["10.0.0.0/8", "2001:db8::/32"]}},
        }
    )  # fmt: skip
    assert allowed(p, "s3:GetObject", "arn:aws:s3:::b/k", aws_sourceip="10.1.2.3")
    assert allowed(p, "s3:GetObject", "arn:aws:s3:::b/k", aws_sourceip="2001:db8::5")
    assert not allowed(p, "s3:GetObject", "arn:aws:s3:::b/k", aws_sourceip="192.168.1.1")
    assert not allowed(p, "s3:GetObject", "arn:aws:s3:::b/k", aws_sourceip="not an ip")
    deny = doc(
        {"Effect": "Allow", "Action": "s3:*", "Resource": "*"},
        {
            "Effect": "Deny", "Action": "s3:*", "Resource": "*",
            "Condition": {"NotIpAddress": {"aws:SourceIp": "127.0.0.1/32"}},
        },
    )  # fmt: skip
    assert allowed(deny, "s3:PutObject", "arn:aws:s3:::b/k", aws_sourceip="127.0.0.1")
    assert not allowed(deny, "s3:PutObject", "arn:aws:s3:::b/k", aws_sourceip="127.0.0.2")


def test_missing_keys_negated_operators_and_if_exists() -> None:
    def one(condition: dict[str, Any]) -> str:
        return doc({"Effect": "Allow", "Action": "s3:*", "Resource": "*", "Condition": condition})

    r = ("s3:ListBucket", "arn:aws:s3:::b")
    assert allowed(one({"StringNotEquals": {"s3:prefix": "x"}}), *r)  # absent: holds
    assert not allowed(one({"StringNotEquals": {"s3:prefix": "x"}}), *r, s3_prefix="x")
    assert allowed(one({"StringLikeIfExists": {"s3:prefix": "a*"}}), *r)
    assert not allowed(one({"StringLikeIfExists": {"s3:prefix": "a*"}}), *r, s3_prefix="b")
    assert allowed(one({"Null": {"s3:prefix": "true"}}), *r)
    assert not allowed(one({"Null": {"s3:prefix": "true"}}), *r, s3_prefix="")
    assert allowed(one({"StringEqualsIgnoreCase": {"s3:prefix": "AB"}}), *r, s3_prefix="ab")
    # Two keys (or operators): all must hold; values of one key: any.
    both = one({"StringEquals": {"s3:prefix": ["a", "b"], "s3:delimiter": "/"}})
    assert allowed(both, *r, s3_prefix="b", s3_delimiter="/")
    assert not allowed(both, *r, s3_prefix="b")
    assert allowed(one({"Bool": {"aws:SecureTransport": False}}), *r, aws_securetransport="false")


# -- evaluation order


def test_explicit_deny_wins_over_any_allow_and_ownership() -> None:
    allow = compile_policy(doc({"Effect": "Allow", "Action": "s3:*", "Resource": "*"}))
    deny = compile_policy(
        doc({"Effect": "Deny", "Action": "s3:DeleteObject", "Resource": "arn:aws:s3:::b/keep/*"})
    )
    c = ctx("s3:DeleteObject", "arn:aws:s3:::b/keep/x")
    assert not is_allowed([allow, deny], (), True, c)
    assert not is_allowed([deny, allow], (), True, c)
    assert is_allowed([allow, deny], (), True, ctx("s3:DeleteObject", "arn:aws:s3:::b/tmp/x"))
    bucket = compile_policy(
        doc({"Effect": "Deny", "Principal": "*", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/secret*"}),
        bucket="b",
    )  # fmt: skip
    assert not is_allowed(
        [allow], bucket.statements, True, ctx("s3:GetObject", "arn:aws:s3:::b/secret.txt")
    )
    assert is_allowed([allow], bucket.statements, True, ctx("s3:GetObject", "arn:aws:s3:::b/public.txt"))  # fmt: skip


def test_nothing_matching_is_denied_and_ownership_alone_allows() -> None:
    c = ctx("s3:PutObject", "arn:aws:s3:::b/k")
    assert not is_allowed([], (), False, c)
    assert is_allowed([], (), True, c)
    own = compile_policy(builtin_document("own") or "")
    assert not is_allowed([own], (), False, c)
    assert is_allowed([own], (), False, ctx("s3:CreateBucket", "arn:aws:s3:::new"))


def test_bucket_policy_allows_a_named_user_or_anyone() -> None:
    p = compile_policy(
        doc(
            {"Effect": "Allow", "Principal": {"AWS": [user_arn("job")]}, "Action": ["s3:GetObject"], "Resource": "arn:aws:s3:::b/*"},
            {"Effect": "Allow", "Principal": "*", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::b"},
        ),
        bucket="b",
    )  # fmt: skip
    assert p.statements[0].principals == frozenset({"job"})
    assert p.statements[1].principals == frozenset({ANONYMOUS})
    assert compile_policy(
        doc({"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "s3:*", "Resource": "arn:aws:s3:::b/*"}),
        bucket="b",
    ).statements[0].principals == frozenset({ANONYMOUS})  # fmt: skip


# -- built-ins


def test_builtin_policies() -> None:
    assert set(BUILTIN) == {"own", "readonly", "readwrite", "admin"}
    admin = compile_policy(builtin_document("admin") or "")
    assert admin.allows_all
    ro = compile_policy(builtin_document("readonly") or "")
    assert not ro.allows_all
    for action, expected in [
        ("s3:GetObject", True), ("s3:ListBucket", True), ("s3:ListAllMyBuckets", True),
        ("s3:PutObject", False), ("s3:DeleteObject", False), ("s3:DeleteBucket", False),
    ]:  # fmt: skip
        assert is_allowed([ro], (), False, ctx(action, "arn:aws:s3:::b/k")) is expected
    rw = compile_policy(builtin_document("readwrite") or "")
    for action, expected in [
        ("s3:GetObject", True), ("s3:PutObject", True), ("s3:DeleteObject", True),
        ("s3:DeleteBucket", False), ("s3:PutBucketPolicy", False),
    ]:  # fmt: skip
        assert is_allowed([rw], (), False, ctx(action, "arn:aws:s3:::b/k")) is expected


# -- strict parsing


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("not json", "valid JSON"),
        ("[]", "first byte"),
        ('{"Version": "2012-10-17"}', "Statement"),
        ('{"Version": "2020-01-01", "Statement": []}', "Version"),
        ('{"Statement": [], "Extra": 1}', "Unknown field"),
        (doc({"Effect": "Maybe", "Action": "s3:*", "Resource": "*"}), "Effect"),
        (doc({"Effect": "Allow", "Resource": "*"}), "Action or NotAction"),
        (doc({"Effect": "Allow", "Action": "s3:*", "NotAction": "s3:Get*", "Resource": "*"}), "Action or NotAction"),
        (doc({"Effect": "Allow", "Action": "s3:*"}), "Resource or NotResource"),
        (doc({"Effect": "Allow", "Action": "s3:Fly", "Resource": "*"}), "invalid action"),
        (doc({"Effect": "Allow", "Action": "s3:Fly*", "Resource": "*"}), "invalid action"),
        (doc({"Effect": "Allow", "Action": "ec2:RunInstances", "Resource": "*"}), "invalid action"),
        (doc({"Effect": "Allow", "Action": [], "Resource": "*"}), "non-empty list"),
        (doc({"Effect": "Allow", "Action": "s3:*", "Resource": "arn:aws:sqs:::q"}), "invalid resource"),
        (doc({"Effect": "Allow", "Action": "s3:*", "Resource": "*", "Principal": "*"}), "principal"),
        (doc({"Effect": "Allow", "Action": "s3:*", "Resource": "*", "Condition": {"StringSounds": {"s3:prefix": "a"}}}), "Condition type"),
        (doc({"Effect": "Allow", "Action": "s3:*", "Resource": "*", "Condition": {"StringLike": {"prefix": "a"}}}), "Condition key"),
        (doc({"Effect": "Allow", "Action": "s3:*", "Resource": "*", "Condition": {"IpAddress": {"aws:SourceIp": "10.0.0.300/8"}}}), "IP address"),
        (doc({"Effect": "Allow", "Action": "s3:*", "Resource": "*", "Bogus": 1}), "unknown field"),
        (doc({"Sid": "a", "Effect": "Allow", "Action": "s3:*", "Resource": "*"}, {"Sid": "a", "Effect": "Deny", "Action": "s3:*", "Resource": "*"}), "unique"),
    ],
)  # fmt: skip
def test_malformed_identity_policies_say_why(text: str, reason: str) -> None:
    with pytest.raises(MalformedPolicy, match=reason):
        compile_policy(text)


@pytest.mark.parametrize(
    ("statement", "reason"),
    [
        ({"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/*"}, "Principal"),
        ({"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::other/*"}, "invalid resource"),
        ({"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "Resource": "*"}, "invalid resource"),
        ({"Effect": "Allow", "Principal": {"AWS": "alice"}, "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/*"}, "principal"),
        ({"Effect": "Allow", "Principal": {"CanonicalUser": "x"}, "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/*"}, "principal"),
    ],
)  # fmt: skip
def test_malformed_bucket_policies_say_why(statement: dict[str, Any], reason: str) -> None:
    with pytest.raises(MalformedPolicy, match=reason):
        compile_policy(doc(statement), bucket="b")


def test_a_bucket_policy_may_name_its_bucket_with_wildcards() -> None:
    p = doc({"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b*/x/*"})  # fmt: skip
    assert compile_policy(p, bucket="bucket").statements
    single = json.dumps({"Statement": {"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/*"}})  # fmt: skip
    assert len(compile_policy(single, bucket="b").statements) == 1
