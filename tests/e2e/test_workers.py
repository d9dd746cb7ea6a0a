"""A node of several worker processes answers as one node (issue: the node as one).

Each test runs `gateway serve` with the node's default worker count (one per core, two or
more here) and makes every request on a new connection, so that the kernel spreads them over
the workers: what one worker acknowledged must hold in all of them at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError

from tests.support.gateway import SERVERS, GatewayNode, start_gateway
from tests.support.net import eventually
from tests.support.origin import CountingProxy
from tests.support.postgres import database_outage, temp_database

MiB = 1 << 20
ORIGIN = "origin-workers"
TRIES = 16  # requests, each on a new connection


def _error(call: Any, **params: Any) -> str:
    """The S3 error code `call(**params)` is answered with, or "OK"."""
    try:
        call(**params)
    except ClientError as exc:
        return str(exc.response["Error"]["Code"])
    return "OK"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayNode]:
    root = tmp_path_factory.mktemp("workers")
    # Refreshes an hour apart: what holds here holds because the change was told, not polled.
    started = start_gateway(
        root / "node",
        args=("--bucket-store", (root / "buckets").as_uri(), "--refresh-interval", "3600"),
    )
    assert len(started.workers()) >= 2, "the default is one worker per core"
    yield started
    started.stop()


@pytest.fixture(scope="module")
def origin_objects(origin_s3: Any) -> str:
    origin_s3.create_bucket(Bucket=ORIGIN)
    origin_s3.put_object(Bucket=ORIGIN, Key="big.bin", Body=os.urandom(8 * MiB))
    for i in range(40):
        origin_s3.put_object(Bucket=ORIGIN, Key=f"ds/{i:03d}", Body=bytes([i]) * 3000)
    return ORIGIN


def _mount(node: GatewayNode, name: str, origin: CountingProxy, *options: str) -> None:
    args = ["-o", f"endpoint_url={origin.url}", "-o", "access_key=origin-ak"]
    args += ["-o", "secret_key=origin-sk"]
    for option in options:
        args += ["-o", option]
    node.cli("mount", "add", name, f"s3://{ORIGIN}", *args)


def _user(node: GatewayNode, name: str) -> tuple[str, str]:
    node.cli("users", "create", name)
    out = node.cli("keys", "create", "--user", name).stdout
    return out.split("access key: ")[1].split()[0], out.split("secret key: ")[1].split()[0]


def test_a_bucket_created_or_deleted_through_one_worker_is_so_in_every_worker(
    node: GatewayNode,
) -> None:
    for round_ in range(3):
        name = f"made-{round_}"
        node.client().create_bucket(Bucket=name)
        for _ in range(TRIES):
            listed = {b["Name"] for b in node.client().list_buckets()["Buckets"]}
            assert name in listed
            assert _error(node.client().head_bucket, Bucket=name) == "OK"
        node.client().put_object(Bucket=name, Key="k", Body=b"x")
        node.client().delete_object(Bucket=name, Key="k")
        node.client().delete_bucket(Bucket=name)
        for _ in range(TRIES):
            s3 = node.client()
            assert name not in {b["Name"] for b in s3.list_buckets()["Buckets"]}
            assert _error(s3.list_object_versions, Bucket=name) == "NoSuchBucket"
            assert _error(s3.get_object, Bucket=name, Key="k") == "NoSuchBucket"


def test_a_bucket_policy_holds_in_every_worker_once_acknowledged(node: GatewayNode) -> None:
    ak, sk = _user(node, "bob")
    node.client().create_bucket(Bucket="shared-policy")
    node.client().put_object(Bucket="shared-policy", Key="data.txt", Body=b"for bob")
    for _ in range(TRIES):  # bob sees nothing yet, in any worker
        bob = node.client(ak, sk)
        assert _error(bob.get_object, Bucket="shared-policy", Key="data.txt") == "AccessDenied"
    grant = _read_grant("shared-policy", "bob")
    node.client().put_bucket_policy(Bucket="shared-policy", Policy=json.dumps(grant))
    for _ in range(TRIES):
        got = node.client(ak, sk).get_object(Bucket="shared-policy", Key="data.txt")
        assert got["Body"].read() == b"for bob"
    node.client().delete_bucket_policy(Bucket="shared-policy")
    for _ in range(TRIES):
        bob = node.client(ak, sk)
        assert _error(bob.get_object, Bucket="shared-policy", Key="data.txt") == "AccessDenied"


def test_a_key_disabled_by_the_cli_is_refused_by_every_worker_when_it_returns(
    node: GatewayNode,
) -> None:
    ak, sk = _user(node, "carol")
    for _ in range(TRIES):  # every worker has the key (and caches its signing key)
        node.client(ak, sk).list_buckets()
    node.cli("keys", "disable", ak)
    for _ in range(TRIES):
        assert _error(node.client(ak, sk).list_buckets) == "InvalidAccessKeyId"
    node.cli("keys", "enable", ak)
    for _ in range(TRIES):
        node.client(ak, sk).list_buckets()


def test_concurrent_cold_readers_in_every_worker_fetch_each_block_once(
    node: GatewayNode, origin: CountingProxy, origin_objects: str
) -> None:
    _mount(node, "cold", origin, "metadata_ttl=600")
    origin.reset()

    def read(_: int) -> bytes:
        return bytes(node.client().get_object(Bucket="cold", Key="big.bin")["Body"].read())

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(read, range(16)))
    body = results[0]
    assert len(body) == 8 * MiB and all(r == body for r in results)
    # Block 0 comes with the object's metadata, opened by one worker for the node; the rest
    # is filled once across the workers.
    assert origin.bytes_sent("GET") == 8 * MiB
    assert origin.count("GET") == 2  # 4 MiB blocks: the open of block 0, and block 1


def test_what_a_load_brought_in_is_a_hit_in_every_worker(
    node: GatewayNode, origin: CountingProxy, origin_objects: str
) -> None:
    _mount(node, "loaded", origin, "metadata_ttl=600")
    node.cli("load", "loaded/ds/")
    origin.reset()
    for i in range(40):  # a new connection each, spread over the workers
        got = node.client().get_object(Bucket="loaded", Key=f"ds/{i:03d}")
        assert got["Body"].read() == bytes([i]) * 3000
    assert origin.count() == 0, origin.count()


def test_a_scrape_counts_every_workers_requests_exactly_at_once(
    node: GatewayNode, origin: CountingProxy, origin_objects: str
) -> None:
    # Each worker counts its requests as plain numbers and publishes them on a tick; a scrape
    # asks its siblings to publish first, so what was answered before it is all counted.
    _mount(node, "counted", origin, "metadata_ttl=600")
    for i in range(40):  # cached, and in the memory tier of the workers that read them
        node.client().get_object(Bucket="counted", Key=f"ds/{i:03d}")["Body"].read()
    eventually(lambda: node.metric("gateway_bucket_reads", 'bucket="counted"') >= 40, 5)
    gets = 'op="GetObject",status="200"'
    before = node.metric("gateway_requests", gets), node.metric("gateway_bucket_reads")
    for i in range(40):  # a new connection each, spread over the workers
        node.client().get_object(Bucket="counted", Key=f"ds/{i:03d}")["Body"].read()
    after = node.metric("gateway_requests", gets), node.metric("gateway_bucket_reads")
    assert after == (before[0] + 40, before[1] + 40)


def test_a_mount_removed_by_the_cli_is_gone_from_every_worker_when_it_returns(
    node: GatewayNode, origin: CountingProxy, origin_objects: str
) -> None:
    _mount(node, "brief", origin)
    for _ in range(TRIES):
        assert node.client().get_object(Bucket="brief", Key="ds/001")["Body"].read()
    node.cli("mount", "remove", "brief")
    for _ in range(TRIES):
        assert _error(node.client().get_object, Bucket="brief", Key="ds/001") == "NoSuchBucket"


def test_a_change_through_one_node_holds_on_another_within_the_refresh_interval(
    tmp_path: Path,
) -> None:
    """Across nodes, a change reaches the others at their next refresh (docs/architecture.md:
    within refresh_interval, here one second), then on every worker of theirs."""
    buckets = (tmp_path / "buckets").as_uri()
    args = ("--bucket-store", buckets, "--refresh-interval", "1")
    with temp_database() as url:
        a = start_gateway(tmp_path / "a", database_url=url, args=args)
        b = start_gateway(tmp_path / "b", database_url=url, args=args)
        try:
            ak, sk = _user(a, "dora")
            a.client().create_bucket(Bucket="across")
            a.client().put_object(Bucket="across", Key="k", Body=b"v")

            def dora_reads() -> str:
                return _error(b.client(ak, sk).get_object, Bucket="across", Key="k")

            eventually(lambda: dora_reads() == "AccessDenied", timeout=5)
            grant = json.dumps(_read_grant("across", "dora"))
            a.client().put_bucket_policy(Bucket="across", Policy=grant)
            # Each worker of b re-reads on its own clock: within refresh_interval all of them
            # have it (a run of TRIES requests on new connections all granted).
            eventually(lambda: all(dora_reads() == "OK" for _ in range(TRIES)), timeout=5)
            a.client().delete_object(Bucket="across", Key="k")
            a.client().delete_bucket(Bucket="across")

            def listed() -> str:
                return _error(b.client().list_objects_v2, Bucket="across")

            eventually(lambda: all(listed() == "NoSuchBucket" for _ in range(TRIES)), timeout=5)
        finally:
            a.stop()
            b.stop()


def _read_grant(bucket: str, user: str) -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"AWS": [f"arn:aws:iam:::user/{user}"]},
                "Action": "s3:GetObject",
                "Resource": f"arn:aws:s3:::{bucket}/*",
            }
        ],
    }


def test_a_worker_killed_is_replaced_and_the_replacement_answers_as_the_node(
    node: GatewayNode,
) -> None:
    """Workers are forked from the node's supervisor (gateway/server/workers.py, run_workers): one
    killed with SIGKILL is forked again, and the new one shares what the others know."""
    before = set(node.workers())
    victim = min(before)
    os.kill(victim, signal.SIGKILL)

    def replaced() -> bool:
        now = set(node.workers())
        return victim not in now and len(now) == len(before)

    eventually(replaced, timeout=60)
    node.client().create_bucket(Bucket="after-a-crash")
    node.client().put_object(Bucket="after-a-crash", Key="k", Body=b"still one node")
    for _ in range(TRIES):
        s3 = node.client()
        assert "after-a-crash" in {b["Name"] for b in s3.list_buckets()["Buckets"]}
        assert s3.get_object(Bucket="after-a-crash", Key="k")["Body"].read() == b"still one node"


@pytest.mark.parametrize("server", SERVERS)
def test_a_worker_that_dies_while_the_database_is_down_is_replaced_once_it_is_back(
    tmp_path: Path, server: str
) -> None:
    """A worker's replacement cannot start while the database is down (it reads the mounts
    and keys); the node goes on serving on the others, and replaces it again until one starts.
    On both servers: uvicorn's supervisor stops the whole node when a replacement fails to
    start, unless the node's (gateway/edge_uvicorn.py) does as the own server does."""
    with temp_database() as url:
        node = start_gateway(
            tmp_path / "n", database_url=url, args=("--workers", "2"), server=server
        )
        try:
            node.wait_workers()
            before = set(node.workers())
            victim = min(before)
            with database_outage(url):
                os.kill(victim, signal.SIGKILL)
                # A replacement has tried to start and could not.
                eventually(lambda: _failed_starts(node.log()) > 0, timeout=60)
                assert node.proc.poll() is None
                assert httpx.get(node.url + "/healthz", timeout=10).status_code == 200

            def replaced() -> bool:
                now = set(node.workers())
                return victim not in now and len(now) == len(before)

            eventually(replaced, timeout=60)
            node.wait_workers()
            for _ in range(TRIES):
                assert node.client().list_buckets()["ResponseMetadata"]["HTTPStatusCode"] == 200
        finally:
            node.stop()


