"""The S3-level behaviours of the gateway once per store kind: boto3 against one node whose
buckets are mounted on every under-store (file, S3, Azure Blob, GCS, HDFS)."""

from __future__ import annotations

import hashlib
import io
import os
import uuid
from collections.abc import Iterator
from email.header import decode_header, make_header
from pathlib import Path
from typing import Any

import pytest
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError

from tests.support.gateway import GatewayNode, start_gateway
from tests.support.net import eventually
from tests.support.origin import CountingProxy

MiB = 1 << 20
KINDS = ["file", "s3", "azure", "gcs", "hdfs"]


def _container_uri(kind: str, request: pytest.FixtureRequest, tmp: Path) -> tuple[str, list[str]]:
    """A fresh, empty container of this kind: its URI and the mount options."""
    name = f"k{uuid.uuid4().hex[:10]}"
    if kind == "file":
        (tmp / name).mkdir()
        return (tmp / name).as_uri(), []
    if kind == "s3":
        origin: CountingProxy = request.getfixturevalue("origin")
        request.getfixturevalue("origin_s3").create_bucket(Bucket=name)
        return f"s3://{name}/data", [
            f"endpoint_url={origin.url}", "access_key=ak", "secret_key=sk",
        ]  # fmt: skip
    if kind == "azure":
        from tests.support.azurite import sdk_client

        server = request.getfixturevalue("azurite")
        sdk_client(server).create_container(name)
        return f"az://{server.account}/{name}/data", [
            f"endpoint={server.url}", f"account_key={server.key}",
        ]  # fmt: skip
    if kind == "gcs":
        import httpx

        server = request.getfixturevalue("gcs")
        created = httpx.post(
            f"{server.url}/storage/v1/b", params={"project": "test"}, json={"name": name}
        )
        assert created.status_code == 200, created.text
        return f"gs://{name}/data", [f"endpoint={server.url}"]
    if kind == "hdfs":
        server = request.getfixturevalue("webhdfs")
        (server.root / name).mkdir()
        return f"{server.url}/{name}", ["user=gateway"]
    raise AssertionError(kind)


@pytest.fixture(scope="module")
def node(module_dir: Path) -> Iterator[GatewayNode]:
    node = start_gateway(module_dir / "node")
    yield node
    node.stop()


@pytest.fixture(params=KINDS)
def bucket(request: pytest.FixtureRequest, node: GatewayNode, module_dir: Path) -> str:
    return _mounted(str(request.param), request, node, module_dir)


def _mounted(kind: str, request: pytest.FixtureRequest, node: GatewayNode, tmp: Path) -> str:
    """A fresh bucket mounted on a fresh container of this kind."""
    uri, options = _container_uri(kind, request, tmp)
    name = f"{kind}-{uuid.uuid4().hex[:8]}"
    node.cli("mount", "add", name, uri, *[a for o in options for a in ("-o", o)])
    eventually(lambda: node.client().head_bucket(Bucket=name))
    return name


def test_put_get_range_and_head(node: GatewayNode, bucket: str) -> None:
    s3 = node.client()
    data = os.urandom(200_000)
    put = s3.put_object(Bucket=bucket, Key="dir/ü b+c.bin", Body=data, Metadata={"k": "v"},
                        ContentType="application/x-kind")  # fmt: skip
    assert put["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'
    got = s3.get_object(Bucket=bucket, Key="dir/ü b+c.bin")
    assert got["Body"].read() == data
    assert got["Metadata"] == {"k": "v"} and got["ContentType"] == "application/x-kind"
    part = s3.get_object(Bucket=bucket, Key="dir/ü b+c.bin", Range="bytes=1000-1999")
    assert part["Body"].read() == data[1000:2000]
    assert s3.head_object(Bucket=bucket, Key="dir/ü b+c.bin")["ContentLength"] == len(data)
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="dir/missing")
    assert exc.value.response["Error"]["Code"] == "NoSuchKey"


def test_listing_with_delimiter_and_pages(node: GatewayNode, bucket: str) -> None:
    s3 = node.client()
    keys = [f"l/{d}/{i:02d}" for d in ("a", "b") for i in range(6)] + ["l/top"]
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=k.encode())
    pages = s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix="l/", PaginationConfig={"PageSize": 5}
    )
    assert [o["Key"] for p in pages for o in p.get("Contents", [])] == sorted(keys)
    rolled = s3.list_objects_v2(Bucket=bucket, Prefix="l/", Delimiter="/")
    assert [p["Prefix"] for p in rolled["CommonPrefixes"]] == ["l/a/", "l/b/"]
    assert [o["Key"] for o in rolled["Contents"]] == ["l/top"]


