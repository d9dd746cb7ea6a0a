"""The catalog through gateway processes: listings, HEADs and cold GETs of a synced prefix
answered without the origin; writes through one node listed through another at once; a cold
GET through a three-node fleet costs one origin request; changes behind the gateway's back
found by a re-crawl, and within seconds by S3 event notifications through SQS."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import boto3
import pytest
import sqlalchemy as sa
from botocore.exceptions import ClientError

from gateway.meta.catalog import catalog_syncs
from gateway.meta.tables import mounts
from tests.support.gateway import GatewayNode, start_gateway
from tests.support.net import eventually
from tests.support.origin import CountingProxy, MotoServer
from tests.support.postgres import database_outage, rows, temp_database

# Gateway processes, several on PostgreSQL for the fleet.
pytestmark = pytest.mark.slow

KEYS = [
    "a", "a/b", "a/b/c", "a/c", "a-/x", "a-/y/z", "b", "b c", "b+c", "b%20c", "é/1", "é/2",
    "\uff21", "\uff21/x", "😀", "😀/x", "z/" + "y" * 50,
] + [f"many/{i:03d}" for i in range(120)]  # fmt: skip
_names = itertools.count()


def _bucket(kind: str) -> str:
    return f"catalog-{kind}-{next(_names)}"


@pytest.fixture(scope="module")
def proxy(moto_server: MotoServer) -> Iterator[CountingProxy]:
    p = CountingProxy(moto_server.url)
    yield p
    p.stop()


def _mount(node: GatewayNode, bucket: str, proxy: CountingProxy, *options: str) -> None:
    opts = ["-o", f"endpoint_url={proxy.url}", "-o", "access_key=ak", "-o", "secret_key=sk"]
    for option in options:
        opts += ["-o", option]
    node.cli("mount", "add", bucket, f"s3://{bucket}", *opts)


def _fill(s3: Any, bucket: str, keys: list[str]) -> None:
    s3.create_bucket(Bucket=bucket)
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=f"body of {key}".encode())


def _pages(client: Any, bucket: str, version: int = 2, **args: Any) -> list[Any]:
    """Every page of a listing as (keys with size and ETag, common prefixes, truncated)."""
    pages = []
    args = {"Bucket": bucket, **args}
    while True:
        got = client.list_objects_v2(**args) if version == 2 else client.list_objects(**args)
        pages.append(
            (
                [(o["Key"], o["Size"], o["ETag"]) for o in got.get("Contents", [])],
                [p["Prefix"] for p in got.get("CommonPrefixes", [])],
                got["IsTruncated"],
            )
        )
        if not got["IsTruncated"]:
            return pages
        if version == 2:
            args["ContinuationToken"] = got["NextContinuationToken"]
            args.pop("StartAfter", None)
        else:
            args["Marker"] = got.get("NextMarker") or got["Contents"][-1]["Key"]


def _from_catalog(node: GatewayNode, bucket: str, proxy: CountingProxy, prefix: str = "") -> bool:
    """Whether a listing of the bucket reaches the origin no more (the node knows the prefix
    is synced)."""
    before = proxy.count(None, f"/{bucket}")
    node.client().list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=5)
    return proxy.count(None, f"/{bucket}") == before


@pytest.fixture(scope="module")
def node(module_dir: Path) -> Iterator[GatewayNode]:
    gateway = start_gateway(module_dir / "single", args=("--no-access-log",))
    yield gateway
    gateway.stop()


# -- one node, SQLite -------------------------------------------------------------------


LISTINGS: list[dict[str, Any]] = [
    {},
    {"MaxKeys": 7},
    {"Delimiter": "/", "MaxKeys": 3},
    {"Delimiter": "-/", "MaxKeys": 2},
    {"Delimiter": "/", "Prefix": "a/", "MaxKeys": 1},
    {"Delimiter": "/", "StartAfter": "a/b", "MaxKeys": 4},
    {"StartAfter": "b", "MaxKeys": 50},
    {"Prefix": "many/", "MaxKeys": 1000},
    {"Prefix": "many/", "StartAfter": "many/050", "MaxKeys": 33},
    {"Prefix": "nothing-here/"},
    {"Delimiter": "😀", "MaxKeys": 2},
    {"EncodingType": "url", "Delimiter": " ", "MaxKeys": 2},
]


def test_a_synced_bucket_lists_as_the_origin_without_asking_it(
    node: GatewayNode, proxy: CountingProxy, origin_s3: Any
) -> None:
    bucket = _bucket("list")
    _fill(origin_s3, bucket, KEYS)
    _mount(node, bucket, proxy, "catalog=on")
    eventually(lambda: bucket in node.buckets())
    out = node.cli("sync", f"{bucket}", "--page-size", "50")
    assert f"{len(KEYS)} keys listed, {len(KEYS)} written, 0 removed" in out.stdout
    eventually(lambda: _from_catalog(node, bucket, proxy))
    client = node.client()
    before = proxy.count(None, f"/{bucket}")
    for args in LISTINGS:
        assert _pages(client, bucket, **args) == _pages(origin_s3, bucket, **args), args
    # ListObjects (v1): the origin's own v1 without a delimiter (moto pages common prefixes of
    # v1 wrongly), with one against its v2, which S3 pages alike.
    assert _pages(client, bucket, 1, MaxKeys=9) == _pages(origin_s3, bucket, 1, MaxKeys=9)
    v1 = _pages(client, bucket, 1, Delimiter="/", MaxKeys=3)
    assert v1 == _pages(origin_s3, bucket, 2, Delimiter="/", MaxKeys=3)
    assert proxy.count(None, f"/{bucket}") == before  # not one request reached the origin
    # A second sync writes nothing: nothing changed.
    out = node.cli("sync", f"{bucket}", "--quiet")
    assert f"{len(KEYS)} keys listed, 0 written, 0 removed" in out.stdout
    states = json.loads(node.cli("syncs", bucket, "--json").stdout)
    assert [(st["prefix"], st["listed"], st["changed"], st["started_at"]) for st in states] == [
        ("", len(KEYS), 0, None)
    ]
    assert states[0]["synced_at"] and bucket in node.cli("syncs").stdout


def test_a_load_of_a_catalog_mount_syncs_the_prefix_and_lists_its_items_from_there(
    node: GatewayNode, proxy: CountingProxy, origin_s3: Any
) -> None:
    bucket = _bucket("load")
    _fill(origin_s3, bucket, KEYS)
    _mount(node, bucket, proxy, "catalog=on")
    eventually(lambda: bucket in node.buckets())
    ended = json.loads(node.cli("load", f"{bucket}/many/", "--format", "json").stdout)
    assert ended["state"] == "done" and ended["total_objects"] == 120
    states = json.loads(node.cli("syncs", bucket, "--json").stdout)
    assert [(st["prefix"], st["listed"], st["changed"]) for st in states] == [("many/", 120, 120)]
    assert states[0]["synced_at"]
    eventually(lambda: _from_catalog(node, bucket, proxy, "many/"))
    proxy.reset()
    got = node.client().get_object(Bucket=bucket, Key="many/007")
    assert got["Body"].read() == b"body of many/007"
    assert got["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit"
    # No byte fetched again (on a busy machine the TTL may have run out since the load: then
    # the version alone is asked, as on any mount).
    assert [
        r.path for r in proxy.requests if r.method == "GET" and "list-type" not in r.query
    ] == []
    # Changed behind the gateway's back: the next load re-syncs (writing only the change)
    # and loads the new key, whose listing came from the catalog.
    origin_s3.put_object(Bucket=bucket, Key="many/500", Body=b"new")
    origin_s3.delete_object(Bucket=bucket, Key="many/000")
    again = json.loads(node.cli("load", f"{bucket}/many/", "--format", "json").stdout)
    assert again["state"] == "done" and again["total_objects"] == 120
    assert again["loaded_objects"] == 1  # many/500; the others were cached
    states = json.loads(node.cli("syncs", bucket, "--json").stdout)
    assert [(st["prefix"], st["listed"], st["changed"], st["removed"]) for st in states] == [
        ("many/", 120, 1, 1)
    ]
    shown = node.cli("jobs", "show", str(again["id"])).stdout
    assert "state:      done" in shown


def test_a_load_waits_for_the_sync_of_its_prefix_that_another_run_holds(
    node: GatewayNode, proxy: CountingProxy, origin_s3: Any
) -> None:
    bucket = _bucket("held")
    _fill(origin_s3, bucket, KEYS[:5])
    _mount(node, bucket, proxy, "catalog=on")
    eventually(lambda: bucket in node.buckets())
    engine = sa.create_engine(f"sqlite:///{node.data_dir / 'gateway.db'}")
    now = datetime.now(UTC)
    held = catalog_syncs.c.prefix == ""
    with engine.begin() as conn:  # a `gateway sync` elsewhere, under way
        mount_id = conn.execute(sa.select(mounts.c.id).where(mounts.c.bucket == bucket)).scalar()
        held &= catalog_syncs.c.mount_id == mount_id
        conn.execute(
            sa.insert(catalog_syncs).values(
                mount_id=mount_id, prefix="", started_at=now, owner="elsewhere:1:ab",
                lease_until=now + timedelta(hours=1),
            )
        )  # fmt: skip
    job = json.loads(node.cli("load", bucket, "--detach", "--format", "json").stdout)

    def message() -> str:
        return str(node.job(job["id"])["message"])

    eventually(lambda: "being synced by elsewhere:1:ab" in message())
    with engine.begin() as conn:  # that run stops; the job's sync resumes it
        conn.execute(sa.update(catalog_syncs).where(held).values(owner=None, lease_until=None))
    engine.dispose()
    ended = json.loads(node.cli("jobs", "wait", str(job["id"]), "--format", "json").stdout)
    assert ended["state"] == "done" and ended["total_objects"] == 5
    states = json.loads(node.cli("syncs", bucket, "--json").stdout)
    assert [(st["prefix"], st["listed"], st["owner"]) for st in states] == [("", 5, None)]


def test_a_listing_outside_the_synced_prefix_goes_to_the_origin(
    node: GatewayNode, proxy: CountingProxy, origin_s3: Any
) -> None:
    bucket = _bucket("prefix")
    _fill(origin_s3, bucket, KEYS)
    _mount(node, bucket, proxy, "catalog=on")
    eventually(lambda: bucket in node.buckets())
    node.cli("sync", f"{bucket}/many/")
    eventually(lambda: _from_catalog(node, bucket, proxy, "many/1"))
    assert not _from_catalog(node, bucket, proxy, "a")
    assert _pages(node.client(), bucket, Delimiter="/") == _pages(origin_s3, bucket, Delimiter="/")


def test_head_and_cold_get_of_a_catalogued_key_ask_the_origin_once(
    node: GatewayNode, proxy: CountingProxy, origin_s3: Any
) -> None:
    bucket = _bucket("head")
    _fill(origin_s3, bucket, KEYS[:10])
    # A row is trusted for the mount's TTL from when it was written (a catalog's bytes are as
    # fresh as any mount's: test_a_catalog_mount_serves_no_bytes_older_than_its_ttl).
    _mount(node, bucket, proxy, "catalog=on", "metadata_ttl=3600")
    eventually(lambda: bucket in node.buckets())
    node.cli("sync", bucket)
    eventually(lambda: _from_catalog(node, bucket, proxy))
    client = node.client()
    # A listing tells no content type: the first HEAD asks the origin, and the catalog keeps
    # its answer; every HEAD after it is the catalog's (or the node's memory's).
    proxy.reset()
    first = client.head_object(Bucket=bucket, Key="a/b")
    mine = f"/{bucket}/"  # the module's other mounts (a re-crawl) may use the origin meanwhile
    assert proxy.count("HEAD", mine) == 1
    for _ in range(3):
        again = client.head_object(Bucket=bucket, Key="a/b")
        assert again["ETag"] == first["ETag"] and again["ContentLength"] == first["ContentLength"]
    assert proxy.count(None, mine) == 1
    # A cold GET of a key the catalog knows fully: the block fetch alone, no HEAD.
    proxy.reset()
    assert client.get_object(Bucket=bucket, Key="a/b")["Body"].read() == b"body of a/b"
    assert proxy.count("HEAD", mine) == 0 and proxy.count("GET", mine) == 1
    assert [r.if_match for r in proxy.requests if mine in r.path] == [first["ETag"]]
    # One it knows from the listing only: opened with one request, as without a catalog.
    proxy.reset()
    assert client.get_object(Bucket=bucket, Key="a/c")["Body"].read() == b"body of a/c"
    assert proxy.count(None, mine) == 1


def test_a_read_of_a_version_gone_behind_the_gateway_answers_the_truth_and_corrects_it(
    node: GatewayNode, proxy: CountingProxy, origin_s3: Any
) -> None:
    bucket = _bucket("truth")
    _fill(origin_s3, bucket, ["k/old", "k/gone"])
    _mount(node, bucket, proxy, "catalog=on", "metadata_ttl=0")
    eventually(lambda: bucket in node.buckets())
    node.cli("sync", bucket)
    eventually(lambda: _from_catalog(node, bucket, proxy))
    client = node.client()
    for key in ("k/old", "k/gone"):
        client.head_object(Bucket=bucket, Key=key)  # the catalog knows them fully now
    origin_s3.put_object(Bucket=bucket, Key="k/old", Body=b"a new body, longer")
    origin_s3.delete_object(Bucket=bucket, Key="k/gone")
    assert client.get_object(Bucket=bucket, Key="k/old")["Body"].read() == b"a new body, longer"
    with pytest.raises(ClientError) as caught:
        client.get_object(Bucket=bucket, Key="k/gone")
    assert caught.value.response["Error"]["Code"] == "NoSuchKey"
    listed = client.list_objects_v2(Bucket=bucket)["Contents"]
    assert [(o["Key"], o["Size"]) for o in listed] == [("k/old", len(b"a new body, longer"))]


def test_a_catalog_mount_serves_no_bytes_older_than_its_ttl(
    node: GatewayNode, proxy: CountingProxy, origin_s3: Any
) -> None:
    """Found from outside: a catalog=on mount served an object overwritten at the origin
    with its old bytes, as a hit, for as long as nobody synced (12.5 minutes in one probe),
    where the same bucket without the catalog served the new version within the TTL. A
    catalog is for listings: a hit of a catalog mount older than metadata_ttl is revalidated,
    as on any mount. Reads run until the new bytes come back; none sent more than the TTL
    (+1 s) after the overwrite may have the old ones."""
    bucket = _bucket("fresh")
    _fill(origin_s3, bucket, ["d/k", "d/other"])
    ttl = 1.0
    _mount(node, bucket, proxy, "catalog=on", f"metadata_ttl={ttl:g}")
    eventually(lambda: bucket in node.buckets())
    node.cli("sync", bucket)
    eventually(lambda: _from_catalog(node, bucket, proxy))
    client = node.client()
    for _ in range(2):  # the first fills the cache, the second is a hit
        assert client.get_object(Bucket=bucket, Key="d/k")["Body"].read() == b"body of d/k"
    origin_s3.put_object(Bucket=bucket, Key="d/k", Body=b"the new body")
    overwritten = time.monotonic()
    late: list[float] = []

    def new_bytes() -> bool:
        sent = time.monotonic()
        body = client.get_object(Bucket=bucket, Key="d/k")["Body"].read()
        if body != b"the new body":
            if sent - overwritten > ttl + 1:
                late.append(sent - overwritten)
            return False
        return True

    eventually(new_bytes, timeout=30, interval=0.05)
    assert not late, f"old bytes served {max(late):.1f} s after the overwrite"
    node.cli("mount", "remove", bucket)


def test_a_change_behind_the_gateway_is_listed_after_a_recrawl(
    node: GatewayNode, proxy: CountingProxy, origin_s3: Any
) -> None:
    bucket = _bucket("recrawl")
    _fill(origin_s3, bucket, ["d/1", "d/2", "d/3"])
    _mount(node, bucket, proxy, "catalog=on", "catalog_ttl=1")
    eventually(lambda: bucket in node.buckets())
    node.cli("sync", bucket)
    eventually(lambda: _from_catalog(node, bucket, proxy))
    origin_s3.put_object(Bucket=bucket, Key="d/4", Body=b"new")
    origin_s3.delete_object(Bucket=bucket, Key="d/1")

    def listed() -> list[str]:
        return [o["Key"] for o in node.client().list_objects_v2(Bucket=bucket)["Contents"]]

    eventually(lambda: listed() == ["d/2", "d/3", "d/4"], timeout=20)
    # (A re-crawl may be listing the origin at any moment now: looked at until none is.)
    eventually(lambda: _from_catalog(node, bucket, proxy))
    node.cli("mount", "remove", bucket)  # no more re-crawls beside the other tests


def test_a_change_behind_the_gateway_is_listed_within_seconds_by_notification(
    node: GatewayNode, proxy: CountingProxy, origin_s3: Any, moto_server: MotoServer
) -> None:
    # moto delivers S3 event notifications to its own SQS queues, in S3's message format.
    bucket = _bucket("notify")
    _fill(origin_s3, bucket, ["n/1", "n/2"])
    sqs = boto3.client(
        "sqs", endpoint_url=moto_server.url, region_name="us-east-1",
        aws_access_key_id="ak", aws_secret_access_key="sk",
    )  # fmt: skip
    queue = sqs.create_queue(QueueName=bucket)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]
    origin_s3.put_bucket_notification_configuration(
        Bucket=bucket,
        NotificationConfiguration={
            "QueueConfigurations": [
                {
                    "QueueArn": arn["QueueArn"],
                    "Events": ["s3:ObjectCreated:*", "s3:ObjectRemoved:*"],
                }
            ]
        },
    )
    # The queue is read straight from moto (SQS), the bucket through the counting proxy.
    queue_url = queue.replace(queue.split("/")[2], moto_server.url.split("/")[2])
    _mount(node, bucket, proxy, "catalog=on", f"catalog_queue={queue_url}")
    eventually(lambda: bucket in node.buckets())
    node.cli("sync", bucket)
    eventually(lambda: _from_catalog(node, bucket, proxy))
    client = node.client()
    assert client.get_object(Bucket=bucket, Key="n/2")["Body"].read() == b"body of n/2"
    origin_s3.put_object(Bucket=bucket, Key="n/3 with space+plus", Body=b"three")
    origin_s3.put_object(Bucket=bucket, Key="n/2", Body=b"two, rewritten")
    origin_s3.delete_object(Bucket=bucket, Key="n/1")

    def listed() -> list[tuple[str, int]]:
        got = client.list_objects_v2(Bucket=bucket)["Contents"]
        return [(o["Key"], o["Size"]) for o in got]

    want = [("n/2", len(b"two, rewritten")), ("n/3 with space+plus", 5)]
    eventually(lambda: listed() == want, timeout=10)
    assert _from_catalog(node, bucket, proxy)
    # The node forgot the version it had read: the rewritten one is served.
    assert client.get_object(Bucket=bucket, Key="n/2")["Body"].read() == b"two, rewritten"
    node.cli("mount", "remove", bucket)  # its consumer stops polling


# -- a fleet on PostgreSQL --------------------------------------------------------------

FLEET_SECRET = "catalog-fleet-secret"


@pytest.fixture(scope="module")
def fleet(module_dir: Path) -> Iterator[list[GatewayNode]]:
    from cryptography.fernet import Fernet

    from tests.support.net import free_port

    env = {"GATEWAY_ENCRYPTION_KEY": Fernet.generate_key().decode()}
    with temp_database() as url:
        nodes: list[GatewayNode] = []
        try:
            for i in range(3):
                args = (
                    "--fleet-secret", FLEET_SECRET, "--internal-port", str(free_port()),
                    "--heartbeat-interval", "0.5", "--heartbeat-timeout", "3",
                    "--cache-block-size", "1MiB", "--node-id", f"cat-{i}", "--no-access-log",
                )  # fmt: skip
                nodes.append(
                    start_gateway(module_dir / f"fleet-{i}", database_url=url, env=env, args=args)
                )
            ids = {f"cat-{i}" for i in range(3)}
            eventually(lambda: all(_heard(n) == ids for n in nodes), timeout=30)
            yield nodes
        finally:
            for n in nodes:
                n.stop()


def _heard(node: GatewayNode) -> set[str]:
    known: set[str] = set()
    for line in node.log().splitlines():
        if '"fleet changed"' in line:
            change = json.loads(line)
            known = (known | set(change["joined"])) - set(change["left"])
    return known


def _fleet_mount(
    fleet: list[GatewayNode], bucket: str, proxy: CountingProxy, ttl: str = "600"
) -> None:
    _mount(fleet[0], bucket, proxy, "catalog=on", f"metadata_ttl={ttl}")
    for n in fleet:
        eventually(lambda n=n: bucket in n.buckets())
    fleet[0].cli("sync", bucket, "--quiet")
    for n in fleet:
        eventually(lambda n=n: _from_catalog(n, bucket, proxy))


def test_writes_through_one_node_are_listed_through_another_at_once(
    fleet: list[GatewayNode], proxy: CountingProxy, origin_s3: Any
) -> None:
    bucket = _bucket("fleet-writes")
    _fill(origin_s3, bucket, ["w/0"])
    _fleet_mount(fleet, bucket, proxy)
    a, b = fleet[0].client(), fleet[1].client()

    def keys(client: Any) -> list[tuple[str, int]]:
        got = client.list_objects_v2(Bucket=bucket, Prefix="w/").get("Contents", [])
        return [(o["Key"], o["Size"]) for o in got]

    a.put_object(Bucket=bucket, Key="w/1", Body=b"one")
    assert keys(b) == [("w/0", len(b"body of w/0")), ("w/1", 3)]
    a.copy_object(Bucket=bucket, Key="w/2", CopySource={"Bucket": bucket, "Key": "w/1"})
    assert keys(b) == [("w/0", 11), ("w/1", 3), ("w/2", 3)]
    upload = a.create_multipart_upload(Bucket=bucket, Key="w/3")["UploadId"]
    part = a.upload_part(Bucket=bucket, Key="w/3", UploadId=upload, PartNumber=1, Body=b"xyz")
    a.complete_multipart_upload(
        Bucket=bucket, Key="w/3", UploadId=upload,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]},
    )  # fmt: skip
    a.delete_object(Bucket=bucket, Key="w/0")
    assert keys(b) == [("w/1", 3), ("w/2", 3), ("w/3", 3)]
    a.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "w/1"}, {"Key": "w/2"}]})
    assert keys(fleet[2].client()) == [("w/3", 3)]
    # The origin agrees, and the listings came from the catalog.
    assert keys(origin_s3) == [("w/3", 3)]
    assert _from_catalog(fleet[2], bucket, proxy)


def _db_rows(url: str, sql: str, *args: object) -> list[tuple[Any, ...]]:
    return [tuple(row.values()) for row in rows(url, sql, *args)]


def test_a_write_to_an_immutable_mount_has_its_rows_and_catalog_row_when_answered(
    fleet: list[GatewayNode], proxy: CountingProxy, origin_s3: Any
) -> None:
    bucket = _bucket("fleet-immutable")
    _fill(origin_s3, bucket, ["i/0"])
    _fleet_mount(fleet, bucket, proxy, ttl="-1")
    url = fleet[0].database_url
    assert url is not None
    [(mount_id,)] = _db_rows(url, "SELECT id FROM mounts WHERE bucket = $1", bucket)

    def rows(key: str) -> list[Any]:
        """The key's ETag in its row of object versions, read straight after the answer."""
        return [e for (e,) in _db_rows(url, _ETAG_OF, mount_id, key)]

    a = fleet[0].client()
    etag = a.put_object(Bucket=bucket, Key="i/1", Body=b"one")["ETag"]
    assert rows("i/1") == [etag]
    upload = a.create_multipart_upload(Bucket=bucket, Key="i/2")["UploadId"]
    part = a.upload_part(Bucket=bucket, Key="i/2", UploadId=upload, PartNumber=1, Body=b"xy")
    done = a.complete_multipart_upload(
        Bucket=bucket, Key="i/2", UploadId=upload,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]},
    )  # fmt: skip
    assert rows("i/2") == [done["ETag"]]
    assert _db_rows(url, "SELECT 1 FROM multipart_uploads WHERE upload_id = $1", upload) == []
    listed = fleet[1].client().list_objects_v2(Bucket=bucket, Prefix="i/")["Contents"]
    assert [o["Key"] for o in listed] == ["i/0", "i/1", "i/2"]
    a.delete_object(Bucket=bucket, Key="i/1")
    assert rows("i/1") == []


