"""Versions, tried with boto3 against a `gateway serve` subprocess (the default worker count):
an S3 mount of a versioned origin bucket (moto) reads any version by id through the cache and
keeps it for good, lists the origin's versions, deletes a version (alone or in DeleteObjects),
copies one, tags one, says the version ids of what it serves and of the delete markers it
makes, and says and sets the bucket's versioning; a file bucket store and an S3 mount of a
bucket never versioned answer as S3 answers for a bucket never versioned."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.support.gateway import GatewayNode, start_gateway
from tests.support.net import eventually
from tests.support.origin import CountingProxy

ORIGIN = "origin-versions"  # versioned; mounted whole as "vers"
PREFIXED = "origin-versions-pre"  # versioned; its prefix "data/" mounted as "verspre"
PLAIN = "origin-never-versioned"  # never versioned; mounted whole as "plain"
MADE = "made-versions"  # a bucket of the file bucket store
MiB = 1 << 20


@pytest.fixture(scope="module")
def node(module_dir: Path, origin: CountingProxy, origin_s3: Any) -> Iterator[GatewayNode]:
    for bucket in (ORIGIN, PREFIXED):
        origin_s3.create_bucket(Bucket=bucket)
        origin_s3.put_bucket_versioning(
            Bucket=bucket, VersioningConfiguration={"Status": "Enabled"}
        )
    origin_s3.create_bucket(Bucket=PLAIN)
    buckets = module_dir / "buckets"
    buckets.mkdir()
    # Versions of a key named by id are known for good even where the key's current version
    # is asked of the store on every read (TTL 0), and blocks of 1 MiB make a few per object.
    args = ("--bucket-store", buckets.as_uri(), "--metadata-ttl", "0")
    node = start_gateway(module_dir / "node", args=(*args, "--cache-block-size", "1MiB"))
    opts = ["-o", f"endpoint_url={origin.url}", "-o", "access_key=ak", "-o", "secret_key=sk"]
    node.cli("mount", "add", "vers", f"s3://{ORIGIN}", *opts)
    node.cli("mount", "add", "verspre", f"s3://{PREFIXED}/data", *opts)
    node.cli("mount", "add", "plain", f"s3://{PLAIN}", *opts)
    node.client().create_bucket(Bucket=MADE)
    eventually(lambda: node.buckets() >= {"vers", "verspre", "plain", MADE})
    node.wait_workers()
    yield node
    node.stop()


def _code(exc: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    r = exc.value.response
    return r["Error"]["Code"], r["ResponseMetadata"]["HTTPStatusCode"]


def _versions(origin_s3: Any, bucket: str, key: str, *bodies: bytes) -> list[str]:
    """Each body written in turn to the origin as a new version of key; their version ids."""
    return [origin_s3.put_object(Bucket=bucket, Key=key, Body=b)["VersionId"] for b in bodies]


def _gets(origin: CountingProxy, key: str) -> int:
    """The origin's GETs of the key's bytes (any version)."""
    return sum(
        1 for r in origin.requests if r.method == "GET" and r.path.endswith(f"/{ORIGIN}/{key}")
    )


def test_any_version_is_read_by_id_through_the_cache_and_kept_for_good(
    node: GatewayNode, origin: CountingProxy, origin_s3: Any
) -> None:
    s3 = node.client()
    key = "model/ckpt.bin"
    one, two = b"1" * (3 * MiB + 5), b"2" * (2 * MiB)
    v1, v2 = _versions(origin_s3, ORIGIN, key, one, two)

    got = s3.get_object(Bucket="vers", Key=key, VersionId=v1)
    assert got["Body"].read() == one
    assert got["VersionId"] == v1 and got["ContentLength"] == len(one)
    assert s3.get_object(Bucket="vers", Key=key)["Body"].read() == two  # the current one
    head = s3.head_object(Bucket="vers", Key=key, VersionId=v2)
    assert head["VersionId"] == v2 and head["ContentLength"] == len(two)
    # A range of the old version, across a block boundary, and its last bytes.
    part = s3.get_object(Bucket="vers", Key=key, VersionId=v1, Range="bytes=1048570-2097160")
    assert part["Body"].read() == one[1048570:2097161]
    assert part["ContentRange"] == f"bytes 1048570-2097160/{len(one)}"
    tail = s3.get_object(Bucket="vers", Key=key, VersionId=v1, Range="bytes=-7")
    assert tail["Body"].read() == one[-7:]

    # Read again, on new connections (either worker): hits, no request to the origin at all,
    # though the mount asks the store for the key's current version on every read.
    before = len(origin.requests)
    for _ in range(6):
        again = s3.get_object(Bucket="vers", Key=key, VersionId=v1, Range="bytes=0-9")
        assert again["Body"].read() == one[:10]
        assert again["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit"
        assert s3.head_object(Bucket="vers", Key=key, VersionId=v1)["ContentLength"] == len(one)
    assert s3.get_object(Bucket="vers", Key=key, VersionId=v1)["Body"].read() == one
    seen = [f"{r.method} {r.path}" for r in origin.requests[before:] if ORIGIN in r.path]
    assert seen == [], seen


def test_a_version_is_fetched_once_for_concurrent_readers(
    node: GatewayNode, origin: CountingProxy, origin_s3: Any
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    key = "shard-0001.tar"
    body = bytes(range(256)) * (12 * 1024)  # 3 MiB
    (v1,) = _versions(origin_s3, ORIGIN, key, body)
    _versions(origin_s3, ORIGIN, key, b"newer")
    sent = origin.bytes_sent()

    def read(_: int) -> bytes:
        data: bytes = node.client().get_object(Bucket="vers", Key=key, VersionId=v1)["Body"].read()
        return data

    with ThreadPoolExecutor(8) as pool:
        assert all(d == body for d in pool.map(read, range(8)))
    # Every block of the version came from the origin once, whatever worker each reader hit.
    assert origin.bytes_sent() - sent <= len(body) + len(b"newer"), _gets(origin, key)


def test_errors_of_versions_as_s3_answers_them(node: GatewayNode, origin_s3: Any) -> None:
    s3 = node.client()
    key = "errs/a.txt"
    v1, _ = _versions(origin_s3, ORIGIN, key, b"first", b"second")
    marker = origin_s3.delete_object(Bucket=ORIGIN, Key=key)["VersionId"]

    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket="vers", Key=key)
    assert _code(exc) == ("NoSuchKey", 404)
    assert s3.get_object(Bucket="vers", Key=key, VersionId=v1)["Body"].read() == b"first"
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket="vers", Key=key, VersionId=marker)
    assert _code(exc) == ("MethodNotAllowed", 405)
    assert exc.value.response["ResponseMetadata"]["HTTPHeaders"]["x-amz-delete-marker"] == "true"
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket="vers", Key="errs/none", VersionId=v1)
    assert _code(exc) == ("NoSuchVersion", 404)


def test_versions_are_listed_as_the_origin_has_them(node: GatewayNode, origin_s3: Any) -> None:
    s3 = node.client()
    for key in ("a/1", "a/2", "b/1"):
        _versions(origin_s3, PREFIXED, f"data/{key}", b"x", b"yy")
    origin_s3.delete_object(Bucket=PREFIXED, Key="data/a/2")
    origin_s3.put_object(Bucket=PREFIXED, Key="elsewhere", Body=b"not in the mount")

    def entries(pages: Any, cut: str) -> list[tuple[str, str, bool, str]]:
        out = []
        for page in pages:
            for kind in ("Versions", "DeleteMarkers"):
                for v in page.get(kind, []):
                    out.append((v["Key"].removeprefix(cut), v["VersionId"], v["IsLatest"], kind))
        return sorted(out)

    paginate = s3.get_paginator("list_object_versions").paginate
    mine = entries(paginate(Bucket="verspre", PaginationConfig={"PageSize": 2}), "")
    theirs = entries(
        origin_s3.get_paginator("list_object_versions").paginate(Bucket=PREFIXED, Prefix="data/"),
        "data/",
    )
    assert mine == theirs and len(mine) == 7  # six versions and a delete marker
    folders = s3.list_object_versions(Bucket="verspre", Delimiter="/")
    assert [p["Prefix"] for p in folders["CommonPrefixes"]] == ["a/", "b/"]
    with pytest.raises(ClientError) as exc:
        s3.list_object_versions(Bucket="verspre", VersionIdMarker="abc")
    assert _code(exc) == ("InvalidArgument", 400)


def test_a_version_deleted_through_the_gateway_is_gone_from_every_worker(
    node: GatewayNode, origin_s3: Any
) -> None:
    s3 = node.client()
    key = "gone/v.bin"
    v1, v2 = _versions(origin_s3, ORIGIN, key, b"one" * 1000, b"two" * 1000)
    for _ in range(4):  # known, and cached, by both workers most likely
        assert s3.get_object(Bucket="vers", Key=key, VersionId=v2)["Body"].read() == b"two" * 1000
        assert s3.get_object(Bucket="vers", Key=key)["Body"].read() == b"two" * 1000

    out = s3.delete_object(Bucket="vers", Key=key, VersionId=v2)
    assert out["VersionId"] == v2 and "DeleteMarker" not in out
    assert [v["VersionId"] for v in origin_s3.list_object_versions(Bucket=ORIGIN, Prefix=key)
            ["Versions"]] == [v1]  # fmt: skip
    for _ in range(8):  # new connections: each worker in turn
        with pytest.raises(ClientError) as exc:
            s3.get_object(Bucket="vers", Key=key, VersionId=v2)
        assert _code(exc) == ("NoSuchVersion", 404)
        # The key's current version is v1 again: never the deleted one from the cache.
        assert s3.get_object(Bucket="vers", Key=key)["Body"].read() == b"one" * 1000

    # A delete without a version id makes a delete marker at the origin.
    s3.delete_object(Bucket="vers", Key=key)
    latest = origin_s3.list_object_versions(Bucket=ORIGIN, Prefix=key)["DeleteMarkers"][0]
    assert latest["IsLatest"]
    out = s3.delete_object(Bucket="vers", Key=key, VersionId=latest["VersionId"])
    # (S3 also says x-amz-delete-marker: true here, passed on from the origin; moto does not.)
    assert out["VersionId"] == latest["VersionId"]
    assert s3.get_object(Bucket="vers", Key=key)["Body"].read() == b"one" * 1000


def test_versioning_is_the_origin_bucket_s(node: GatewayNode, origin_s3: Any) -> None:
    s3 = node.client()
    assert s3.get_bucket_versioning(Bucket="vers")["Status"] == "Enabled"
    assert s3.get_bucket_versioning(Bucket="verspre")["Status"] == "Enabled"
    assert "Status" not in s3.get_bucket_versioning(Bucket=MADE)

    s3.put_bucket_versioning(Bucket="vers", VersioningConfiguration={"Status": "Suspended"})
    try:
        assert origin_s3.get_bucket_versioning(Bucket=ORIGIN)["Status"] == "Suspended"
        assert s3.get_bucket_versioning(Bucket="vers")["Status"] == "Suspended"
    finally:
        s3.put_bucket_versioning(Bucket="vers", VersioningConfiguration={"Status": "Enabled"})
    assert origin_s3.get_bucket_versioning(Bucket=ORIGIN)["Status"] == "Enabled"

    # A mount of a prefix must not change the versioning of the whole origin bucket; the file
    # bucket store keeps one version of each key.
    for bucket in ("verspre", MADE):
        with pytest.raises(ClientError) as exc:
            s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
        assert _code(exc) == ("NotImplemented", 501)
    assert origin_s3.get_bucket_versioning(Bucket=PREFIXED)["Status"] == "Enabled"
    with pytest.raises(ClientError) as exc:
        s3.put_bucket_versioning(Bucket="vers", VersioningConfiguration={"Status": "On"})
    assert _code(exc) == ("MalformedXML", 400)


def test_writes_say_the_version_they_made(node: GatewayNode, origin_s3: Any) -> None:
    s3 = node.client()
    key = "writes/obj"
    first = s3.put_object(Bucket="vers", Key=key, Body=b"first")["VersionId"]
    copied = s3.copy_object(Bucket="vers", Key=key, CopySource={"Bucket": "vers", "Key": key},
                            MetadataDirective="REPLACE")["VersionId"]  # fmt: skip
    upload = s3.create_multipart_upload(Bucket="vers", Key=key)["UploadId"]
    part = s3.upload_part(Bucket="vers", Key=key, UploadId=upload, PartNumber=1, Body=b"third")
    parts = {"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]}
    third = s3.complete_multipart_upload(
        Bucket="vers", Key=key, UploadId=upload, MultipartUpload=parts
    )["VersionId"]
    listed = origin_s3.list_object_versions(Bucket=ORIGIN, Prefix=key)["Versions"]
    assert [v["VersionId"] for v in listed] == [third, copied, first]
    assert s3.get_object(Bucket="vers", Key=key)["Body"].read() == b"third"
    assert s3.get_object(Bucket="vers", Key=key, VersionId=first)["Body"].read() == b"first"
    # A bucket that keeps one version of a key says none.
    assert "VersionId" not in s3.put_object(Bucket=MADE, Key=key, Body=b"x")


# -- GCS: generations ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gcs_versions(tmp_path_factory: pytest.TempPathFactory, node: GatewayNode) -> Iterator[Any]:
    """fake-gcs-server keeping generations (its memory backend), a bucket with versioning on,
    mounted whole as "gvers"; a client of the server's JSON API."""
    import httpx

    from tests.support.gcs_server import GcsServer

    server = GcsServer(tmp_path_factory.mktemp("gcs-versions"), backend="memory")
    api = httpx.Client(base_url=server.url)
    made = api.post(
        "/storage/v1/b", params={"project": "p"},
        json={"name": "gcs-versions", "versioning": {"enabled": True}},
    )  # fmt: skip
    assert made.status_code == 200, made.text
    node.cli("mount", "add", "gvers", "gs://gcs-versions", "-o", f"endpoint={server.url}")
    eventually(lambda: "gvers" in node.buckets())
    yield api
    api.close()
    server.stop()