def test_multipart_upload_and_delete(node: GatewayNode, bucket: str) -> None:
    s3 = node.client()
    data = os.urandom(11 * MiB)
    cfg = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    s3.upload_fileobj(io.BytesIO(data), bucket, "mp/big.bin", Config=cfg)
    head = s3.head_object(Bucket=bucket, Key="mp/big.bin")
    assert head["ETag"].endswith('-3"') and head["ContentLength"] == len(data)
    assert s3.get_object(Bucket=bucket, Key="mp/big.bin")["Body"].read() == data
    s3.delete_object(Bucket=bucket, Key="mp/big.bin")
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix="mp/")


def test_copy_into_this_store(node: GatewayNode, bucket: str, tmp_path: Path) -> None:
    s3 = node.client()
    s3.put_object(Bucket=bucket, Key="c/src", Body=b"copy me")
    s3.copy_object(Bucket=bucket, Key="c/dst", CopySource={"Bucket": bucket, "Key": "c/src"})
    assert s3.get_object(Bucket=bucket, Key="c/dst")["Body"].read() == b"copy me"


def test_non_ascii_metadata_is_the_same_text_on_every_store(node: GatewayNode, bucket: str) -> None:
    """SDKs send non-ASCII header text as UTF-8, and an RFC 2047 word in a value is decoded
    before it is stored: whatever carries it (an xattr, GCS's JSON, an S3 origin's or Azure's
    headers as RFC 2047 words), every store gives back the same text, as S3 does: one RFC 2047
    word where it is not ASCII."""
    s3 = node.client()

    def raw_headers(request: Any, **_: Any) -> None:
        request.headers["x-amz-meta-city"] = "Z\u00fcrich"  # goes as its UTF-8 bytes
        request.headers["x-amz-meta-word"] = "=?UTF-8?B?5pel5pys?="  # 日本
        request.headers["x-amz-meta-plain"] = "ascii as it is"

    s3.meta.events.register("before-sign.s3.PutObject", raw_headers)
    s3.put_object(Bucket=bucket, Key="meta", Body=b"x")
    for answer in (
        node.client().head_object(Bucket=bucket, Key="meta"),
        node.client().get_object(Bucket=bucket, Key="meta"),
    ):
        got = answer["Metadata"]
        assert got["city"] == "=?UTF-8?B?WsO8cmljaA==?="  # S3's form of Zürich
        assert {k: _text(v) for k, v in got.items()} == {
            "city": "Z\u00fcrich", "word": "日本", "plain": "ascii as it is"
        }  # fmt: skip


def _text(value: str) -> str:
    """The text a metadata value stands for: one RFC 2047 word, or latin-1 bytes as they are."""
    return str(make_header(decode_header(value)))


@pytest.fixture(params=[k for k in KINDS if k != "s3"])  # moto holds keys of any length
def limited_bucket(request: pytest.FixtureRequest, node: GatewayNode, module_dir: Path) -> str:
    return _mounted(str(request.param), request, node, module_dir)


def test_a_key_longer_than_the_store_holds_is_400_for_reads_and_writes(
    node: GatewayNode, limited_bucket: str, request: pytest.FixtureRequest
) -> None:
    s3 = node.client()
    kind = request.node.callspec.params["limited_bucket"]
    # File systems (and HDFS) hold names of at most 255 bytes, well inside S3's 1,024-byte key;
    # Azure's and GCS's limits are S3's own, which the S3 front end enforces before any store.
    key = "d/" + "n" * 300 if kind in ("file", "hdfs") else "d/" + "n" * 1100
    for call in (
        lambda: s3.put_object(Bucket=limited_bucket, Key=key, Body=b"x"),
        lambda: s3.get_object(Bucket=limited_bucket, Key=key),
        lambda: s3.create_multipart_upload(Bucket=limited_bucket, Key=key),
    ):
        with pytest.raises(ClientError) as exc:
            call()
        assert exc.value.response["Error"]["Code"] == "KeyTooLongError"
        if kind in ("file", "hdfs"):  # the store's own limit, named
            assert "at most 255 bytes" in exc.value.response["Error"]["Message"]
