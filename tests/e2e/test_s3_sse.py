"""Server-side encryption through the gateway: never a request that asks for encryption
answered 200 with the object kept in plaintext. SSE-S3 and SSE-KMS go to an S3 origin (moto)
and come back on GET and HEAD; SSE-C objects go to the origin with the client's key, are
never cached, and are never served without that key (moto itself would serve them: the
gateway refuses on its own); stores that cannot encrypt answer S3's errors."""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.support.gateway import GatewayNode, start_gateway
from tests.support.net import eventually
from tests.support.origin import CountingProxy

ORIGIN = "origin-sse"


@pytest.fixture(scope="module")
def node(module_dir: Path, origin: CountingProxy, origin_s3: Any) -> Iterator[GatewayNode]:
    origin_s3.create_bucket(Bucket=ORIGIN)
    (module_dir / "files").mkdir()
    node = start_gateway(module_dir / "node")
    opts = ["-o", f"endpoint_url={origin.url}", "-o", "access_key=ak", "-o", "secret_key=sk"]
    node.cli("mount", "add", "s3e", f"s3://{ORIGIN}/pre", *opts)
    node.cli("mount", "add", "filee", (module_dir / "files").as_uri())
    eventually(lambda: node.buckets() >= {"s3e", "filee"})
    yield node
    node.stop()


def code(exc: pytest.ExceptionInfo[ClientError]) -> tuple[int, str]:
    err = exc.value.response
    return err["ResponseMetadata"]["HTTPStatusCode"], err["Error"]["Code"]


def customer(key: bytes) -> dict[str, Any]:
    return {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": key}


def test_sse_s3_and_kms_reach_the_origin_and_come_back(node: GatewayNode, origin_s3: Any) -> None:
    s3 = node.client()
    put = s3.put_object(Bucket="s3e", Key="e/aes", Body=b"aes", ServerSideEncryption="AES256")
    assert put["ServerSideEncryption"] == "AES256"
    assert origin_s3.head_object(Bucket=ORIGIN, Key="pre/e/aes")["ServerSideEncryption"] == "AES256"
    for _ in range(2):  # the miss, then the hit
        got = s3.get_object(Bucket="s3e", Key="e/aes")
        assert (got["ServerSideEncryption"], got["Body"].read()) == ("AES256", b"aes")
    assert s3.head_object(Bucket="s3e", Key="e/aes")["ServerSideEncryption"] == "AES256"

    s3.put_object(
        Bucket="s3e", Key="e/kms", Body=b"kms", ServerSideEncryption="aws:kms", SSEKMSKeyId="k-1"
    )
    at_origin = origin_s3.head_object(Bucket=ORIGIN, Key="pre/e/kms")
    assert (at_origin["ServerSideEncryption"], at_origin["SSEKMSKeyId"]) == ("aws:kms", "k-1")
    head = s3.head_object(Bucket="s3e", Key="e/kms")
    assert (head["ServerSideEncryption"], head["SSEKMSKeyId"]) == ("aws:kms", "k-1")

    s3.copy_object(
        Bucket="s3e", Key="e/copy", CopySource={"Bucket": "s3e", "Key": "e/kms"},
        ServerSideEncryption="AES256",
    )  # fmt: skip
    assert (
        origin_s3.head_object(Bucket=ORIGIN, Key="pre/e/copy")["ServerSideEncryption"] == "AES256"
    )
    up = s3.create_multipart_upload(Bucket="s3e", Key="e/mp", ServerSideEncryption="AES256")
    assert up["ServerSideEncryption"] == "AES256"
    part = s3.upload_part(
        Bucket="s3e", Key="e/mp", UploadId=up["UploadId"], PartNumber=1, Body=b"p"
    )
    s3.complete_multipart_upload(
        Bucket="s3e", Key="e/mp", UploadId=up["UploadId"],
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]},
    )  # fmt: skip
    assert origin_s3.head_object(Bucket=ORIGIN, Key="pre/e/mp")["ServerSideEncryption"] == "AES256"


