"""Object tagging through the gateway: Put/Get/DeleteObjectTagging, x-amz-tagging on PUT, copy
and multipart, x-amz-tagging-count on GET and HEAD, S3's limits, and the calls aws-cli makes.
Against a `gateway serve` subprocess over a real S3 origin (moto, whose own tags are checked
too) and a local folder, through boto3 and the aws CLI."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.support.gateway import ACCESS_KEY, BIN, SECRET_KEY, GatewayNode, start_gateway
from tests.support.net import eventually
from tests.support.origin import CountingProxy

MiB = 1 << 20
ORIGIN = "origin-tagging"


@pytest.fixture(scope="module")
def node(module_dir: Path, origin: CountingProxy, origin_s3: Any) -> Iterator[GatewayNode]:
    origin_s3.create_bucket(Bucket=ORIGIN)
    (module_dir / "files").mkdir()
    (module_dir / "other").mkdir()
    node = start_gateway(module_dir / "node")
    opts = ["-o", f"endpoint_url={origin.url}", "-o", "access_key=ak", "-o", "secret_key=sk"]
    node.cli("mount", "add", "s3t", f"s3://{ORIGIN}/pre", *opts)
    node.cli("mount", "add", "filet", (module_dir / "files").as_uri())
    node.cli("mount", "add", "othert", (module_dir / "other").as_uri())
    eventually(lambda: node.buckets() >= {"s3t", "filet", "othert"})
    yield node
    node.stop()


@pytest.fixture(params=["s3t", "filet"])
def bucket(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def tag_set(tags: dict[str, str]) -> dict[str, Any]:
    return {"TagSet": [{"Key": k, "Value": v} for k, v in tags.items()]}


def tags_of(s3: Any, bucket: str, key: str) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in s3.get_object_tagging(Bucket=bucket, Key=key)["TagSet"]}


def code(exc: pytest.ExceptionInfo[ClientError]) -> tuple[int, str]:
    err = exc.value.response
    return err["ResponseMetadata"]["HTTPStatusCode"], err["Error"]["Code"]


def test_put_get_delete_tagging_and_the_count_on_reads(node: GatewayNode, bucket: str) -> None:
    s3 = node.client()
    s3.put_object(Bucket=bucket, Key="t/a.txt", Body=b"hello")
    assert tags_of(s3, bucket, "t/a.txt") == {}
    assert "TagCount" not in s3.get_object(Bucket=bucket, Key="t/a.txt")
    s3.put_object_tagging(
        Bucket=bucket, Key="t/a.txt", Tagging=tag_set({"team": "vision", "tier": "raw"})
    )
    assert tags_of(s3, bucket, "t/a.txt") == {"team": "vision", "tier": "raw"}
    got = s3.get_object(Bucket=bucket, Key="t/a.txt")
    assert (got["TagCount"], got["Body"].read()) == (2, b"hello")  # a hit, tags counted
    head = s3.head_object(Bucket=bucket, Key="t/a.txt")
    assert head["ResponseMetadata"]["HTTPHeaders"]["x-amz-tagging-count"] == "2"
    s3.delete_object_tagging(Bucket=bucket, Key="t/a.txt")
    assert tags_of(s3, bucket, "t/a.txt") == {}
    assert "TagCount" not in s3.get_object(Bucket=bucket, Key="t/a.txt")
    with pytest.raises(ClientError) as exc:
        s3.get_object_tagging(Bucket=bucket, Key="t/none")
    assert code(exc) == (404, "NoSuchKey")


def test_tags_kept_at_an_s3_origin_are_its_own(node: GatewayNode, origin_s3: Any) -> None:
    s3 = node.client()
    s3.put_object(Bucket="s3t", Key="t/o", Body=b"x", Tagging="k=v&with%20space=a%2Fb")
    answer = origin_s3.get_object_tagging(Bucket=ORIGIN, Key="pre/t/o")
    assert {t["Key"]: t["Value"] for t in answer["TagSet"]} == {"k": "v", "with space": "a/b"}


def test_x_amz_tagging_on_put_copy_and_multipart(node: GatewayNode, bucket: str) -> None:
    s3 = node.client()
    s3.put_object(Bucket=bucket, Key="t/src", Body=b"src", Tagging="a=1&b=2")
    assert tags_of(s3, bucket, "t/src") == {"a": "1", "b": "2"}
    source = {"Bucket": bucket, "Key": "t/src"}
    s3.copy_object(Bucket=bucket, Key="t/copy", CopySource=source)
    assert tags_of(s3, bucket, "t/copy") == {"a": "1", "b": "2"}  # directive COPY
    s3.copy_object(
        Bucket=bucket, Key="t/repl", CopySource=source, TaggingDirective="REPLACE", Tagging="c=3"
    )
    assert tags_of(s3, bucket, "t/repl") == {"c": "3"}
    s3.copy_object(
        Bucket=bucket, Key="t/meta", CopySource=source, MetadataDirective="REPLACE",
        Metadata={"m": "1"},
    )  # fmt: skip
    assert tags_of(s3, bucket, "t/meta") == {"a": "1", "b": "2"}
    # Across mounts (and stores): streamed, the tags go along.
    s3.copy_object(Bucket="othert", Key="t/across", CopySource=source)
    assert tags_of(s3, "othert", "t/across") == {"a": "1", "b": "2"}

    up = s3.create_multipart_upload(Bucket=bucket, Key="t/mp", Tagging="mp=yes")
    part = s3.upload_part(
        Bucket=bucket, Key="t/mp", UploadId=up["UploadId"], PartNumber=1, Body=b"p" * 100
    )
    s3.complete_multipart_upload(
        Bucket=bucket, Key="t/mp", UploadId=up["UploadId"],
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]},
    )  # fmt: skip
    assert tags_of(s3, bucket, "t/mp") == {"mp": "yes"}
    s3.put_object(Bucket=bucket, Key="t/mp", Body=b"over")  # an overwrite has none
    assert tags_of(s3, bucket, "t/mp") == {}


@pytest.mark.parametrize(
    ("tags", "message"),
    [
        ({f"k{i}": "v" for i in range(11)}, "Object tags cannot be greater than 10"),
        ({"k" * 129: "v"}, "The TagKey you have provided is too long, max 128"),
        ({"k": "v" * 257}, "The TagValue you have provided is too long, max 256"),
        ({"aws:x": "v"}, "Your TagKey cannot be prefixed with aws:"),
        ({"bad#key": "v"}, "The TagKey you have provided is invalid"),
    ],
    ids=["eleven", "long-key", "long-value", "aws-prefix", "bad-char"],
)
def test_s3_limits_are_invalid_tag(node: GatewayNode, tags: dict[str, str], message: str) -> None:
    s3 = node.client()
    s3.put_object(Bucket="filet", Key="t/limits", Body=b"x")
    with pytest.raises(ClientError) as exc:
        s3.put_object_tagging(Bucket="filet", Key="t/limits", Tagging=tag_set(tags))
    assert code(exc) == (400, "InvalidTag")
    assert exc.value.response["Error"]["Message"] == message
    header = "&".join(f"{k}={v}" for k, v in tags.items())
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket="filet", Key="t/limits2", Body=b"x", Tagging=header)
    assert code(exc) == (400, "InvalidTag")
    assert tags_of(s3, "filet", "t/limits") == {}
    with pytest.raises(ClientError):
        s3.head_object(Bucket="filet", Key="t/limits2")  # refused before anything was stored
    exact = {f"k{i}": "v" * 256 for i in range(9)} | {"k" * 128: ""}
    s3.put_object_tagging(Bucket="filet", Key="t/limits", Tagging=tag_set(exact))
    assert tags_of(s3, "filet", "t/limits") == exact


def test_multipart_copy_between_buckets_as_aws_cli_v2_does(node: GatewayNode) -> None:
    """aws-cli v2's `s3 cp s3://a/k s3://b/k` of a multipart-sized object copies the tags
    (--copy-props default): HeadObject and GetObjectTagging of the source, then
    CreateMultipartUpload with x-amz-tagging, UploadPartCopy, Complete."""
    s3 = node.client()
    data = os.urandom(9 * MiB)
    s3.put_object(Bucket="s3t", Key="t/big", Body=data, Tagging="dataset=imagenet")
    head = s3.head_object(Bucket="s3t", Key="t/big")
    tags = s3.get_object_tagging(Bucket="s3t", Key="t/big")["TagSet"]
    tagging = "&".join(f"{t['Key']}={t['Value']}" for t in tags)
    up = s3.create_multipart_upload(
        Bucket="filet", Key="t/big", Tagging=tagging, ContentType=head["ContentType"]
    )
    parts = []
    for n, start in enumerate(range(0, len(data), 5 * MiB), 1):
        end = min(start + 5 * MiB, len(data)) - 1
        r = s3.upload_part_copy(
            Bucket="filet", Key="t/big", UploadId=up["UploadId"], PartNumber=n,
            CopySource={"Bucket": "s3t", "Key": "t/big"}, CopySourceRange=f"bytes={start}-{end}",
        )  # fmt: skip
        parts.append({"PartNumber": n, "ETag": r["CopyPartResult"]["ETag"]})
    s3.complete_multipart_upload(
        Bucket="filet", Key="t/big", UploadId=up["UploadId"], MultipartUpload={"Parts": parts}
    )
    assert tags_of(s3, "filet", "t/big") == {"dataset": "imagenet"}
    assert s3.get_object(Bucket="filet", Key="t/big")["Body"].read() == data


def aws(node: GatewayNode, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }
    return subprocess.run(
        [str(BIN / "aws"), "--endpoint-url", node.url, *args],
        env=env, capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip


def test_aws_cli_tagging_commands(node: GatewayNode, bucket: str, tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_bytes(b"cli")
    aws(node, "s3api", "put-object", "--bucket", bucket, "--key", "t/cli.txt",
        "--body", str(tmp_path / "f.txt"), "--tagging", "owner=cli")  # fmt: skip
    got = json.loads(
        aws(node, "s3api", "get-object-tagging", "--bucket", bucket, "--key", "t/cli.txt").stdout
    )
    assert got["TagSet"] == [{"Key": "owner", "Value": "cli"}]
    aws(node, "s3api", "put-object-tagging", "--bucket", bucket, "--key", "t/cli.txt",
        "--tagging", json.dumps(tag_set({"x": "1", "y": "2"})))  # fmt: skip
    got = json.loads(
        aws(node, "s3api", "get-object-tagging", "--bucket", bucket, "--key", "t/cli.txt").stdout
    )
    assert {t["Key"]: t["Value"] for t in got["TagSet"]} == {"x": "1", "y": "2"}
    aws(node, "s3api", "delete-object-tagging", "--bucket", bucket, "--key", "t/cli.txt")
    got = json.loads(
        aws(node, "s3api", "get-object-tagging", "--bucket", bucket, "--key", "t/cli.txt").stdout
    )
    assert got["TagSet"] == []


AWS_V2 = Path("/usr/bin/aws")  # Debian's awscli package is v2; the venv's is v1


def _aws_v2() -> bool:
    if not AWS_V2.exists():
        return False
    version = subprocess.run([str(AWS_V2), "--version"], capture_output=True, text=True)
    return version.stdout.startswith("aws-cli/2.")


@pytest.mark.skipif(not _aws_v2(), reason="aws-cli v2 is not installed (apt install awscli)")
def test_aws_cli_v2_multipart_cp_between_buckets_copies_the_tags(
    node: GatewayNode, tmp_path: Path
) -> None:
    """aws-cli v2 asks GetObjectTagging of the source of every multipart `s3 cp` between
    buckets (--copy-props default) and sends the tags with CreateMultipartUpload."""
    s3 = node.client()
    data = os.urandom(20 * MiB)
    s3.put_object(Bucket="s3t", Key="t/v2.bin", Body=data, Tagging="team=ml&split=train")
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }
    for src, dst in (("s3t", "filet"), ("filet", "othert")):
        subprocess.run(
            [str(AWS_V2), "--endpoint-url", node.url, "s3", "cp",
             f"s3://{src}/t/v2.bin", f"s3://{dst}/t/v2.bin"],
            env=env, capture_output=True, text=True, check=True, timeout=300,
        )  # fmt: skip
        assert tags_of(s3, dst, "t/v2.bin") == {"team": "ml", "split": "train"}
        head = s3.head_object(Bucket=dst, Key="t/v2.bin")
        assert head["ETag"].endswith('-3"')  # copied in 8 MiB parts
        assert s3.get_object(Bucket=dst, Key="t/v2.bin")["Body"].read() == data