def _gcs_put(api: Any, key: str, body: bytes) -> str:
    """A new generation of key, written straight to the server; its number."""
    r = api.post(
        "/upload/storage/v1/b/gcs-versions/o",
        params={"uploadType": "media", "name": key},
        content=body,
    )
    assert r.status_code == 200, r.text
    return str(r.json()["generation"])


def test_gcs_generations_are_versions(node: GatewayNode, gcs_versions: Any) -> None:
    s3 = node.client()
    one, two = b"a" * (MiB + 3), b"b" * 100
    g1, g2 = _gcs_put(gcs_versions, "g/obj", one), _gcs_put(gcs_versions, "g/obj", two)
    _gcs_put(gcs_versions, "g/other", b"c")
    got = s3.get_object(Bucket="gvers", Key="g/obj", VersionId=g1)
    assert got["Body"].read() == one and got["VersionId"] == g1
    part = s3.get_object(Bucket="gvers", Key="g/obj", VersionId=g1, Range="bytes=1048570-")
    assert part["Body"].read() == one[1048570:]
    assert s3.get_object(Bucket="gvers", Key="g/obj")["Body"].read() == two
    assert s3.head_object(Bucket="gvers", Key="g/obj", VersionId=g2)["ContentLength"] == 100
    for bad, code in (("123", ("NoSuchVersion", 404)), ("abc", ("InvalidArgument", 400))):
        with pytest.raises(ClientError) as exc:
            s3.get_object(Bucket="gvers", Key="g/obj", VersionId=bad)
        assert _code(exc) == code

    pages = s3.get_paginator("list_object_versions").paginate(
        Bucket="gvers", Prefix="g/", PaginationConfig={"PageSize": 1}
    )
    listed = [(v["Key"], v["VersionId"], v["IsLatest"]) for p in pages for v in p["Versions"]]
    assert listed[:2] == [("g/obj", g2, True), ("g/obj", g1, False)]
    assert [k for k, _, _ in listed] == ["g/obj", "g/obj", "g/other"]
    folders = s3.list_object_versions(Bucket="gvers", Delimiter="/")
    assert [p["Prefix"] for p in folders["CommonPrefixes"]] == ["g/"]

    assert s3.get_bucket_versioning(Bucket="gvers")["Status"] == "Enabled"
    # (DeleteObject of a generation is not tried: fake-gcs-server deletes the live one.)


