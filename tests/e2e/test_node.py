"""A node's life on the command line: mounts and keys changed while it runs, restarts that
keep the cache, secrets that never show, PostgreSQL as the metadata store, and aws-cli."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError

from tests.support.gateway import BIN, GatewayNode, run_cli, server_args, start_gateway
from tests.support.net import eventually
from tests.support.origin import CountingProxy
from tests.support.postgres import database_outage, temp_database

ORIGIN_SECRET = "origin-secret-never-shown-9f8e7d"


@pytest.fixture(scope="module")
def bucket(origin_s3: Any) -> str:
    origin_s3.create_bucket(Bucket="origin-node")
    for i in range(3):
        origin_s3.put_object(Bucket="origin-node", Key=f"set/item-{i}.bin", Body=bytes([i]) * 5000)
    return "origin-node"


def _mount_s3(node: GatewayNode, name: str, origin: CountingProxy, *extra: str) -> None:
    node.cli(
        "mount", "add", name, "s3://origin-node/set", "-o", f"endpoint_url={origin.url}",
        "-o", "access_key=origin-ak", "-o", f"secret_key={ORIGIN_SECRET}", *extra,
    )  # fmt: skip


def test_mount_added_and_removed_while_running(
    tmp_path: Path, origin: CountingProxy, bucket: str
) -> None:
    node = start_gateway(tmp_path / "n")
    try:
        s3 = node.client()
        _mount_s3(node, "live", origin)
        got = eventually(lambda: s3.get_object(Bucket="live", Key="item-1.bin"))
        assert got["Body"].read() == b"\x01" * 5000
        node.cli("mount", "remove", "live")

        def gone() -> bool:
            try:
                s3.head_bucket(Bucket="live")
            except ClientError as exc:
                return bool(exc.response["ResponseMetadata"]["HTTPStatusCode"] == 404)
            return False

        eventually(gone)
        removed_again = node.cli("mount", "remove", "live", check=False)
        assert removed_again.returncode != 0 and "not mounted" in removed_again.stderr
    finally:
        node.stop()


def test_mount_secrets_are_never_printed_or_logged(
    tmp_path: Path, origin: CountingProxy, bucket: str
) -> None:
    node = start_gateway(tmp_path / "n")
    try:
        _mount_s3(node, "secret", origin)
        listing = node.cli("mount", "list").stdout
        assert "secret\ts3://origin-node/set" in listing and "secret_key=***" in listing
        as_json = node.cli("mount", "list", "--json").stdout
        s3 = node.client()
        eventually(lambda: s3.get_object(Bucket="secret", Key="item-0.bin"))
        for text in (listing, as_json, node.log()):
            assert ORIGIN_SECRET not in text
        db = (tmp_path / "n" / "gateway.db").read_bytes()
        assert ORIGIN_SECRET.encode() not in db
    finally:
        node.stop()


def test_invalid_mounts_are_refused(tmp_path: Path) -> None:
    from tests.support.gateway import run_cli

    for args, message in [
        (("Bad_Name", "file:///tmp"), "Bucket names are 3-63"),
        (("ok-name", "ftp://host/x"), "unknown store scheme"),
        (("ok-name", "file://relative"), ""),
        (("ok-name", "s3://b", "-o", "colour=blue"), "unknown s3 store options"),
        (("ok-name", "s3://b", "-o", "novalue"), "not KEY=VALUE"),
    ]:
        out = run_cli(tmp_path / "d", None, "mount", "add", *args, check=False)
        assert out.returncode == 2, out
        assert message in out.stderr


def test_keys_created_and_deleted_while_running(tmp_path: Path) -> None:
    node = start_gateway(tmp_path / "n", args=("--demo",))
    try:
        out = node.cli("keys", "create", "--description", "ci").stdout
        ak = out.split("access key: ")[1].split()[0]
        sk = out.split("secret key: ")[1].split()[0]
        s3 = node.client(ak, sk)
        got = eventually(lambda: s3.get_object(Bucket="demo", Key="hello.txt"))
        assert got["Body"].read() == b"hello, world\n"
        listed = node.cli("keys", "list").stdout
        assert ak in listed and sk not in listed
        node.cli("keys", "delete", ak)

        def refused() -> bool:
            try:
                s3.list_buckets()
            except ClientError as exc:
                return bool(exc.response["Error"]["Code"] == "InvalidAccessKeyId")
            return False

        eventually(refused)
    finally:
        node.stop()


def test_a_new_mount_and_key_work_at_once_on_every_worker(
    tmp_path: Path, origin: CountingProxy, bucket: str
) -> None:
    """`gateway mount add` and `keys create` return once the database has them; from then on
    every worker of the node serves them, though none has refreshed (an hour apart here)."""
    node = start_gateway(tmp_path / "n", args=("--workers", "2", "--refresh-interval", "3600"))
    try:
        _mount_s3(node, "fresh", origin)
        out = node.cli("keys", "create", "--description", "new").stdout
        ak = out.split("access key: ")[1].split()[0]
        sk = out.split("secret key: ")[1].split()[0]
        for _ in range(12):  # a new connection each: the kernel spreads them over the workers
            got = node.client().get_object(Bucket="fresh", Key="item-2.bin")
            assert got["Body"].read() == b"\x02" * 5000
            listed = node.client(ak, sk).list_objects_v2(Bucket="fresh")["Contents"]
            assert [o["Key"] for o in listed] == [f"item-{i}.bin" for i in range(3)]
        assert {"fresh"} <= node.buckets()
    finally:
        node.stop()


def test_a_write_through_one_worker_is_read_new_through_every_worker(tmp_path: Path) -> None:
    """Each worker remembers versions and keeps small blocks in memory (for 10 minutes on
    this mount): an overwrite or a delete through one must be what every other reads next."""
    files = tmp_path / "files"
    files.mkdir()
    node = start_gateway(tmp_path / "n", args=("--workers", "2"))
    try:
        node.cli("mount", "add", "shared", files.as_uri(), "-o", "metadata_ttl=600")
        eventually(lambda: "shared" in node.buckets())

        def read_everywhere(expect: bytes | None) -> None:
            for _ in range(30):  # a new connection each: the kernel spreads them over both
                s3 = node.client()
                if expect is None:
                    with pytest.raises(ClientError, match="NoSuchKey"):
                        s3.get_object(Bucket="shared", Key="v.bin")
                else:
                    assert s3.get_object(Bucket="shared", Key="v.bin")["Body"].read() == expect

        for version in (b"one" * 1000, b"two" * 1000, b"three" * 1000):
            node.client().put_object(Bucket="shared", Key="v.bin", Body=version)
            read_everywhere(version)
        node.client().delete_object(Bucket="shared", Key="v.bin")
        read_everywhere(None)
    finally:
        node.stop()


def test_restart_keeps_the_cache(tmp_path: Path, origin: CountingProxy, bucket: str) -> None:
    node = start_gateway(tmp_path / "n")
    _mount_s3(node, "keep", origin, "-o", "metadata_ttl=-1")
    s3 = node.client()
    first = eventually(lambda: s3.get_object(Bucket="keep", Key="item-2.bin"))
    assert first["Body"].read() == b"\x02" * 5000
    node.stop()  # the metadata write is asynchronous: a clean stop flushes it
    origin.reset()
    node = start_gateway(tmp_path / "n")
    try:
        again = node.client().get_object(Bucket="keep", Key="item-2.bin")
        assert again["Body"].read() == b"\x02" * 5000
        assert again["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit"
        assert origin.requests == []
    finally:
        node.stop()


def test_first_start_creates_and_prints_a_key(tmp_path: Path) -> None:
    """`gateway serve` on an empty database prints an access key that works."""
    from tests.support.net import free_port, wait_http

    port = free_port()
    env = dict(os.environ, GATEWAY_ENCRYPTION_KEY="1wDQwpdCma37OnLa2U7kZwPGbp7KgCGXbcz5nb-BPIA=")
    log = tmp_path / "out.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(BIN / "gateway"), "serve", "--port", str(port), "--data-dir", str(tmp_path),
             *server_args()],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc)
        text = log.read_text()
        ak = text.split("access key: ")[1].split()[0]
        sk = text.split("secret key: ")[1].split()[0]
        node = GatewayNode(f"http://127.0.0.1:{port}", port, tmp_path, None, proc, log)
        assert node.client(ak, sk).list_buckets()["Buckets"] == []
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").json() == {"status": "ok"}
        # By default, one worker process per core this process may run on.
        cores = len(os.sched_getaffinity(0))

        def workers_started() -> bool:
            return len(re.findall(r"worker \d+ started", log.read_text())) == cores

        eventually(workers_started, timeout=60)
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    with temp_database() as url:
        yield url


def test_gateway_on_postgresql(
    tmp_path: Path, pg_url: str, origin: CountingProxy, bucket: str
) -> None:
    node = start_gateway(tmp_path / "n", database_url=pg_url)
    try:
        _mount_s3(node, "pgdata", origin)
        s3 = node.client()
        got = eventually(lambda: s3.get_object(Bucket="pgdata", Key="item-0.bin"))
        assert got["Body"].read() == b"\x00" * 5000
        assert not (tmp_path / "n" / "gateway.db").exists()
    finally:
        node.stop()


def test_reads_go_on_while_the_database_is_down(
    tmp_path: Path, origin: CountingProxy, bucket: str
) -> None:
    with temp_database() as url:
        run_cli(
            tmp_path / "n", url, "mount", "add", "outage", "s3://origin-node/set",
            "-o", f"endpoint_url={origin.url}", "-o", "access_key=origin-ak",
            "-o", f"secret_key={ORIGIN_SECRET}",
        )  # fmt: skip
        node = start_gateway(tmp_path / "n", database_url=url)
        try:
            # Every worker has read the mount: whichever the kernel hands a request to knows
            # it when the database goes away.
            node.wait_workers()
            s3 = node.client()
            eventually(lambda: s3.get_object(Bucket="outage", Key="item-0.bin"))
            with database_outage(url):
                # A refresh round has failed: the node knows the database is away.
                eventually(lambda: "metadata store unavailable" in node.log())
                hit = s3.get_object(Bucket="outage", Key="item-0.bin")
                assert hit["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit"
                miss = s3.get_object(Bucket="outage", Key="item-1.bin")
                assert miss["Body"].read() == b"\x01" * 5000
                assert node.proc.poll() is None
        finally:
            node.stop()


# -- aws-cli, a real subprocess ------------------------------------------------------------


@pytest.fixture(scope="module")
def cli_node(
    tmp_path_factory: pytest.TempPathFactory, origin: CountingProxy, bucket: str
) -> Iterator[GatewayNode]:
    node = start_gateway(tmp_path_factory.mktemp("awscli"))
    _mount_s3(node, "cli", origin)
    s3 = node.client()
    eventually(lambda: s3.head_bucket(Bucket="cli"))
    yield node
    node.stop()


def aws(node: GatewayNode, *args: str) -> subprocess.CompletedProcess[str]:
    from tests.support.gateway import ACCESS_KEY, SECRET_KEY

    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "HOME"} | {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        "HOME": str(node.data_dir),
    }
    out = subprocess.run(
        [str(BIN / "aws"), "--endpoint-url", node.url, *args],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out


def test_awscli_ls_and_cp(cli_node: GatewayNode, tmp_path: Path) -> None:
    assert "cli" in aws(cli_node, "s3", "ls").stdout
    listing = aws(cli_node, "s3", "ls", "s3://cli/").stdout
    assert all(f"item-{i}.bin" in listing for i in range(3))
    aws(cli_node, "s3", "cp", "s3://cli/item-1.bin", str(tmp_path / "one.bin"))
    assert (tmp_path / "one.bin").read_bytes() == b"\x01" * 5000
    aws(cli_node, "s3", "cp", "s3://cli/", str(tmp_path / "all"), "--recursive")
    assert sorted(p.name for p in (tmp_path / "all").iterdir()) == [
        "item-0.bin", "item-1.bin", "item-2.bin",
    ]  # fmt: skip


def test_awscli_ranged_get_object(cli_node: GatewayNode, tmp_path: Path) -> None:
    out = tmp_path / "part"
    meta = aws(cli_node, "s3api", "get-object", "--bucket", "cli", "--key", "item-2.bin",
               "--range", "bytes=10-19", str(out))  # fmt: skip
    assert out.read_bytes() == b"\x02" * 10
    assert '"ContentRange": "bytes 10-19/5000"' in meta.stdout


def _samples(text: str) -> dict[str, float]:
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


@pytest.mark.slow
def test_metrics_of_several_workers_count_the_whole_node(tmp_path: Path) -> None:
    """A scrape reaches one worker; it must answer for all of them: every request any worker
    served, every cache hit, whichever worker accepted the scrape."""
    files = tmp_path / "files"
    files.mkdir()
    (files / "obj.bin").write_bytes(b"w" * 5000)
    node = start_gateway(tmp_path / "n", args=("--workers", "2"))
    try:
        node.cli("mount", "add", "multi", files.as_uri())
        url = node.client().generate_presigned_url(
            "get_object", Params={"Bucket": "multi", "Key": "obj.bin"}
        )

        def every_worker_knows_the_mount() -> bool:
            # Each worker refreshes its mounts on its own.
            return all(httpx.get(url).status_code == 200 for _ in range(10))

        eventually(every_worker_knows_the_mount)
        before = _samples(httpx.get(f"{node.url}/metrics").text)
        got = 'gateway_requests_total{op="GetObject",status="200"}'
        start = before.get(got, 0.0)
        served = 40
        for _ in range(served):  # a connection each: the kernel spreads them over the workers
            with httpx.Client() as fresh:
                assert fresh.get(url).content == b"w" * 5000

        def every_scrape_counts_all() -> bool:
            # The workers publish their figures once a second: wait until every worker that
            # may take the scrape answers for all of them.
            for _ in range(10):
                with httpx.Client() as fresh:
                    samples = _samples(fresh.get(f"{node.url}/metrics").text)
                if samples[got] - start != served or samples["gateway_cache_hits_total"] < served:
                    return False
            return True

        eventually(every_scrape_counts_all)
    finally:
        node.stop()


def test_object_reads_are_counted_by_bucket_and_how_the_cache_answered(tmp_path: Path) -> None:
    """Per-mount figures on /metrics, summed over the node's workers: reads and body bytes by
    bucket and cache outcome; a bucket no read found adds no series."""
    for name, size in (("a", 3000), ("b", 700)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "obj").write_bytes(b"x" * size)
    node = start_gateway(tmp_path / "n")
    try:
        for name in ("a", "b"):
            node.cli("mount", "add", f"ds-{name}", (tmp_path / name).as_uri())
        for bucket, reads in (("ds-a", 3), ("ds-b", 1)):
            for n in range(reads):  # a new client each: the reads spread over the workers
                assert len(node.client().get_object(Bucket=bucket, Key="obj")["Body"].read())
                if n == 0 and reads > 1:
                    # The miss's block in place before the next read: its client has the
                    # bytes before the fill is committed, and a sibling worker asked
                    # meanwhile follows the fill (a second miss), where the test counts hits.
                    eventually(lambda: node.metric("gateway_cache_fills") >= 1)
        with pytest.raises(ClientError):
            node.client().get_object(Bucket="no-such-bucket", Key="obj")

        def counted() -> bool:
            miss_a = node.metric("gateway_bucket_reads", 'bucket="ds-a",cache="miss"')
            hit_a = node.metric("gateway_bucket_reads", 'bucket="ds-a",cache="hit"')
            return (miss_a, hit_a) == (1, 2) and node.metric(
                "gateway_bucket_reads", 'bucket="ds-b"'
            ) == 1

        eventually(counted)  # each worker publishes its figures once a second
        assert node.metric("gateway_bucket_read_bytes", 'bucket="ds-a"') == 3 * 3000
        assert node.metric("gateway_bucket_read_bytes", 'bucket="ds-b",cache="miss"') == 700
        assert 'bucket="no-such-bucket"' not in httpx.get(f"{node.url}/metrics").text
    finally:
        node.stop()