_ETAG_OF = "SELECT etag FROM object_versions WHERE mount_id = $1 AND key = $2"


def test_a_cold_get_of_a_catalogued_object_through_the_fleet_is_one_origin_request(
    fleet: list[GatewayNode], proxy: CountingProxy, origin_s3: Any
) -> None:
    bucket = _bucket("fleet-cold")
    keys = [f"c/{i:02d}" for i in range(30)]
    _fill(origin_s3, bucket, keys)
    _fleet_mount(fleet, bucket, proxy)
    # The catalog knows all of half of them (a HEAD through node 0 asked the origin once),
    # and the other half from the listing alone.
    for key in keys[:15]:
        fleet[0].client().head_object(Bucket=bucket, Key=key)
    proxy.reset()
    for i, key in enumerate(keys):
        got = fleet[1 + i % 2].client().get_object(Bucket=bucket, Key=key)["Body"].read()
        assert got == f"body of {key}".encode()
    assert proxy.count("HEAD", f"/{bucket}/") == 0
    assert proxy.count("GET", f"/{bucket}/c/") == len(keys)  # one a key, fleet-wide
    # Known fully, a key's cold GET was the block fetch on the catalogued version (If-Match);
    # known from the listing only, one request that opened it.
    etags = {k: origin_s3.head_object(Bucket=bucket, Key=k)["ETag"] for k in keys}
    gets = {
        unquote(r.path).split(f"/{bucket}/", 1)[1]: r
        for r in proxy.requests
        if f"/{bucket}/" in r.path
    }
    assert all(gets[k].if_match == etags[k] for k in keys[:15])
    assert all(gets[k].if_match is None for k in keys[15:])
    proxy.reset()
    for i, key in enumerate(keys):
        fleet[i % 3].client().get_object(Bucket=bucket, Key=key)["Body"].read()
    assert proxy.count(None, f"/{bucket}/") == 0