def test_a_gcs_generation_is_copied_and_its_tags_read(node: GatewayNode, gcs_versions: Any) -> None:
    s3 = node.client()
    s3.put_object(Bucket="gvers", Key="gc/src", Body=b"first", Tagging="gen=1")
    g1 = s3.list_object_versions(Bucket="gvers", Prefix="gc/src")["Versions"][0]["VersionId"]
    s3.put_object(Bucket="gvers", Key="gc/src", Body=b"second", Tagging="gen=2")
    source = {"Bucket": "gvers", "Key": "gc/src", "VersionId": g1}
    for bucket in ("gvers", MADE):  # GCS's copyTo of the generation; across stores, its bytes
        out = s3.copy_object(Bucket=bucket, Key="gc/copy", CopySource=source)
        assert out["CopySourceVersionId"] == g1, bucket
        assert s3.get_object(Bucket=bucket, Key="gc/copy")["Body"].read() == b"first", bucket
        tags = s3.get_object_tagging(Bucket=bucket, Key="gc/copy")["TagSet"]
        assert tags == [{"Key": "gen", "Value": "1"}], bucket
    got = s3.get_object_tagging(Bucket="gvers", Key="gc/src", VersionId=g1)["TagSet"]
    assert got == [{"Key": "gen", "Value": "1"}]
    assert s3.get_object(Bucket="gvers", Key="gc/src")["Body"].read() == b"second"