def test_sse_c_objects_need_their_key_and_are_never_cached(node: GatewayNode) -> None:
    s3 = node.client()
    key, other = os.urandom(32), os.urandom(32)
    data = os.urandom(100_000)
    put = s3.put_object(Bucket="s3e", Key="e/c", Body=data, **customer(key))
    assert put["SSECustomerAlgorithm"] == "AES256"
    for method in (s3.get_object, s3.head_object):
        with pytest.raises(ClientError) as exc:
            method(Bucket="s3e", Key="e/c")
        assert code(exc)[0] == 400
        with pytest.raises(ClientError) as exc:
            method(Bucket="s3e", Key="e/c", **customer(other))
        assert code(exc)[0] == 403
    for _ in range(2):
        got = s3.get_object(Bucket="s3e", Key="e/c", **customer(key))
        assert got["Body"].read() == data
        assert got["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "bypass"
        assert got["SSECustomerKeyMD5"] == base64.b64encode(hashlib.md5(key).digest()).decode()
    part = s3.get_object(Bucket="s3e", Key="e/c", Range="bytes=10-19", **customer(key))
    assert part["Body"].read() == data[10:20]
    head = s3.head_object(Bucket="s3e", Key="e/c", **customer(key))
    assert head["ContentLength"] == len(data)
    with pytest.raises(ClientError) as exc:  # still: nothing of it was cached by the reads
        s3.get_object(Bucket="s3e", Key="e/c")
    assert code(exc)[0] == 400
    assert "x-amz-meta-s3gw-sse-c-key-md5" not in head["ResponseMetadata"]["HTTPHeaders"]


def test_stores_that_cannot_encrypt_refuse(node: GatewayNode) -> None:
    s3 = node.client()
    asks: list[dict[str, Any]] = [
        {"ServerSideEncryption": "AES256"},
        {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "k"},
        customer(os.urandom(32)),
    ]
    for ask in asks:
        with pytest.raises(ClientError) as exc:
            s3.put_object(Bucket="filee", Key="e/plain", Body=b"x", **ask)
        assert code(exc) == (501, "NotImplemented")
        with pytest.raises(ClientError) as exc:
            s3.create_multipart_upload(Bucket="filee", Key="e/plain", **ask)
        assert code(exc) == (501, "NotImplemented")
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket="filee", Key="e/plain")
    assert code(exc)[0] == 404  # nothing was stored
    s3.put_object(Bucket="filee", Key="e/src", Body=b"x")
    with pytest.raises(ClientError) as exc:
        s3.copy_object(
            Bucket="filee", Key="e/copy", CopySource={"Bucket": "filee", "Key": "e/src"},
            ServerSideEncryption="AES256",
        )  # fmt: skip
    assert code(exc) == (501, "NotImplemented")
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket="filee", Key="e/src", **customer(os.urandom(32)))
    assert code(exc) == (400, "InvalidRequest")


def test_bad_encryption_headers_are_s3_errors(node: GatewayNode) -> None:
    s3 = node.client()
    key = os.urandom(32)
    bad: list[tuple[dict[str, Any], str]] = [
        ({"ServerSideEncryption": "DES"}, "InvalidArgument"),
        (
            {"SSECustomerAlgorithm": "AES128", "SSECustomerKey": key},
            "InvalidEncryptionAlgorithmError",
        ),
        (
            {
                "SSECustomerAlgorithm": "AES256",
                "SSECustomerKey": base64.b64encode(key).decode(),
                "SSECustomerKeyMD5": base64.b64encode(hashlib.md5(b"other").digest()).decode(),
            },
            "InvalidArgument",
        ),
        ({"SSECustomerAlgorithm": "AES256", "SSECustomerKey": b"short"}, "InvalidArgument"),
        ({"ServerSideEncryption": "AES256", **customer(key)}, "InvalidArgument"),
    ]
    for ask, expected in bad:
        for bucket in ("s3e", "filee"):
            with pytest.raises(ClientError) as exc:
                s3.put_object(Bucket=bucket, Key="e/bad", Body=b"x", **ask)
            assert code(exc) == (400, expected), ask
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket="s3e", Key="e/bad")
    assert code(exc)[0] == 404
