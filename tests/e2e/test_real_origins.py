"""The gateway over S3 servers nobody here wrote (tests/support/real_origins.py), and over
moto behind a proxy that drops Range: every answer a store gives is checked against the
version and the range asked for before a byte of it is kept or sent.

rclone serve s3 lists ETags bare (`<ETag>8e29…</ETag>`) and answers GET with them quoted;
it ignores If-Match on GET (200 with whatever version it has now).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.support.gateway import GatewayNode, start_gateway
from tests.support.net import eventually
from tests.support.odd_origin import OddOrigin
from tests.support.origin import MotoServer
from tests.support.real_origins import RcloneS3, SeaweedS3

KiB, MiB = 1 << 10, 1 << 20


def blob(n: int, seed: str) -> bytes:
    block = hashlib.sha256(seed.encode()).digest() * 64
    return (block * (n // len(block) + 1))[:n]


@pytest.fixture(scope="module")
def rclone(module_dir: Path) -> Iterator[RcloneS3]:
    server = RcloneS3(module_dir)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def node(module_dir: Path) -> Iterator[GatewayNode]:
    n = start_gateway(module_dir / "node", args=("--cache-block-size", "1MiB"))
    yield n
    n.stop()


def mount(node: GatewayNode, uri: str, options: list[str], *more: str) -> str:
    bucket = f"m{uuid.uuid4().hex[:10]}"
    node.cli("mount", "add", bucket, uri, *options, *more)
    eventually(lambda: bucket in node.buckets())
    return bucket


@pytest.fixture(scope="module")
def seaweed(module_dir: Path) -> Iterator[SeaweedS3]:
    server = SeaweedS3(module_dir)
    yield server
    server.stop()


@pytest.fixture
def rclone_bucket(rclone: RcloneS3) -> str:
    name = f"o{uuid.uuid4().hex[:10]}"
    rclone.s3.create_bucket(Bucket=name)
    return name


def test_rclone_lists_etags_bare_and_a_load_still_loads_everything(
    node: GatewayNode, rclone: RcloneS3, rclone_bucket: str
) -> None:
    data = {f"train/{i:02d}": blob(40 * KiB + i, f"t{i}") for i in range(12)}
    for key, body in data.items():
        rclone.s3.put_object(Bucket=rclone_bucket, Key=key, Body=body)
    listed = rclone.s3.list_objects_v2(Bucket=rclone_bucket)["Contents"]
    assert not listed[0]["ETag"].startswith('"')  # the quirk this is about
    bucket = mount(node, f"s3://{rclone_bucket}", rclone.mount_options())

    out = node.cli("load", f"{bucket}/train/", "--pin", "--format", "json", check=False)
    ended = json.loads(out.stdout)
    assert out.returncode == 0 and ended["state"] == "done", ended
    assert ended["loaded_bytes"] == sum(map(len, data.values())), ended
    verify = json.loads(node.cli("load", f"{bucket}/train/", "--verify", "--format", "json").stdout)
    assert verify["cached_bytes"] == sum(map(len, data.values())), verify
    # The blocks loaded (and pinned) are the ones reads use: no byte comes from the origin.
    before = node.metric("gateway_store_bytes")
    s3 = node.client()
    for key, body in data.items():
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == body
    assert node.metric("gateway_store_bytes") == before
    # A refresh finds nothing changed.
    out = node.cli("load", f"{bucket}/train/", "--refresh", "--format", "json", check=False)
    assert out.returncode == 0 and json.loads(out.stdout)["state"] == "done", out.stdout


def test_a_dataset_on_seaweedfs_loads_and_reads_back_through_the_gateway(
    node: GatewayNode, seaweed: SeaweedS3
) -> None:
    name = f"o{uuid.uuid4().hex[:10]}"
    seaweed.s3.create_bucket(Bucket=name)
    data = {f"train/{i:02d}": blob(300 * KiB + i, f"s{i}") for i in range(8)}
    data["train/big"] = blob(3 * MiB + 5, "seaweed-big")
    for key, body in data.items():
        seaweed.s3.put_object(Bucket=name, Key=key, Body=body)
    bucket = mount(node, f"s3://{name}", seaweed.mount_options())
    out = node.cli("load", f"{bucket}/train/", "--format", "json", check=False)
    ended = json.loads(out.stdout)
    assert out.returncode == 0 and ended["state"] == "done", ended
    assert ended["loaded_bytes"] == sum(map(len, data.values())), ended
    before = node.metric("gateway_store_bytes")
    s3 = node.client()
    for key, body in data.items():
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == body
    got = s3.get_object(Bucket=bucket, Key="train/big", Range="bytes=1048570-2097160")
    assert got["Body"].read() == data["train/big"][1048570:2097161]
    assert node.metric("gateway_store_bytes") == before  # every byte was loaded
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="train/")["Contents"]
    assert sorted(o["Key"] for o in listed) == sorted(data)


def test_versions_on_seaweedfs_are_read_listed_and_deleted_by_id(
    node: GatewayNode, seaweed: SeaweedS3
) -> None:
    """A second S3 server that keeps versions (SeaweedFS; moto is the first, in
    test_s3_versions.py): versions read by id through the cache, listed, deleted."""
    name = f"o{uuid.uuid4().hex[:10]}"
    origin = seaweed.s3
    origin.create_bucket(Bucket=name)
    origin.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    old, new = blob(3 * MiB + 5, "sw-old"), blob(MiB, "sw-new")
    v1 = origin.put_object(Bucket=name, Key="ckpt", Body=old)["VersionId"]
    v2 = origin.put_object(Bucket=name, Key="ckpt", Body=new)["VersionId"]
    bucket = mount(node, f"s3://{name}", seaweed.mount_options())
    s3 = node.client()
    assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
    got = s3.get_object(Bucket=bucket, Key="ckpt", VersionId=v1)
    assert got["Body"].read() == old and got["VersionId"] == v1
    before = node.metric("gateway_store_bytes")
    part = s3.get_object(Bucket=bucket, Key="ckpt", VersionId=v1, Range="bytes=1048570-2097160")
    assert part["Body"].read() == old[1048570:2097161]
    assert node.metric("gateway_store_bytes") == before  # from the cache
    assert s3.get_object(Bucket=bucket, Key="ckpt")["Body"].read() == new
    listed = s3.list_object_versions(Bucket=bucket)["Versions"]
    assert [(v["VersionId"], v["IsLatest"]) for v in listed] == [(v2, True), (v1, False)]
    s3.delete_object(Bucket=bucket, Key="ckpt", VersionId=v2)
    assert s3.get_object(Bucket=bucket, Key="ckpt")["Body"].read() == old  # v1 current again
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="ckpt", VersionId=v2)
    assert exc.value.response["Error"]["Code"] == "NoSuchVersion"


def test_an_origin_that_ignores_if_match_never_gets_two_versions_mixed(
    node: GatewayNode, rclone: RcloneS3, rclone_bucket: str
) -> None:
    v1, v2 = blob(3 * MiB, "v1"), blob(3 * MiB, "v2")
    rclone.s3.put_object(Bucket=rclone_bucket, Key="obj", Body=v1)
    bucket = mount(node, f"s3://{rclone_bucket}", rclone.mount_options(), "-o", "metadata_ttl=-1")
    # No checksum check by the client: the gateway's answer is judged by its bytes alone.
    s3 = node.client(response_checksum_validation="when_required")
    head = s3.get_object(Bucket=bucket, Key="obj", Range="bytes=0-99")
    assert head["Body"].read() == v1[:100]
    rclone.s3.put_object(Bucket=rclone_bucket, Key="obj", Body=v2)
    wrong = node.metric("gateway_store_wrong_versions")

    # Blocks 1-2 are asked for under v1's ETag; rclone answers with v2's bytes. They are
    # refused, the version is learnt again, and the whole of v2 is served, before any byte.
    for _ in range(3):
        got = s3.get_object(Bucket=bucket, Key="obj")
        body = got["Body"].read()
        assert body[:100] != v1[:100] or body[MiB:] != v2[MiB:], "a body of two versions"
        assert (
            body == v2
            and got["ETag"] == rclone.s3.head_object(Bucket=rclone_bucket, Key="obj")["ETag"]
        )
    assert node.metric("gateway_store_wrong_versions") > wrong


@pytest.fixture(scope="module")
def whole_origin(moto_server: MotoServer) -> Iterator[OddOrigin]:
    proxy = OddOrigin(moto_server.url)
    yield proxy
    proxy.stop()


def _ranges_answered_whole(node: GatewayNode, origin: OddOrigin, bucket: str, data: bytes) -> None:
    """A range in the middle of the object, then all of it, through an origin that answers
    every GET whole: the bytes asked for, and the others counted as wasted."""
    origin.whole_gets = True
    try:
        wasted = node.metric("gateway_store_wasted_bytes")
        s3 = node.client()
        got = s3.get_object(Bucket=bucket, Key="big", Range="bytes=2097152-2097251")
        assert got["Body"].read() == data[2 * MiB : 2 * MiB + 100]
        assert s3.get_object(Bucket=bucket, Key="big")["Body"].read() == data
        assert node.metric("gateway_store_wasted_bytes") > wasted
    finally:
        origin.whole_gets = False


def test_a_ranged_get_answered_whole_gives_the_range_and_counts_the_waste(
    node: GatewayNode, whole_origin: OddOrigin, origin_s3: Any
) -> None:
    name = f"o{uuid.uuid4().hex[:10]}"
    origin_s3.create_bucket(Bucket=name)
    data = blob(3 * MiB + 12345, "whole")
    origin_s3.put_object(Bucket=name, Key="big", Body=data)
    options = ["-o", f"endpoint_url={whole_origin.url}", "-o", "access_key=a", "-o", "secret_key=s"]
    bucket = mount(node, f"s3://{name}", options)
    _ranges_answered_whole(node, whole_origin, bucket, data)


def test_a_part_answered_as_the_whole_object_is_not_served_as_the_part(
    node: GatewayNode, whole_origin: OddOrigin, origin_s3: Any
) -> None:
    """Found from outside: GET ?partNumber=1 over a Ceph RGW 16.2 origin answered the whole
    16 MiB object as part 1 (206, parts count 3): RGW ignores partNumber, and the node took
    its answer. Each part's answer is checked against the part asked for; an origin that
    cannot tell its parts gets the 501 any such store gets, never the wrong bytes."""
    name = f"o{uuid.uuid4().hex[:10]}"
    origin_s3.create_bucket(Bucket=name)
    parts = [blob(5 * MiB, "p1"), blob(5 * MiB, "p2"), blob(MiB, "p3")]
    upload = origin_s3.create_multipart_upload(Bucket=name, Key="parted")["UploadId"]
    done = [
        {"PartNumber": n, "ETag": origin_s3.upload_part(
            Bucket=name, Key="parted", UploadId=upload, PartNumber=n, Body=body
        )["ETag"]}
        for n, body in enumerate(parts, 1)
    ]  # fmt: skip
    origin_s3.complete_multipart_upload(
        Bucket=name, Key="parted", UploadId=upload, MultipartUpload={"Parts": done}
    )
    options = ["-o", f"endpoint_url={whole_origin.url}", "-o", "access_key=a", "-o", "secret_key=s"]
    bucket = mount(node, f"s3://{name}", options)
    s3 = node.client()
    whole_origin.parts_ignored = True
    try:
        with pytest.raises(ClientError) as refused:
            s3.get_object(Bucket=bucket, Key="parted", PartNumber=1)
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 501
    finally:
        whole_origin.parts_ignored = False
    got = s3.get_object(Bucket=bucket, Key="parted", PartNumber=2)  # an origin that tells parts
    assert got["Body"].read() == parts[1] and got["PartsCount"] == 3


# -- Azure and GCS servers that answer a ranged read whole ----------------------------------------


@pytest.fixture(scope="module")
def whole_azurite(azurite: Any) -> Iterator[OddOrigin]:
    proxy = OddOrigin(azurite.url)
    yield proxy
    proxy.stop()


@pytest.fixture(scope="module")
def whole_gcs(gcs: Any) -> Iterator[OddOrigin]:
    proxy = OddOrigin(gcs.url)
    yield proxy
    proxy.stop()


def test_an_azure_server_answering_a_range_whole_gives_the_range(
    node: GatewayNode, whole_azurite: OddOrigin, azurite: Any
) -> None:
    from datetime import UTC, datetime, timedelta

    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    from tests.support.azurite import sdk_client

    name = f"o{uuid.uuid4().hex[:10]}"
    container = sdk_client(azurite).create_container(name)
    data = blob(3 * MiB + 12345, "azure-whole")
    container.upload_blob("big", data)
    # A SAS token: it signs no header, so the proxy may drop x-ms-range (a shared key signs it).
    sas = generate_container_sas(
        azurite.account, name, account_key=azurite.key,
        expiry=datetime.now(UTC) + timedelta(hours=1),
        permission=ContainerSasPermissions(read=True, list=True),
    )  # fmt: skip
    endpoint = f"{whole_azurite.url}/{azurite.account}"
    options = ["-o", f"endpoint={endpoint}", "-o", f"sas_token={sas}"]
    bucket = mount(node, f"az://{azurite.account}/{name}", options)
    _ranges_answered_whole(node, whole_azurite, bucket, data)
    assert whole_azurite.count("GET") > 0  # through the proxy


def _gcs_object(gcs: Any, key: str, data: bytes) -> str:
    """A new bucket on fake-gcs-server holding `key`; its name."""
    import httpx

    name = f"o{uuid.uuid4().hex[:10]}"
    made = httpx.post(f"{gcs.url}/storage/v1/b", params={"project": "test"}, json={"name": name})
    assert made.status_code == 200, made.text
    put = httpx.post(
        f"{gcs.url}/upload/storage/v1/b/{name}/o",
        params={"uploadType": "media", "name": key}, content=data,
    )  # fmt: skip
    assert put.status_code == 200, put.text
    return name


def test_a_gcs_server_answering_a_range_whole_gives_the_range(
    node: GatewayNode, whole_gcs: OddOrigin, gcs: Any
) -> None:
    data = blob(3 * MiB + 12345, "gcs-whole")
    name = _gcs_object(gcs, "big", data)
    bucket = mount(node, f"gs://{name}", ["-o", f"endpoint={whole_gcs.url}"])
    _ranges_answered_whole(node, whole_gcs, bucket, data)
    assert whole_gcs.count("GET") > 0  # through the proxy


def test_a_gcs_answer_of_another_generation_is_never_served(
    node: GatewayNode, whole_gcs: OddOrigin, gcs: Any
) -> None:
    """The GCS store reads a version by its generation; an answer that says it is of another
    one is refused (a version change, counted), and not a byte of it is cached or sent."""
    data = blob(2 * MiB, "gcs-generation")
    name = _gcs_object(gcs, "obj", data)
    bucket = mount(node, f"gs://{name}", ["-o", f"endpoint={whole_gcs.url}"])
    s3 = node.client()  # one attempt: the 503 is seen, not retried
    wrong = node.metric("gateway_store_wrong_versions")
    whole_gcs.generation_answered = "1"
    try:
        with pytest.raises(ClientError) as refused:
            s3.get_object(Bucket=bucket, Key="obj")["Body"].read()
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
        assert node.metric("gateway_store_wrong_versions") > wrong
    finally:
        whole_gcs.generation_answered = None
    assert s3.get_object(Bucket=bucket, Key="obj")["Body"].read() == data
