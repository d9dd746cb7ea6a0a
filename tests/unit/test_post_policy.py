"""POST Object's policy documents (gateway/s3/post_object.py), and their signature by
SigV4Verifier.verify_policy against botocore's own signer of browser forms: what parses, what
each kind of condition accepts and refuses, fields no condition names, expiry, and a
signature made with another secret or another day."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.config import Config

from gateway import errors
from gateway.s3.post_object import PostPolicy
from gateway.s3.sigv4 import SigV4Verifier

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def encoded(doc: Any) -> str:
    return base64.b64encode(json.dumps(doc).encode()).decode()


def policy(*conditions: Any, expiration: str = "2026-12-05T13:00:00Z") -> PostPolicy:
    return PostPolicy.parse(encoded({"expiration": expiration, "conditions": list(conditions)}))


def refused(p: PostPolicy, fields: dict[str, str], now: datetime = NOW) -> str:
    with pytest.raises(errors.AccessDenied) as exc:
        p.check(fields, now)
    return exc.value.detail


@pytest.mark.parametrize(
    "text",
    ["not base64!", encoded([1, 2]), encoded({"conditions": []}), encoded({"expiration": "x"}),
     encoded({"expiration": "2026-12-05T13:00:00Z"}),
     encoded({"expiration": "2026-12-05T13:00:00Z", "conditions": [["like", "$key", "a"]]}),
     encoded({"expiration": "2026-12-05T13:00:00Z", "conditions": [["eq", "key", "a"]]}),
     encoded({"expiration": "2026-12-05T13:00:00Z",
              "conditions": [["content-length-range", "a", 1]]})],
)  # fmt: skip
def test_what_is_no_policy_is_an_invalid_policy_document(text: str) -> None:
    with pytest.raises(errors.InvalidPolicyDocument):
        PostPolicy.parse(text)


def test_each_kind_of_condition_holds_or_is_named_when_it_fails() -> None:
    p = policy(
        {"bucket": "forms"}, ["starts-with", "$key", "uploads/"], ["eq", "$Content-Type", "a/b"],
        ["starts-with", "$x-amz-meta-tag", ""], ["content-length-range", 1, 10],
    )  # fmt: skip
    fields = {"bucket": "forms", "key": "uploads/x", "content-type": "a/b", "x-amz-meta-tag": "t"}
    p.check(fields, NOW)
    assert p.length == (1, 10)
    said = refused(p, {**fields, "key": "up/x"})
    assert said.endswith('Policy Condition failed: ["starts-with", "$key", "uploads/"]')
    said = refused(p, {**fields, "content-type": "a/bc"})
    assert said.endswith('Policy Condition failed: ["eq", "$content-type", "a/b"]')
    assert "Condition failed" in refused(p, {**fields, "bucket": "other"})
    missing = dict(fields)
    del missing["content-type"]  # a field the policy names must be there
    assert "Condition failed" in refused(p, missing)


def test_a_field_no_condition_names_is_refused_but_the_exempt_ones() -> None:
    p = policy({"bucket": "forms"}, {"key": "k"})
    exempt = {"policy": "p", "x-amz-signature": "s", "file": "", "x-ignore-me": "1"}
    p.check({"bucket": "forms", "key": "k", **exempt}, NOW)
    said = refused(p, {"bucket": "forms", "key": "k", "acl": "private"})
    assert said == "Invalid according to Policy: Extra input fields: acl"


def test_a_policy_holds_until_its_expiration() -> None:
    p = policy({"key": "k"}, expiration="2026-12-05T12:00:00.000Z")
    p.check({"key": "k"}, NOW)
    late = NOW + timedelta(milliseconds=1)
    assert refused(p, {"key": "k"}, late) == "Invalid according to Policy: Policy expired."


def test_the_signature_is_of_the_policy_by_the_signing_key_of_its_credential() -> None:
    secrets = {"AKID": "the-secret"}
    verifier = SigV4Verifier(secrets.get)
    client = boto3.client(
        "s3", endpoint_url="http://127.0.0.1:9", region_name="us-east-1",
        aws_access_key_id="AKID", aws_secret_access_key="the-secret",
        config=Config(signature_version="s3v4"),
    )  # fmt: skip
    f = client.generate_presigned_post("b", "k")["fields"]  # signed here, nothing sent
    args = (f["x-amz-credential"], f["x-amz-date"], f["policy"], f["x-amz-signature"])
    assert verifier.verify_policy(*args).access_key == "AKID"
    with pytest.raises(errors.SignatureDoesNotMatch):
        verifier.verify_policy(args[0], args[1], encoded({"expiration": "x"}), args[3])
    with pytest.raises(errors.SignatureDoesNotMatch):
        SigV4Verifier({"AKID": "another"}.get).verify_policy(*args)
    with pytest.raises(errors.InvalidAccessKeyId):
        SigV4Verifier({}.get).verify_policy(*args)
    other_day = "20200101" + args[1][8:]
    with pytest.raises(errors.S3Error):  # the credential's date is not X-Amz-Date's
        verifier.verify_policy(args[0], other_day, args[2], args[3])