def test_a_bucket_never_versioned_has_only_the_null_version(node: GatewayNode) -> None:
    s3 = node.client()
    s3.put_object(Bucket=MADE, Key="k", Body=b"only")
    assert s3.get_object(Bucket=MADE, Key="k", VersionId="null")["Body"].read() == b"only"
    for call in (s3.get_object, s3.head_object):
        with pytest.raises(ClientError) as exc:
            call(Bucket=MADE, Key="k", VersionId="3HL4kqtJlcpXroDTDmJ+rmSpXd3dIbrHY")
        assert _code(exc)[1] == 400
    listed = s3.list_object_versions(Bucket=MADE, Prefix="k")["Versions"]
    assert [(v["Key"], v["VersionId"], v["IsLatest"]) for v in listed] == [("k", "null", True)]


# -- versions by id in every operation that names one (issue 38) ------------------------------


def _origin_versions(origin_s3: Any, key: str) -> list[tuple[str, bool]]:
    """The origin's versions and delete markers of key, its latest first: (id, is a marker)."""
    listed = origin_s3.list_object_versions(Bucket=ORIGIN, Prefix=key)
    entries = [(v, False) for v in listed.get("Versions", []) if v["Key"] == key] + [
        (m, True) for m in listed.get("DeleteMarkers", []) if m["Key"] == key
    ]
    entries.sort(key=lambda e: not e[0]["IsLatest"])  # stable: the rest as the origin lists
    return [(e["VersionId"], marker) for e, marker in entries]


