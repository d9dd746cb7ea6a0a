"""An S3 origin whose write replies carry an empty ETag, as Ceph RGW 16.2 answers
CompleteMultipartUpload: the gateway records no version the origin did not give.

The origin is moto behind tests/support/odd_origin.OddOrigin, which blanks the ETag (header
and XML) of the replies named; that reproduces RGW 16.2's reply without its 15-60 s start. The
gateway asks the origin (HEAD) before it answers such a write, so HEAD, If-Match and
x-amz-copy-source-if-match see the object's real ETag at once, not after the metadata TTL.
"""

from __future__ import annotations

import io
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from boto3.s3.transfer import TransferConfig

from tests.support.gateway import GatewayNode, start_gateway
from tests.support.net import eventually
from tests.support.odd_origin import OddOrigin
from tests.support.origin import MotoServer

MiB = 1 << 20


@pytest.fixture(scope="module")
def node(module_dir: Path) -> Iterator[GatewayNode]:
    # A long metadata TTL: what a write records is what reads are answered with.
    node = start_gateway(module_dir / "node", args=("--metadata-ttl", "300"))
    yield node
    node.stop()


@pytest.fixture(scope="module")
def rgw(moto_server: MotoServer) -> Iterator[OddOrigin]:
    proxy = OddOrigin(moto_server.url)
    proxy.blank_etags("PutObject", "CompleteMultipartUpload", "CopyObject")
    yield proxy
    proxy.stop()


@pytest.fixture
def mounted(node: GatewayNode, rgw: OddOrigin, origin_s3: Any) -> tuple[str, str]:
    """(gateway bucket, origin bucket)."""
    origin = f"o{uuid.uuid4().hex[:10]}"
    origin_s3.create_bucket(Bucket=origin)
    bucket = f"rgw-{uuid.uuid4().hex[:8]}"
    node.cli(
        "mount", "add", bucket, f"s3://{origin}", "-o", f"endpoint_url={rgw.url}",
        "-o", "access_key=a", "-o", "secret_key=s",
    )  # fmt: skip
    eventually(lambda: node.client().head_bucket(Bucket=bucket))
    return bucket, origin


def _the_real_version_is_served(
    node: GatewayNode, bucket: str, key: str, answered: str, real: str
) -> None:
    s3 = node.client()
    assert answered == real
    assert s3.head_object(Bucket=bucket, Key=key)["ETag"] == real
    assert s3.get_object(Bucket=bucket, Key=key, IfMatch=real)["ETag"] == real
    s3.copy_object(
        Bucket=bucket, Key=f"{key}.copy", CopySource={"Bucket": bucket, "Key": key},
        CopySourceIfMatch=real,
    )  # fmt: skip


def test_complete_multipart_upload_answered_with_an_empty_etag(
    node: GatewayNode, mounted: tuple[str, str], origin_s3: Any
) -> None:
    bucket, origin = mounted
    s3 = node.client()
    data = os.urandom(11 * MiB)
    upload = s3.create_multipart_upload(Bucket=bucket, Key="mp")["UploadId"]
    parts = []
    for number, at in enumerate(range(0, len(data), 6 * MiB), start=1):
        part = s3.upload_part(
            Bucket=bucket, Key="mp", UploadId=upload, PartNumber=number,
            Body=data[at : at + 6 * MiB],
        )  # fmt: skip
        parts.append({"PartNumber": number, "ETag": part["ETag"]})
    done = s3.complete_multipart_upload(
        Bucket=bucket, Key="mp", UploadId=upload, MultipartUpload={"Parts": parts}
    )
    real = origin_s3.head_object(Bucket=origin, Key="mp")["ETag"]
    assert real.endswith('-2"')
    _the_real_version_is_served(node, bucket, "mp", done["ETag"], real)


def test_large_put_sent_as_multipart_answered_with_an_empty_etag(
    node: GatewayNode, mounted: tuple[str, str], origin_s3: Any
) -> None:
    """A PUT over 16 MiB goes to the origin as the gateway's own multipart upload."""
    bucket, origin = mounted
    s3 = node.client()
    cfg = TransferConfig(multipart_threshold=64 * MiB)
    s3.upload_fileobj(io.BytesIO(os.urandom(20 * MiB)), bucket, "large", Config=cfg)
    real = origin_s3.head_object(Bucket=origin, Key="large")["ETag"]
    head = s3.head_object(Bucket=bucket, Key="large")["ETag"]
    _the_real_version_is_served(node, bucket, "large", head, real)


def test_put_and_copy_answered_with_an_empty_etag(
    node: GatewayNode, mounted: tuple[str, str], origin_s3: Any
) -> None:
    bucket, origin = mounted
    s3 = node.client()
    put = s3.put_object(Bucket=bucket, Key="small", Body=b"small object")
    real = origin_s3.head_object(Bucket=origin, Key="small")["ETag"]
    _the_real_version_is_served(node, bucket, "small", put["ETag"], real)
    copied = s3.copy_object(
        Bucket=bucket, Key="copied", CopySource={"Bucket": bucket, "Key": "small"},
        MetadataDirective="REPLACE", Metadata={"k": "v"},
    )  # fmt: skip
    real_copy = origin_s3.head_object(Bucket=origin, Key="copied")["ETag"]
    assert copied["CopyObjectResult"]["ETag"] == real_copy
    assert s3.head_object(Bucket=bucket, Key="copied")["ETag"] == real_copy
