"""A node's stores close their clients at shutdown: a node with a bucket store and mounts on
S3 (moto), GCS, Azure and HDFS serves reads, has buckets made and deleted and mounts removed
(whose stores it keeps open a while for requests still reading them), gets SIGTERM, ends by
itself, and its log has no "Unclosed" client session or connector."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.e2e.test_s3_stores import _container_uri
from tests.support.gateway import start_gateway
from tests.support.net import eventually
from tests.support.origin import CountingProxy

KINDS = ["s3", "azure", "gcs", "hdfs"]


def test_a_node_stopped_leaves_no_store_client_unclosed(
    tmp_path: Path, origin: CountingProxy, request: pytest.FixtureRequest
) -> None:
    store = f"endpoint_url={origin.url},access_key=ak,secret_key=sk"
    args = ("--bucket-store", "s3://", "--bucket-store-options", store)
    node = start_gateway(tmp_path / "node", args=args)
    try:
        s3 = node.client()
        mounted = []
        for kind in KINDS:
            uri, options = _container_uri(kind, request, tmp_path)
            name = f"{kind}-{uuid.uuid4().hex[:8]}"
            node.cli("mount", "add", name, uri, *[a for o in options for a in ("-o", o)])
            mounted.append(name)
        eventually(lambda: node.buckets() >= set(mounted))
        for name in mounted:
            for i in range(2):
                s3.put_object(Bucket=name, Key=f"k{i}", Body=f"{name} {i}".encode() * 1000)
            for _ in range(2):  # over new connections: each worker serves some
                for i in range(2):
                    got = node.client().get_object(Bucket=name, Key=f"k{i}")["Body"].read()
                    assert got == f"{name} {i}".encode() * 1000
        # Buckets made and deleted, mounts removed: their stores are retired, each kept open
        # for a grace period longer than this test, and must be closed at shutdown all the same.
        for n in range(2):
            bucket = f"made-{uuid.uuid4().hex[:8]}-{n}"
            s3.create_bucket(Bucket=bucket)
            s3.put_object(Bucket=bucket, Key="k", Body=b"v")
            assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"
            s3.delete_object(Bucket=bucket, Key="k")
            s3.delete_bucket(Bucket=bucket)
        for name in mounted[:2]:
            node.cli("mount", "remove", name)
    finally:
        ended = node.stop()
    assert ended, node.log()
    unclosed = [line for line in node.log().splitlines() if "Unclosed" in line]
    assert unclosed == [], "\n".join(unclosed)
