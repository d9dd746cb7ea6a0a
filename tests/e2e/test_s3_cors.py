"""A bucket's CORS through the gateway: Put/Get/DeleteBucketCors (boto3), the preflight
OPTIONS a browser sends (raw HTTP with httpx, unsigned, as S3 takes it) and the
Access-Control-* headers of actual answers. Against a `gateway serve` subprocess over a
local folder; the configuration lives in the mount's options, so a second node sees it too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from tests.support.gateway import ACCESS_KEY, SECRET_KEY, GatewayNode, start_gateway
from tests.support.net import eventually

RULES: dict[str, Any] = {
    "CORSRules": [
        {
            "ID": "dashboard",
            "AllowedOrigins": ["https://*.example.com"],
            "AllowedMethods": ["GET", "HEAD", "PUT"],
            "AllowedHeaders": ["x-amz-*", "content-type"],
            "ExposeHeaders": ["ETag", "x-amz-request-id"],
            "MaxAgeSeconds": 600,
        },
        {"AllowedOrigins": ["*"], "AllowedMethods": ["GET"]},
    ]
}


@pytest.fixture(scope="module")
def node(module_dir: Path) -> Iterator[GatewayNode]:
    (module_dir / "files").mkdir()
    node = start_gateway(module_dir / "node")
    node.cli("mount", "add", "corsb", (module_dir / "files").as_uri())
    node.cli("mount", "add", "plainb", (module_dir / "files").as_uri())
    eventually(lambda: node.buckets() >= {"corsb", "plainb"})
    node.client().put_bucket_cors(Bucket="corsb", CORSConfiguration=RULES)
    node.client().put_object(Bucket="corsb", Key="o.txt", Body=b"hello")
    yield node
    node.stop()


def preflight(node: GatewayNode, path: str, origin: str | None, method: str | None,
              headers: str | None = None) -> httpx.Response:  # fmt: skip
    h = {}
    if origin is not None:
        h["Origin"] = origin
    if method is not None:
        h["Access-Control-Request-Method"] = method
    if headers is not None:
        h["Access-Control-Request-Headers"] = headers
    return httpx.options(f"{node.url}{path}", headers=h)


def test_get_put_delete_bucket_cors(node: GatewayNode) -> None:
    s3 = node.client()
    got = s3.get_bucket_cors(Bucket="corsb")["CORSRules"]
    assert got[0] == RULES["CORSRules"][0]
    assert got[1] == RULES["CORSRules"][1]
    with pytest.raises(ClientError) as exc:
        s3.get_bucket_cors(Bucket="plainb")
    err = exc.value.response
    assert (err["ResponseMetadata"]["HTTPStatusCode"], err["Error"]["Code"]) == (
        404, "NoSuchCORSConfiguration",
    )  # fmt: skip
    s3.put_bucket_cors(Bucket="plainb", CORSConfiguration={"CORSRules": [RULES["CORSRules"][1]]})
    assert len(s3.get_bucket_cors(Bucket="plainb")["CORSRules"]) == 1
    s3.delete_bucket_cors(Bucket="plainb")
    with pytest.raises(ClientError):
        s3.get_bucket_cors(Bucket="plainb")
    assert preflight(node, "/plainb/o.txt", "https://a.example.com", "GET").status_code == 403


@pytest.mark.parametrize(
    ("rules", "code"),
    [
        ({"AllowedOrigins": ["*"], "AllowedMethods": ["PATCH"]}, "InvalidRequest"),
        ({"AllowedOrigins": ["https://*.*.com"], "AllowedMethods": ["GET"]}, "InvalidRequest"),
    ],
    ids=["method", "two-wildcards"],
)
def test_bad_configurations_are_refused(
    node: GatewayNode, rules: dict[str, Any], code: str
) -> None:
    with pytest.raises(ClientError) as exc:
        node.client().put_bucket_cors(Bucket="plainb", CORSConfiguration={"CORSRules": [rules]})
    assert exc.value.response["Error"]["Code"] == code


def test_preflight_is_answered_by_the_rules_without_a_signature(node: GatewayNode) -> None:
    r = preflight(
        node, "/corsb/o.txt", "https://app.example.com", "PUT", "X-Amz-Date, Content-Type"
    )
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "https://app.example.com"
    assert r.headers["access-control-allow-methods"] == "GET, HEAD, PUT"
    assert r.headers["access-control-allow-headers"] == "x-amz-date, content-type"
    assert r.headers["access-control-expose-headers"] == "ETag, x-amz-request-id"
    assert r.headers["access-control-max-age"] == "600"
    assert r.headers["access-control-allow-credentials"] == "true"
    assert "x-amz-request-id" in r.headers

    anyone = preflight(node, "/corsb", "https://elsewhere.org", "GET")
    assert (anyone.status_code, anyone.headers["access-control-allow-origin"]) == (200, "*")
    # Not allowed: another method for that origin, a header no rule names, no Origin at all.
    assert preflight(node, "/corsb/o.txt", "https://elsewhere.org", "PUT").status_code == 403
    denied = preflight(node, "/corsb/o.txt", "https://a.example.com", "PUT", "x-custom")
    assert denied.status_code == 403
    assert b"<Code>AccessForbidden</Code>" in denied.content
    assert preflight(node, "/corsb/o.txt", None, "GET").status_code == 400
    assert preflight(node, "/corsb/o.txt", "https://a.example.com", None).status_code == 400
    assert preflight(node, "/nobucket/o", "https://a.example.com", "GET").status_code == 404


def signed_get(node: GatewayNode, path: str, headers: dict[str, str]) -> httpx.Response:
    request = AWSRequest(method="GET", url=node.url + path, headers=headers)
    request.headers["X-Amz-Content-SHA256"] = "UNSIGNED-PAYLOAD"
    auth = S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1")
    auth.payload = lambda request: "UNSIGNED-PAYLOAD"  # type: ignore[method-assign]
    auth.add_auth(request)
    return httpx.get(node.url + path, headers=dict(request.headers.items()))


def test_actual_answers_carry_the_headers_of_the_matching_rule(node: GatewayNode) -> None:
    for _ in range(2):  # a miss, then a hit (which the edge answers only without an Origin)
        r = signed_get(node, "/corsb/o.txt", {"Origin": "https://app.example.com"})
        assert (r.status_code, r.content) == (200, b"hello")
        assert r.headers["access-control-allow-origin"] == "https://app.example.com"
        assert r.headers["access-control-expose-headers"] == "ETag, x-amz-request-id"
        assert r.headers["access-control-allow-credentials"] == "true"
    other = signed_get(node, "/corsb/o.txt", {"Origin": "https://x.org"})
    assert other.headers["access-control-allow-origin"] == "*"  # the second rule
    plain = signed_get(node, "/corsb/o.txt", {})
    assert "access-control-allow-origin" not in plain.headers
    none = signed_get(node, "/plainb/o.txt", {"Origin": "https://app.example.com"})
    assert none.status_code == 200 and "access-control-allow-origin" not in none.headers
    anonymous = httpx.get(f"{node.url}/corsb/o.txt", headers={"Origin": "https://x.org"})
    assert anonymous.status_code == 403  # CORS allows a browser to read, not to skip auth
    assert anonymous.headers["access-control-allow-origin"] == "*"
