"""The operation table: which operation a request is, by target, method and sub-resource."""

from __future__ import annotations

import pytest

from gateway import errors
from gateway.s3.http import S3Request
from gateway.s3.routing import TABLE, route


def request(method: str, path: str, query: dict[str, str] | None = None) -> S3Request:
    bucket, _, key = path.lstrip("/").partition("/")
    qs = "&".join(f"{k}={v}" for k, v in (query or {}).items())
    return S3Request(method, path, qs, {}, query or {}, bucket or None, key or None)


@pytest.mark.parametrize(
    ("method", "path", "query", "name"),
    [
        ("GET", "/", {}, "ListBuckets"),
        ("GET", "/", {"max-buckets": "2", "prefix": "a"}, "ListBuckets"),
        ("GET", "/b", {}, "ListObjects"),
        ("GET", "/b", {"list-type": "2"}, "ListObjectsV2"),
        ("GET", "/b", {"versioning": ""}, "GetBucketVersioning"),
        ("GET", "/b/k", {}, "GetObject"),
        ("GET", "/b/k", {"partNumber": "1"}, "GetObject"),
        ("GET", "/b/k", {"attributes": ""}, "GetObjectAttributes"),
        ("GET", "/b/k", {"uploadId": "u"}, "ListParts"),
        ("HEAD", "/b/k", {}, "HeadObject"),
        ("HEAD", "/b/k", {"partNumber": "2"}, "HeadObject"),
        ("PUT", "/b/k", {}, "PutObject"),
        ("DELETE", "/b", {}, "DeleteBucket"),
    ],
)
def test_requests_route_to_their_operation(
    method: str, path: str, query: dict[str, str], name: str
) -> None:
    assert route(request(method, path, query)).name == name


def test_a_request_with_no_query_is_the_plain_operation_of_its_target() -> None:
    for (target, method), ops in TABLE.items():
        plain = [op for op in ops if op.selector is None]
        path = {"service": "/", "bucket": "/b", "object": "/b/k"}[target]
        if plain:
            assert route(request(method, path)) is plain[0]
        else:
            with pytest.raises(errors.NotImplementedError_):
                route(request(method, path))


def test_a_sub_resource_no_operation_takes_is_not_implemented() -> None:
    with pytest.raises(errors.NotImplementedError_):
        route(request("GET", "/b", {"lifecycle": ""}))


def test_every_operation_is_authorized_as_a_known_iam_action() -> None:
    from gateway.iam.actions import ACTIONS

    for ops in TABLE.values():
        for op in ops:
            assert op.action in ACTIONS, f"{op.name}: {op.action!r} is no IAM action"


def test_bucket_policy_operations_are_routed() -> None:
    for method, name in [
        ("GET", "GetBucketPolicy"), ("PUT", "PutBucketPolicy"), ("DELETE", "DeleteBucketPolicy"),
    ]:  # fmt: skip
        assert route(request(method, "/b", {"policy": ""})).name == name
