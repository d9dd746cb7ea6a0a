"""`?partNumber=N` on an object uploaded in parts, over a real S3 origin (moto), which says
each part's size on a HEAD ?partNumber=N: the gateway answers the part's bytes as a range of
the object (206 with Content-Range, from its cache like any range) and x-amz-mp-parts-count."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.support.gateway import GatewayNode, start_gateway
from tests.support.net import eventually
from tests.support.origin import CountingProxy

MiB = 1 << 20
ORIGIN = "origin-parts"


@pytest.fixture(scope="module")
def node(module_dir: Path, origin: CountingProxy, origin_s3: Any) -> Iterator[GatewayNode]:
    origin_s3.create_bucket(Bucket=ORIGIN)
    node = start_gateway(module_dir / "node")
    opts = ["-o", f"endpoint_url={origin.url}", "-o", "access_key=ak", "-o", "secret_key=sk"]
    node.cli("mount", "add", "s3p", f"s3://{ORIGIN}/pre", *opts)
    eventually(lambda: "s3p" in node.buckets())
    yield node
    node.stop()


def test_part_number_of_a_multipart_object(node: GatewayNode) -> None:
    s3 = node.client()
    parts = [os.urandom(5 * MiB), os.urandom(6 * MiB), b"tail"]
    up = s3.create_multipart_upload(Bucket="s3p", Key="mp.bin")
    done = []
    for n, data in enumerate(parts, 1):
        r = s3.upload_part(
            Bucket="s3p", Key="mp.bin", UploadId=up["UploadId"], PartNumber=n, Body=data
        )
        done.append({"PartNumber": n, "ETag": r["ETag"]})
    s3.complete_multipart_upload(
        Bucket="s3p", Key="mp.bin", UploadId=up["UploadId"], MultipartUpload={"Parts": done}
    )
    total = sum(map(len, parts))
    start = 0
    for n, data in enumerate(parts, 1):
        got = s3.get_object(Bucket="s3p", Key="mp.bin", PartNumber=n)
        assert got["Body"].read() == data
        assert got["ContentRange"] == f"bytes {start}-{start + len(data) - 1}/{total}"
        assert got["PartsCount"] == 3
        head = s3.head_object(Bucket="s3p", Key="mp.bin", PartNumber=n)
        assert (head["ContentLength"], head["PartsCount"]) == (len(data), 3)
        start += len(data)
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket="s3p", Key="mp.bin", PartNumber=4)
    assert exc.value.response["Error"]["Code"] == "InvalidPartNumber"
