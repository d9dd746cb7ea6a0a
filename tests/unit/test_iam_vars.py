"""Policy variables (${aws:username}, ${aws:userid}, ${aws:SourceIp}, ${*}, ${?}, ${$}) filled in
from the request, and what the gateway cannot evaluate refused: never a literal match."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.iam import MalformedPolicy, RequestContext, compile_policy, is_allowed


def doc(*statements: dict[str, Any], version: str = "2012-10-17") -> str:
    return json.dumps({"Version": version, "Statement": list(statements)})


def allow(resource: str, **more: Any) -> dict[str, Any]:
    return {"Effect": "Allow", "Action": "s3:*", "Resource": resource, **more}


def allowed(policy: str, resource: str, action: str = "s3:PutObject", **values: str) -> bool:
    context = {k.replace("_", ":", 1).lower(): v for k, v in values.items()}
    return is_allowed(
        [compile_policy(policy)], (), False, RequestContext(action, resource, context)
    )


HOME = doc(allow("arn:aws:s3:::b/home/${aws:username}/*"))


def test_the_home_folder_policy_is_each_users_own() -> None:
    assert allowed(HOME, "arn:aws:s3:::b/home/alice/a.txt", aws_username="alice")
    assert not allowed(HOME, "arn:aws:s3:::b/home/bob/a.txt", aws_username="alice")
    # Never the variable's text.
    assert not allowed(HOME, "arn:aws:s3:::b/home/${aws:username}/drop.txt", aws_username="bob")
    assert not allowed(HOME, "arn:aws:s3:::b/home/${aws:username}/drop.txt")


def test_a_variable_without_a_value_refuses_an_allow_and_applies_a_deny() -> None:
    assert not allowed(HOME, "arn:aws:s3:::b/home/alice/a.txt")  # anonymous: no username
    deny = doc(
        allow("*"),
        {"Effect": "Deny", "Action": "s3:*", "Resource": "arn:aws:s3:::b/${aws:username}/*"},
    )
    assert not allowed(deny, "arn:aws:s3:::b/x/k")  # no username: the Deny cannot be ruled out
    assert allowed(deny, "arn:aws:s3:::b/x/k", aws_username="alice")
    assert not allowed(deny, "arn:aws:s3:::b/alice/k", aws_username="alice")


def test_a_filled_in_value_is_text_not_a_wildcard() -> None:
    mine = doc(allow("arn:aws:s3:::b/${aws:userid}/*"))
    assert allowed(mine, "arn:aws:s3:::b/17/k", aws_userid="17")
    assert not allowed(mine, "arn:aws:s3:::b/18/k", aws_userid="17")
    assert not allowed(mine, "arn:aws:s3:::b/x/k", aws_userid="*")  # a value's * is text


def test_the_escapes_are_the_characters_themselves() -> None:
    star = doc(allow("arn:aws:s3:::b/a${*}b"))
    assert allowed(star, "arn:aws:s3:::b/a*b")
    assert not allowed(star, "arn:aws:s3:::b/axxb")
    query = doc(allow("arn:aws:s3:::b/a${?}"))
    assert allowed(query, "arn:aws:s3:::b/a?") and not allowed(query, "arn:aws:s3:::b/ab")
    dollar = doc(allow("arn:aws:s3:::b/${$}{x}"))
    assert allowed(dollar, "arn:aws:s3:::b/${x}")


def test_variables_in_condition_values() -> None:
    own_prefix = doc(
        allow(
            "arn:aws:s3:::b",
            Condition={"StringLike": {"s3:prefix": ["home/${aws:username}/*"]}},
        )
    )
    r = "arn:aws:s3:::b"
    assert allowed(own_prefix, r, "s3:ListBucket", aws_username="alice", s3_prefix="home/alice/x")
    assert not allowed(own_prefix, r, "s3:ListBucket", aws_username="alice", s3_prefix="home/bob/")
    assert not allowed(
        own_prefix, r, "s3:ListBucket", aws_username="alice", s3_prefix="home/${aws:username}/x"
    )
    # A username of '*' is text in the pattern.
    assert not allowed(own_prefix, r, "s3:ListBucket", aws_username="*", s3_prefix="home/bob/")
    from_here = doc(
        allow("*", Condition={"StringEquals": {"aws:username": "${aws:SourceIp}"}}),
    )
    assert allowed(from_here, r, aws_username="10.0.0.1", aws_sourceip="10.0.0.1")
    assert not allowed(from_here, r, aws_username="alice", aws_sourceip="10.0.0.1")
    assert not allowed(from_here, r, aws_username="${aws:SourceIp}")  # no source: refused


@pytest.mark.parametrize(
    "policy",
    [
        doc(allow("arn:aws:s3:::b/${aws:PrincipalTag/team}/*")),  # a variable it cannot fill
        doc(allow("arn:aws:s3:::b/${aws:username/*")),  # unterminated
        doc(allow("arn:aws:s3:::b/home/${aws:username}/*"), version="2008-10-17"),
        doc(allow("*", Condition={"StringEquals": {"aws:PrincipalTag/team": "a"}})),
        doc(allow("*", Condition={"StringNotEquals": {"s3:ExistingObjectTag/team": "a"}})),
        doc(allow("*", Condition={"IpAddress": {"aws:SourceIp": "${aws:username}"}})),
        # A time compared as text is refused (the Date operators: test_policy_dates.py).
        doc(allow("*", Condition={"StringLike": {"aws:CurrentTime": "2026-*"}})),
    ],
)
def test_what_the_gateway_cannot_evaluate_is_refused_when_stored(policy: str) -> None:
    with pytest.raises(MalformedPolicy):
        compile_policy(policy)