def _headers(response: dict[str, Any]) -> dict[str, str]:
    headers: dict[str, str] = response["ResponseMetadata"]["HTTPHeaders"]
    return headers


def test_delete_objects_removes_each_version_named_and_never_the_current_object(
    node: GatewayNode, origin_s3: Any
) -> None:
    s3 = node.client()
    v1, v2, v3 = _versions(origin_s3, ORIGIN, "multi/a", b"a1", b"a2", b"a3")
    (b1,) = _versions(origin_s3, ORIGIN, "multi/b", b"b1")
    _versions(origin_s3, ORIGIN, "multi/c", b"c1")
    for _ in range(4):  # the current versions known to the workers first
        assert s3.get_object(Bucket="vers", Key="multi/a")["Body"].read() == b"a3"

    out = s3.delete_objects(Bucket="vers", Delete={"Objects": [
        {"Key": "multi/a", "VersionId": v1},
        {"Key": "multi/a", "VersionId": v2},
        {"Key": "multi/b", "VersionId": b1},
        {"Key": "multi/c"},
    ]})  # fmt: skip
    assert "Errors" not in out, out["Errors"]
    deleted = {(d["Key"], d.get("VersionId")): d for d in out["Deleted"]}
    assert set(deleted) == {("multi/a", v1), ("multi/a", v2), ("multi/b", b1), ("multi/c", None)}
    marker = _origin_versions(origin_s3, "multi/c")[0]
    assert marker[1] and deleted[("multi/c", None)]["DeleteMarker"] is True
    assert deleted[("multi/c", None)]["DeleteMarkerVersionId"] == marker[0]
    # The versions named are gone at the origin, and only they: no marker hides multi/a.
    assert _origin_versions(origin_s3, "multi/a") == [(v3, False)]
    assert _origin_versions(origin_s3, "multi/b") == []
    for _ in range(8):  # new connections: each worker in turn
        assert s3.get_object(Bucket="vers", Key="multi/a")["Body"].read() == b"a3"
        with pytest.raises(ClientError) as exc:
            s3.get_object(Bucket="vers", Key="multi/a", VersionId=v1)
        assert _code(exc) == ("NoSuchVersion", 404)

    # A delete marker named by id is removed: the object it hid is current again.
    out = s3.delete_objects(
        Bucket="vers", Delete={"Objects": [{"Key": "multi/c", "VersionId": marker[0]}]}
    )
    assert [d.get("VersionId") for d in out["Deleted"]] == [marker[0]]
    assert s3.get_object(Bucket="vers", Key="multi/c")["Body"].read() == b"c1"