def _failed_starts(log: str) -> int:
    """Workers that could not start, as the own server ("the node did not start") and uvicorn
    ("Application startup failed") log them."""
    return log.count("the node did not start") + log.count("Application startup failed")


def _established(pid: int, port: int) -> int:
    """The connections to `port` that process `pid` holds open (/proc: its descriptors'
    socket inodes among the established TCP connections of that local port)."""
    held = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                held.add(target[8:-1])
    found = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "01" and int(local.rsplit(":", 1)[1], 16) == port and inode in held:
                    found += 1
    return found


def test_a_burst_of_keep_alive_connections_is_spread_over_the_workers(node: GatewayNode) -> None:
    """A loader opens its keep-alive connections at once and keeps them: each worker used to
    accept every connection waiting when it woke, so one of two held 11 to 16 of 16 while
    the other idled for the whole epoch. Each takes one at a time now, and leaves the next
    to a sibling holding fewer (gateway/server/accept.py)."""
    node.wait_workers()
    pids = node.workers()
    # A worker takes connections from the end of its start (after its figures are out): one
    # still starting takes none, its siblings take them all. Asked until each one answered.
    seen: set[int] = set()

    def each_accepts() -> bool:
        with socket.create_connection(("127.0.0.1", node.port)) as conn:
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            assert conn.recv(65536).startswith(b"HTTP/1.1 ")
            seen.update(pid for pid in pids if _established(pid, node.port))
        return seen == set(pids)

    eventually(each_accepts)
    eventually(lambda: not any(_established(pid, node.port) for pid in pids))
    conns = [socket.create_connection(("127.0.0.1", node.port)) for _ in range(24)]
    try:
        for conn in conns:
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        for conn in conns:
            assert conn.recv(65536).startswith(b"HTTP/1.1 ")  # answered, still open
        counts: list[int] = []

        def all_seen() -> bool:
            counts[:] = [_established(pid, node.port) for pid in pids]
            return sum(counts) == len(conns)

        eventually(all_seen)
        assert max(counts) - min(counts) <= 6, counts
    finally:
        for conn in conns:
            conn.close()
