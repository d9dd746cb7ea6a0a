"""Directory markers (`a/`) and a key beside its folder (`a` and `a/b`) through the gateway
on a file:// mount, as pyarrow's write_dataset and console tools make them: PUT, GET, HEAD,
listings and DELETE through boto3 (docs/stores/s3-and-file.md says how they lie on disk)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from tests.support.gateway import GatewayNode, start_gateway
from tests.support.net import eventually


@pytest.fixture(scope="module")
def node(module_dir: Path) -> Iterator[GatewayNode]:
    (module_dir / "files").mkdir()
    node = start_gateway(module_dir / "node")
    node.cli("mount", "add", "marks", (module_dir / "files").as_uri())
    eventually(lambda: "marks" in node.buckets())
    yield node
    node.stop()


def listing(s3: object, **kw: str) -> tuple[list[str], list[str]]:
    r = s3.list_objects_v2(Bucket="marks", **kw)  # type: ignore[attr-defined]
    return [o["Key"] for o in r.get("Contents", [])], [
        p["Prefix"] for p in r.get("CommonPrefixes", [])
    ]


def test_markers_and_keys_beside_folders(node: GatewayNode, module_dir: Path) -> None:
    s3 = node.client()
    s3.put_object(Bucket="marks", Key="ds/", Body=b"")
    s3.put_object(Bucket="marks", Key="ds/year=2024/part-0.parquet", Body=b"p0")
    s3.put_object(Bucket="marks", Key="a", Body=b"the a", ContentType="text/plain")
    s3.put_object(Bucket="marks", Key="a/b", Body=b"the b")
    assert s3.head_object(Bucket="marks", Key="ds/")["ContentLength"] == 0
    got = s3.get_object(Bucket="marks", Key="a")
    assert (got["Body"].read(), got["ContentType"]) == (b"the a", "text/plain")
    assert s3.get_object(Bucket="marks", Key="a/b")["Body"].read() == b"the b"
    assert listing(s3) == (["a", "a/b", "ds/", "ds/year=2024/part-0.parquet"], [])
    assert listing(s3, Delimiter="/") == (["a"], ["a/", "ds/"])
    assert listing(s3, Prefix="ds/", Delimiter="/") == (["ds/"], ["ds/year=2024/"])
    assert (module_dir / "files" / "ds" / "year=2024" / "part-0.parquet").is_file()

    s3.delete_object(Bucket="marks", Key="a/b")
    assert (module_dir / "files" / "a").is_file()  # a plain file again
    s3.delete_object(Bucket="marks", Key="ds/")
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket="marks", Key="ds/")
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    assert listing(s3, Delimiter="/") == (["a"], ["ds/"])