def test_delete_objects_naming_a_version_the_key_does_not_have_deletes_nothing(
    node: GatewayNode, origin_s3: Any
) -> None:
    s3 = node.client()
    unknown = "3HL4kqtJlcpXroDTDmJ+rmSpXd3dIbrHY"
    for bucket in (MADE, "plain"):  # a file store; an S3 origin bucket never versioned
        s3.put_object(Bucket=bucket, Key="keep", Body=b"kept")
        s3.put_object(Bucket=bucket, Key="null", Body=b"the one version")
        out = s3.delete_objects(Bucket=bucket, Delete={"Objects": [
            {"Key": "keep", "VersionId": unknown}, {"Key": "null", "VersionId": "null"},
        ]})  # fmt: skip
        assert [(e["Key"], e.get("VersionId"), e["Code"]) for e in out["Errors"]] == [
            ("keep", unknown, "InvalidArgument")
        ], bucket
        assert [(d["Key"], d.get("VersionId")) for d in out["Deleted"]] == [("null", "null")]
        assert s3.get_object(Bucket=bucket, Key="keep")["Body"].read() == b"kept", bucket
        with pytest.raises(ClientError) as exc:
            s3.head_object(Bucket=bucket, Key="null")
        assert _code(exc)[1] == 404
        # DeleteObject answers the same id the same way, and deletes nothing either.
        with pytest.raises(ClientError) as exc:
            s3.delete_object(Bucket=bucket, Key="keep", VersionId=unknown)
        assert _code(exc) == ("InvalidArgument", 400)
        assert s3.get_object(Bucket=bucket, Key="keep")["Body"].read() == b"kept", bucket
    assert origin_s3.get_object(Bucket=PLAIN, Key="keep")["Body"].read() == b"kept"


def test_version_ids_are_said_for_the_current_version_and_delete_markers(
    node: GatewayNode, origin_s3: Any
) -> None:
    s3 = node.client()
    key = "said/obj"
    _, v2 = _versions(origin_s3, ORIGIN, key, b"one", b"two")
    for _ in range(6):  # cold, then known to each worker (new connections)
        assert s3.head_object(Bucket="vers", Key=key)["VersionId"] == v2
        got = s3.get_object(Bucket="vers", Key=key)
        assert got["Body"].read() == b"two" and got["VersionId"] == v2
    made = s3.put_object(Bucket="vers", Key=key, Body=b"three")["VersionId"]
    for _ in range(4):  # the write's version, as the writing worker and the others know it
        assert s3.head_object(Bucket="vers", Key=key)["VersionId"] == made
        assert s3.get_object(Bucket="vers", Key=key, Range="bytes=0-1")["VersionId"] == made

    out = s3.delete_object(Bucket="vers", Key=key)
    marker = _origin_versions(origin_s3, key)[0]
    assert marker[1] and out["DeleteMarker"] is True and out["VersionId"] == marker[0]
    for _ in range(4):
        with pytest.raises(ClientError) as exc:
            s3.head_object(Bucket="vers", Key=key)
        assert _code(exc)[1] == 404
        headers = exc.value.response["ResponseMetadata"]["HTTPHeaders"]
        assert headers.get("x-amz-delete-marker") == "true", headers
        assert headers.get("x-amz-version-id") == marker[0], headers
        for call in (s3.head_object, s3.get_object):
            with pytest.raises(ClientError) as exc:
                call(Bucket="vers", Key=key, VersionId=marker[0])
            assert _code(exc)[1] == 405
            assert _headers(exc.value.response).get("x-amz-delete-marker") == "true"
            assert _headers(exc.value.response).get("x-amz-version-id") == marker[0]
    # A bucket that keeps one version of a key says no version id.
    s3.put_object(Bucket=MADE, Key=key, Body=b"x")
    assert "VersionId" not in s3.head_object(Bucket=MADE, Key=key)
    assert "x-amz-version-id" not in _headers(s3.delete_object(Bucket=MADE, Key=key))


