"""Date conditions end to end (docs/tenants.md): a bucket policy that allows a user until a
time still to come lets its GETs through a real node, one whose time has passed refuses them,
at once, the edge's answers of a cached object included."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError

from tests.support.gateway import GatewayNode, start_gateway

BUCKET, KEY = "dated", "report.txt"
BODY = b"quarterly figures " * 50


@pytest.fixture(scope="module")
def node(module_dir: Path) -> Iterator[GatewayNode]:
    buckets = module_dir / "buckets"
    buckets.mkdir()
    args = ("--bucket-store", buckets.as_uri(), "--metadata-ttl", "-1", "--workers", "1")
    node = start_gateway(module_dir / "node", args=args)
    for user in ("owner", "reader"):
        node.cli("users", "create", user)
    yield node
    node.stop()


@pytest.fixture(scope="module")
def owner(node: GatewayNode) -> Any:
    s3 = _client(node, "owner")
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key=KEY, Body=BODY)
    return s3


def _client(node: GatewayNode, user: str) -> Any:
    out = node.cli("keys", "create", "--user", user).stdout
    return node.client(
        out.split("access key:")[1].split()[0], out.split("secret key:")[1].split()[0]
    )


def _code(call: Callable[[], object]) -> str:
    try:
        call()
    except ClientError as exc:
        return str(exc.response["Error"]["Code"])
    return "OK"


def _until(moment: str) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": [{
        "Sid": "ReaderUntil", "Effect": "Allow",
        "Principal": {"AWS": ["arn:aws:iam:::user/reader"]},
        "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{BUCKET}/*",
        "Condition": {"DateLessThan": {"aws:CurrentTime": moment}},
    }]})  # fmt: skip


def test_date_less_than_the_current_time_allows_until_then_and_refuses_after(
    node: GatewayNode, owner: Any
) -> None:
    reader = _client(node, "reader")
    get = lambda: reader.get_object(Bucket=BUCKET, Key=KEY)["Body"].read()  # noqa: E731
    assert _code(get) == "AccessDenied"

    owner.put_bucket_policy(Bucket=BUCKET, Policy=_until("2100-01-01T00:00:00Z"))
    assert json.loads(owner.get_bucket_policy(Bucket=BUCKET)["Policy"]) == json.loads(
        _until("2100-01-01T00:00:00Z")
    )
    url = reader.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": KEY})
    for _ in range(3):  # read, then cached: the edge's hits decide as the full path does
        assert get() == BODY
        assert httpx.get(url).content == BODY

    # An offset is the same instant in another zone; a time past is a refusal, at once.
    owner.put_bucket_policy(Bucket=BUCKET, Policy=_until("2000-01-01T01:00:00+01:00"))
    assert _code(get) == "AccessDenied"
    assert httpx.get(url).status_code == 403
    assert owner.get_object(Bucket=BUCKET, Key=KEY)["Body"].read() == BODY  # the owner's own

    # Epoch seconds are a time too (4102444800: 2100-01-01T00:00:00Z).
    owner.put_bucket_policy(Bucket=BUCKET, Policy=_until("4102444800"))
    assert get() == BODY


def test_a_date_the_gateway_cannot_read_is_refused_when_stored(owner: Any) -> None:
    with pytest.raises(ClientError) as refused:
        owner.put_bucket_policy(Bucket=BUCKET, Policy=_until("2100-01-01T00:00:00"))  # no zone
    assert refused.value.response["Error"]["Code"] == "MalformedPolicy"
    assert "ISO 8601" in refused.value.response["Error"]["Message"]