def test_with_its_database_away_a_catalog_mount_lists_and_reads_from_the_origin(
    tmp_path: Path, proxy: CountingProxy, origin_s3: Any
) -> None:
    bucket = _bucket("outage")
    _fill(origin_s3, bucket, KEYS[:20])
    with temp_database() as url:
        node = start_gateway(tmp_path / "pg", database_url=url, args=("--no-access-log",))
        try:
            _mount(node, bucket, proxy, "catalog=on", "metadata_ttl=0")
            eventually(lambda: bucket in node.buckets())
            node.cli("sync", bucket, "--quiet")
            eventually(lambda: _from_catalog(node, bucket, proxy))
            client = node.client()
            first = client.list_objects_v2(Bucket=bucket, MaxKeys=6)  # the catalog's token
            with database_outage(url):
                # A listing begun from the catalog goes on from the origin.
                rest = client.list_objects_v2(
                    Bucket=bucket, MaxKeys=1000, ContinuationToken=first["NextContinuationToken"]
                )
                listed = [o["Key"] for o in first["Contents"] + rest["Contents"]]
                assert listed == sorted(KEYS[:20], key=lambda k: k.encode())
                before = proxy.count(None, f"/{bucket}")
                args = {"Delimiter": "/", "MaxKeys": 4}
                assert _pages(client, bucket, **args) == _pages(origin_s3, bucket, **args)
                head = client.head_object(Bucket=bucket, Key="a/b")
                assert head["ContentLength"] == len(b"body of a/b")
                assert client.get_object(Bucket=bucket, Key="b c")["Body"].read() == b"body of b c"
                assert proxy.count(None, f"/{bucket}") > before  # the origin answered
            eventually(lambda: _from_catalog(node, bucket, proxy), timeout=30)
        finally:
            node.stop()