def test_a_version_named_by_id_is_copied(node: GatewayNode, origin_s3: Any) -> None:
    s3 = node.client()
    key = "copy/src"
    old, new = b"old bytes " * 100_000, b"new"  # 1 MB: a block and a bit of the next
    v1, v2 = _versions(origin_s3, ORIGIN, key, old, new)
    origin_s3.put_object_tagging(Bucket=ORIGIN, Key=key, VersionId=v1,
                                 Tagging={"TagSet": [{"Key": "v", "Value": "1"}]})  # fmt: skip
    origin_s3.put_object_tagging(Bucket=ORIGIN, Key=key, VersionId=v2,
                                 Tagging={"TagSet": [{"Key": "v", "Value": "2"}]})  # fmt: skip
    source = {"Bucket": "vers", "Key": key, "VersionId": v1}
    for bucket, dst in (("vers", "copy/dst"), (MADE, "copy/dst"), ("vers", key)):
        out = s3.copy_object(Bucket=bucket, Key=dst, CopySource=source)
        assert out["CopySourceVersionId"] == v1, (bucket, dst)
        assert s3.get_object(Bucket=bucket, Key=dst)["Body"].read() == old, (bucket, dst)
        tags = s3.get_object_tagging(Bucket=bucket, Key=dst)["TagSet"]
        assert tags == [{"Key": "v", "Value": "1"}], (bucket, dst)
    # Copied onto its own key, the old version is the current one again (a new version).
    assert s3.get_object(Bucket="vers", Key=key)["VersionId"] not in (v1, v2)
    # The current version of a versioned source is said too.
    current = s3.head_object(Bucket="vers", Key=key)["VersionId"]
    out = s3.copy_object(Bucket=MADE, Key="copy/cur", CopySource={"Bucket": "vers", "Key": key})
    assert out["CopySourceVersionId"] == current and "VersionId" not in out

    # A part copied from a version is that version's bytes.
    upload = s3.create_multipart_upload(Bucket=MADE, Key="copy/part")["UploadId"]
    part = s3.upload_part_copy(Bucket=MADE, Key="copy/part", UploadId=upload, PartNumber=1,
                               CopySource=source, CopySourceRange="bytes=10-19")  # fmt: skip
    assert part["CopySourceVersionId"] == v1
    s3.complete_multipart_upload(Bucket=MADE, Key="copy/part", UploadId=upload, MultipartUpload={
        "Parts": [{"ETag": part["CopyPartResult"]["ETag"], "PartNumber": 1}]})  # fmt: skip
    assert s3.get_object(Bucket=MADE, Key="copy/part")["Body"].read() == old[10:20]

    s3.put_object(Bucket="vers", Key="copy/gone", Body=b"gone")
    marker = s3.delete_object(Bucket="vers", Key="copy/gone")["VersionId"]
    for bad, code in (
        ({"Bucket": "vers", "Key": key, "VersionId": "no-such-version"}, ("NoSuchVersion", 404)),
        ({"Bucket": "vers", "Key": "copy/gone", "VersionId": marker}, ("InvalidRequest", 400)),
        ({"Bucket": MADE, "Key": "copy/dst", "VersionId": "3HL4kqtJlcpXroDTDmJ"},
         ("InvalidArgument", 400)),
    ):  # fmt: skip
        with pytest.raises(ClientError) as exc:
            s3.copy_object(Bucket=MADE, Key="copy/bad", CopySource=bad)
        assert _code(exc) == code, bad
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=MADE, Key="copy/bad")
    assert _code(exc)[1] == 404
    # A bucket that keeps one version has the null one.
    null = {"Bucket": MADE, "Key": "copy/dst", "VersionId": "null"}
    s3.copy_object(Bucket=MADE, Key="copy/null", CopySource=null)
    assert s3.get_object(Bucket=MADE, Key="copy/null")["Body"].read() == old


