"""S3 semantics clients rely on, tried with boto3 against a `gateway serve` subprocess over a
file bucket store (buckets made by CreateBucket) and an S3 mount (moto): batch deletes that
answer per key what they did and never serve a deleted key again, conditional writes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.support.gateway import GatewayNode, start_gateway
from tests.support.net import eventually
from tests.support.odd_origin import OddOrigin
from tests.support.origin import CountingProxy, MotoServer

ORIGIN = "origin-semantics"
ODD = "origin-semantics-odd"
MADE = "made-semantics"  # a bucket of the file bucket store


@pytest.fixture(scope="module")
def odd(moto_server: MotoServer) -> Iterator[OddOrigin]:
    proxy = OddOrigin(moto_server.url)
    yield proxy
    proxy.stop()


@pytest.fixture(scope="module")
def node(
    module_dir: Path, origin: CountingProxy, origin_s3: Any, odd: OddOrigin
) -> Iterator[GatewayNode]:
    origin_s3.create_bucket(Bucket=ORIGIN)
    origin_s3.create_bucket(Bucket=ODD)
    buckets = module_dir / "buckets"
    buckets.mkdir()
    # A long metadata TTL: a version the node knows is served without asking the store.
    args = ("--bucket-store", buckets.as_uri(), "--metadata-ttl", "300")
    node = start_gateway(module_dir / "node", args=args)
    opts = ["-o", f"endpoint_url={origin.url}", "-o", "access_key=ak", "-o", "secret_key=sk"]
    node.cli("mount", "add", "s3sem", f"s3://{ORIGIN}/pre", *opts)
    odd_opts = ["-o", f"endpoint_url={odd.url}", "-o", "access_key=ak", "-o", "secret_key=sk"]
    node.cli("mount", "add", "s3odd", f"s3://{ODD}", *odd_opts)
    node.client().create_bucket(Bucket=MADE)
    eventually(lambda: node.buckets() >= {"s3sem", "s3odd", MADE})
    yield node
    node.stop()


@pytest.fixture(params=[MADE, "s3sem"])
def bucket(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _code(exc: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    r = exc.value.response
    return r["Error"]["Code"], r["ResponseMetadata"]["HTTPStatusCode"]


# -- DeleteObjects ------------------------------------------------------------------------------

# Siblings in folders that the delete of the last of them prunes (the file store has no empty
# folders): each delete races its sibling's removal of their common folder.
SIBLINGS = ["boo/bar", "boo/baz/xyzzy", "cquux/thud", "cquux/bla"]


def test_batch_delete_answers_each_key_and_never_serves_a_deleted_key(
    node: GatewayNode, bucket: str
) -> None:
    s3 = node.client()
    for round_ in range(20):
        for key in SIBLINGS:
            s3.put_object(Bucket=bucket, Key=key, Body=f"{key} {round_}".encode())
        for key in SIBLINGS:  # cached, and its version known, before the delete
            assert (
                s3.get_object(Bucket=bucket, Key=key)["Body"].read() == f"{key} {round_}".encode()
            )
        out = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in SIBLINGS]})
        assert out.get("Errors", []) == [], f"round {round_}"
        assert sorted(d["Key"] for d in out["Deleted"]) == sorted(SIBLINGS)
        for key in SIBLINGS:
            with pytest.raises(ClientError) as exc:
                s3.get_object(Bucket=bucket, Key=key)
            assert _code(exc) == ("NoSuchKey", 404), f"round {round_}: {key}"
        assert s3.list_objects_v2(Bucket=bucket).get("KeyCount") == 0


def test_a_delete_the_store_did_but_failed_to_acknowledge_is_never_served_again(
    node: GatewayNode, odd: OddOrigin, origin_s3: Any
) -> None:
    s3 = node.client()
    keys = ["gone/a", "gone/b"]
    for key in keys:
        s3.put_object(Bucket="s3odd", Key=key, Body=b"old bytes")
        assert s3.get_object(Bucket="s3odd", Key=key)["Body"].read() == b"old bytes"
    # The store deletes each key and then answers an error, every time it is asked.
    odd.fail_next("DeleteObject", 500, "InternalError", count=20, forward=True)
    try:
        out = s3.delete_objects(Bucket="s3odd", Delete={"Objects": [{"Key": k} for k in keys]})
    finally:
        odd.reset()
    assert sorted(e["Key"] for e in out["Errors"]) == keys  # it said it failed: no Deleted
    assert "Contents" not in origin_s3.list_objects_v2(Bucket=ODD, Prefix="gone/")
    for key in keys:
        with pytest.raises(ClientError) as exc:
            s3.get_object(Bucket="s3odd", Key=key)
        assert _code(exc) == ("NoSuchKey", 404)
