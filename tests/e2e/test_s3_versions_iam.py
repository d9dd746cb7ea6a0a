"""Versions and IAM, end to end (docs/tenants.md): every operation that names a version by id
is authorized as its own action (s3:DeleteObjectVersion, s3:GetObjectVersion,
s3:GetObjectVersionTagging, ..., s3:ListBucketVersions), in users' policies and bucket policies
alike, and a DeleteObjects entry or a copy's source that names a version too. Tried with boto3
against a node with the default worker count, an S3 mount of a versioned moto bucket whose
versions are trusted for an hour (so that the edge answers the hits it may, however slow the
machine: a request that names a version must never be one)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.support.gateway import GatewayNode, start_gateway
from tests.support.net import eventually

ORIGIN = "origin-versions-iam"  # versioned; mounted whole as "ivers"
BUCKET = "ivers"
ARN = f"arn:aws:s3:::{BUCKET}"


def _policy(*statements: dict[str, Any]) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": list(statements)})


@pytest.fixture(scope="module")
def node(module_dir: Path, origin: Any, origin_s3: Any) -> Iterator[GatewayNode]:
    origin_s3.create_bucket(Bucket=ORIGIN)
    origin_s3.put_bucket_versioning(Bucket=ORIGIN, VersioningConfiguration={"Status": "Enabled"})
    node = start_gateway(module_dir / "node")
    opts = ["-o", f"endpoint_url={origin.url}", "-o", "access_key=ak", "-o", "secret_key=sk"]
    node.cli("mount", "add", BUCKET, f"s3://{ORIGIN}", *opts, "-o", "metadata_ttl=3600")
    # Deletes and writes, but not of versions named by id.
    node.cli("policies", "create", "deleter", _policy({
        "Effect": "Allow", "Resource": [ARN, f"{ARN}/*"],
        "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:ListBucket"],
    }))  # fmt: skip
    # Reads of everything but a version named by id.
    node.cli("policies", "create", "reader", _policy(
        {"Effect": "Allow", "Action": ["s3:Get*", "s3:List*"], "Resource": [ARN, f"{ARN}/*"]},
        {"Effect": "Deny", "Action": "s3:GetObjectVersion", "Resource": f"{ARN}/*"},
    ))  # fmt: skip
    node.cli("users", "create", "deleter", "--policy", "deleter")
    node.cli("users", "create", "reader", "--policy", "reader")
    node.cli("users", "create", "partner")  # what the bucket policy grants it, no more
    eventually(lambda: BUCKET in node.buckets())
    node.wait_workers()
    yield node
    node.stop()


def _client(node: GatewayNode, user: str) -> Any:
    out = node.cli("keys", "create", "--user", user).stdout
    return node.client(
        out.split("access key:")[1].split()[0], out.split("secret key:")[1].split()[0]
    )


def _code(call: Callable[..., object], **args: Any) -> str:
    """The error code of call(**args) ("OK": none; a HEAD's status, which has no body)."""
    try:
        call(**args)
    except ClientError as exc:
        return str(
            exc.response["Error"]["Code"] or exc.response["ResponseMetadata"]["HTTPStatusCode"]
        )
    return "OK"


def _versions(origin_s3: Any, key: str, *bodies: bytes) -> list[str]:
    return [origin_s3.put_object(Bucket=ORIGIN, Key=key, Body=b)["VersionId"] for b in bodies]


def _held(origin_s3: Any, key: str) -> set[str]:
    """The ids of the origin's versions (not delete markers) of key."""
    listed = origin_s3.list_object_versions(Bucket=ORIGIN, Prefix=key).get("Versions", [])
    return {v["VersionId"] for v in listed if v["Key"] == key}


def test_a_version_is_removed_only_with_s3_delete_object_version(
    node: GatewayNode, origin_s3: Any
) -> None:
    deleter = _client(node, "deleter")
    v1, v2 = _versions(origin_s3, "del/a", b"one", b"two")
    (b1,) = _versions(origin_s3, "del/b", b"b")

    assert _code(deleter.delete_object, Bucket=BUCKET, Key="del/a", VersionId=v1) == (
        "AccessDenied"
    )
    assert _code(deleter.delete_object, Bucket=BUCKET, Key="del/a", VersionId="null") == (
        "AccessDenied"
    )
    out = deleter.delete_objects(Bucket=BUCKET, Delete={"Objects": [
        {"Key": "del/a", "VersionId": v2}, {"Key": "del/b"},
    ]})  # fmt: skip
    assert [(e["Key"], e.get("VersionId"), e["Code"]) for e in out["Errors"]] == [
        ("del/a", v2, "AccessDenied")
    ]
    assert [(d["Key"], d.get("DeleteMarker")) for d in out["Deleted"]] == [("del/b", True)]
    assert _held(origin_s3, "del/a") == {v1, v2} and _held(origin_s3, "del/b") == {b1}
    untag = deleter.delete_object_tagging
    assert _code(untag, Bucket=BUCKET, Key="del/a", VersionId=v1) == "AccessDenied"
    # Without a version id, a delete is s3:DeleteObject: a delete marker at the origin.
    assert deleter.delete_object(Bucket=BUCKET, Key="del/a")["DeleteMarker"] is True
    assert _held(origin_s3, "del/a") == {v1, v2}
    # The admin may remove a version for good.
    node.client().delete_object(Bucket=BUCKET, Key="del/a", VersionId=v1)
    assert _held(origin_s3, "del/a") == {v2}


def test_a_deny_on_s3_get_object_version_stops_every_read_by_id(
    node: GatewayNode, origin_s3: Any
) -> None:
    reader, deleter, admin = _client(node, "reader"), _client(node, "deleter"), node.client()
    key = "get/hot.bin"
    v1, v2 = _versions(origin_s3, key, b"old " * 100, b"new " * 100)
    for _ in range(12):  # hot: known and held by the workers, answered at the edge
        got = reader.get_object(Bucket=BUCKET, Key=key)
        assert got["Body"].read() == b"new " * 100 and got["VersionId"] == v2
        assert reader.head_object(Bucket=BUCKET, Key=key)["VersionId"] == v2
    eventually(lambda: node.metric("gateway_edge_fast_answers") > 0)

    for _ in range(4):
        for version in (v2, v1, "null"):
            get = _code(reader.get_object, Bucket=BUCKET, Key=key, VersionId=version)
            head = _code(reader.head_object, Bucket=BUCKET, Key=key, VersionId=version)
            assert (get, head) == ("AccessDenied", "403"), version
        # A read by id is answered by the full path, never as a hit of the current version.
        assert (
            admin.get_object(Bucket=BUCKET, Key=key, VersionId=v1)["Body"].read() == b"old " * 100
        )
    # Each other operation on a version is its own action, which the reader holds (s3:Get*).
    assert reader.get_object_tagging(Bucket=BUCKET, Key=key, VersionId=v1)["TagSet"] == []
    attrs = reader.get_object_attributes(
        Bucket=BUCKET, Key=key, VersionId=v1, ObjectAttributes=["ObjectSize"]
    )
    assert attrs["ObjectSize"] == 400 and attrs["VersionId"] == v1
    assert reader.list_object_versions(Bucket=BUCKET, Prefix=key)["Versions"]

    # s3:GetObject alone: no versions listed, no version read or copied by id.
    assert _code(deleter.list_object_versions, Bucket=BUCKET) == "AccessDenied"
    assert _code(deleter.get_object, Bucket=BUCKET, Key=key, VersionId=v1) == ("AccessDenied")
    assert _code(deleter.get_object_tagging, Bucket=BUCKET, Key=key, VersionId=v1) == (
        "AccessDenied"
    )
    source = {"Bucket": BUCKET, "Key": key, "VersionId": v1}
    assert _code(deleter.copy_object, Bucket=BUCKET, Key="get/copy", CopySource=source) == (
        "AccessDenied"
    )
    deleter.copy_object(Bucket=BUCKET, Key="get/copy", CopySource={"Bucket": BUCKET, "Key": key})
    assert admin.get_object(Bucket=BUCKET, Key="get/copy")["Body"].read() == b"new " * 100


def test_bucket_policies_grant_the_version_actions_apart(node: GatewayNode, origin_s3: Any) -> None:
    admin, partner = node.client(), _client(node, "partner")
    key = "shared/obj"
    v1, _ = _versions(origin_s3, key, b"first", b"second")
    principal = {"AWS": ["arn:aws:iam:::user/partner"]}
    granted = {"Effect": "Allow", "Principal": principal, "Resource": f"{ARN}/*"}
    admin.put_bucket_policy(
        Bucket=BUCKET, Policy=_policy({**granted, "Action": ["s3:GetObject", "s3:DeleteObject"]})
    )
    try:
        assert partner.get_object(Bucket=BUCKET, Key=key)["Body"].read() == b"second"
        assert _code(partner.get_object, Bucket=BUCKET, Key=key, VersionId=v1) == ("AccessDenied")
        assert _code(partner.delete_object, Bucket=BUCKET, Key=key, VersionId=v1) == (
            "AccessDenied"
        )
        admin.put_bucket_policy(Bucket=BUCKET, Policy=_policy(
            {**granted, "Action": ["s3:GetObjectVersion", "s3:DeleteObjectVersion"]},
        ))  # fmt: skip
        assert partner.get_object(Bucket=BUCKET, Key=key, VersionId=v1)["Body"].read() == b"first"
        assert _code(partner.get_object, Bucket=BUCKET, Key=key) == "AccessDenied"
        partner.delete_object(Bucket=BUCKET, Key=key, VersionId=v1)
        assert v1 not in _held(origin_s3, key)
    finally:
        admin.delete_bucket_policy(Bucket=BUCKET)