def test_a_version_named_by_id_is_tagged(node: GatewayNode, origin_s3: Any) -> None:
    s3 = node.client()
    key = "tags/obj"
    v1, v2 = _versions(origin_s3, ORIGIN, key, b"one", b"two")
    s3.put_object_tagging(Bucket="vers", Key=key, VersionId=v1,
                          Tagging={"TagSet": [{"Key": "old", "Value": "yes"}]})  # fmt: skip
    assert origin_s3.get_object_tagging(Bucket=ORIGIN, Key=key, VersionId=v1)["TagSet"] == [
        {"Key": "old", "Value": "yes"}
    ]
    assert origin_s3.get_object_tagging(Bucket=ORIGIN, Key=key, VersionId=v2)["TagSet"] == []
    got = s3.get_object_tagging(Bucket="vers", Key=key, VersionId=v1)
    assert got["TagSet"] == [{"Key": "old", "Value": "yes"}] and got["VersionId"] == v1
    assert s3.get_object_tagging(Bucket="vers", Key=key)["TagSet"] == []
    s3.delete_object_tagging(Bucket="vers", Key=key, VersionId=v1)
    assert origin_s3.get_object_tagging(Bucket=ORIGIN, Key=key, VersionId=v1)["TagSet"] == []
    with pytest.raises(ClientError) as exc:
        s3.get_object_tagging(Bucket="vers", Key=key, VersionId="no-such-version")
    assert _code(exc) == ("NoSuchVersion", 404)
    with pytest.raises(ClientError) as exc:
        s3.get_object_tagging(Bucket=MADE, Key="k", VersionId="3HL4kqtJlcpXroDTDmJ")
    assert _code(exc) == ("InvalidArgument", 400)


def _with_query(s3: Any, operation: str, extra: str) -> None:
    """Append `extra` to the query of each `operation` request of this client, before it is
    signed (so that the node judges the query, not the signature)."""

    def add(request: Any, **_: Any) -> None:
        request.url += extra

    s3.meta.events.register(f"before-sign.s3.{operation}", add)


def test_a_version_id_given_twice_is_refused(node: GatewayNode, origin_s3: Any) -> None:
    v1, v2 = _versions(origin_s3, ORIGIN, "twice/obj", b"one", b"two")
    for operation, call in (
        ("GetObject", lambda c: c.get_object(Bucket="vers", Key="twice/obj", VersionId=v1)),
        ("HeadObject", lambda c: c.head_object(Bucket="vers", Key="twice/obj", VersionId=v1)),
        ("DeleteObject", lambda c: c.delete_object(Bucket="vers", Key="twice/obj", VersionId=v1)),
    ):
        s3 = node.client()
        _with_query(s3, operation, f"&versionId={v2}")
        with pytest.raises(ClientError) as exc:
            call(s3)
        assert _code(exc)[1] == 400, operation
        if operation != "HeadObject":
            assert _code(exc)[0] == "InvalidArgument"
    assert sorted(v for v, _ in _origin_versions(origin_s3, "twice/obj")) == sorted([v1, v2])


def test_delete_objects_of_every_version_of_keys_leaves_none(
    node: GatewayNode, origin_s3: Any
) -> None:
    s3 = node.client()
    # Versions past moto's 10 MiB in memory (kept in files, slower to drop) widen its window.
    big = 11 * MiB
    for round_ in range(3):  # a race at the origin is looked for by repetition
        keys = [f"all/{round_}/{k}" for k in range(2)]
        bodies = (b"1" * big, b"2" * big, b"3" * 1000)
        named = [
            {"Key": key, "VersionId": v}
            for key in keys
            for v in _versions(origin_s3, ORIGIN, key, *bodies)
        ]
        out = s3.delete_objects(Bucket="vers", Delete={"Objects": named, "Quiet": True})
        assert "Errors" not in out, out["Errors"]
        left = origin_s3.list_object_versions(Bucket=ORIGIN, Prefix=f"all/{round_}/")
        assert "Versions" not in left and "DeleteMarkers" not in left, (round_, left)
