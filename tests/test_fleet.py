"""Three and more gateway processes on one PostgreSQL database: placement, forwarding, one
store fetch per block for the whole fleet, invalidation across nodes, the internal API's
authentication, a node killed with SIGKILL, and the database going away."""

from __future__ import annotations

import hashlib
import json
import random
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.fernet import Fernet

from gateway.service.fleet import AUTH_HEADER, auth_value, canonical
from tests.support.gateway import GatewayNode, start_gateway
from tests.support.net import free_port
from tests.support.origin import CountingProxy
from tests.support.postgres import database_outage, temp_database

MiB = 1 << 20
BUCKET = "origin-fleet"
SECRET = "fleet-secret-for-tests"
OBJECTS = 1000


def _blob(n: int, seed: int) -> bytes:
    block = hashlib.sha256(str(seed).encode()).digest() * 2048  # 64 KiB
    return (block * (n // len(block) + 1))[:n]


@pytest.fixture(scope="module")
def origin_bucket(origin_s3: Any) -> str:
    origin_s3.create_bucket(Bucket=BUCKET)

    def put(i: int) -> None:
        origin_s3.put_object(Bucket=BUCKET, Key=f"small/{i:04d}", Body=_blob(1024, i))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, range(OBJECTS)))
    origin_s3.put_object(Bucket=BUCKET, Key="big.bin", Body=_blob(24 * MiB, -1))
    return BUCKET


class Fleet:
    def __init__(self, root: Path, url: str, origin: CountingProxy, size: int = 3) -> None:
        self.root, self.url, self.origin = root, url, origin
        self.env = {"GATEWAY_ENCRYPTION_KEY": Fernet.generate_key().decode()}
        self.nodes: list[GatewayNode] = []
        self.internal: dict[int, int] = {}
        for _ in range(size):
            self.add()

    def add(self) -> GatewayNode:
        i = len(self.nodes)
        internal = free_port()
        node = start_gateway(
            self.root / f"n{i}",
            database_url=self.url,
            env=self.env,
            args=(
                "--fleet-secret", SECRET, "--internal-port", str(internal),
                "--heartbeat-interval", "0.5", "--heartbeat-timeout", "3",
                "--cache-block-size", "1MiB", "--node-id", f"node-{i}", "--no-access-log",
            ),
        )  # fmt: skip
        self.nodes.append(node)
        self.internal[node.port] = internal
        return node

    def mount(self, bucket: str, *options: str) -> None:
        opts = ["-o", f"endpoint_url={self.origin.url}", "-o", "access_key=origin-ak"]
        opts += ["-o", "secret_key=origin-sk", "-o", "metadata_ttl=600"]
        for option in options:
            opts += ["-o", option]
        self.nodes[0].cli("mount", "add", bucket, f"s3://{BUCKET}", *opts)
        for node in self.nodes:
            _wait(
                lambda n=node: bucket in {b["Name"] for b in n.client().list_buckets()["Buckets"]}
            )

    def live(self, via: GatewayNode) -> set[str]:
        out = via.cli("status", "--json", "--heartbeat-timeout", "3").stdout
        return {n["id"] for n in json.loads(out) if n["live"]}

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def _wait(ok: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def fleet(module_dir: Path, origin: CountingProxy, origin_bucket: str) -> Iterator[Fleet]:
    with temp_database() as url:
        fleet = Fleet(module_dir, url, origin)
        try:
            fleet.mount("data")
            ids = {f"node-{i}" for i in range(3)}
            for node in fleet.nodes:
                _wait(lambda n=node: fleet.live(n) == ids)
            time.sleep(1.5)  # every node has heard of every other (NOTIFY, else the poll)
            yield fleet
        finally:
            fleet.stop()


def _get(node: GatewayNode, key: str, bucket: str = "data") -> bytes:
    return bytes(node.client().get_object(Bucket=bucket, Key=key)["Body"].read())


@pytest.mark.timeout(600)
def test_each_object_is_fetched_once_for_the_whole_fleet(
    fleet: Fleet, origin: CountingProxy
) -> None:
    origin.reset()

    def reader(node: GatewayNode) -> bool:
        keys = list(range(OBJECTS))
        random.Random(node.port).shuffle(keys)
        s3 = node.client()
        return all(
            s3.get_object(Bucket="data", Key=f"small/{i:04d}")["Body"].read() == _blob(1024, i)
            for i in keys
        )

    with ThreadPoolExecutor(3) as pool:
        assert all(pool.map(reader, fleet.nodes))
    # Each node asks the store for an object's version once (HEAD); its bytes are fetched
    # once for the fleet, by its owner.
    assert origin.count("GET", "/small/") == OBJECTS
    assert origin.count("HEAD", "/small/") <= OBJECTS * len(fleet.nodes)


def test_a_large_object_is_spread_over_the_fleet_and_fetched_once(
    fleet: Fleet, origin: CountingProxy
) -> None:
    body = _blob(24 * MiB, -1)
    origin.reset()
    for node in fleet.nodes:
        assert _get(node, "big.bin") == body
    rng = "bytes=5000000-9000000"
    got = fleet.nodes[2].client().get_object(Bucket="data", Key="big.bin", Range=rng)
    assert got["Body"].read() == body[5000000:9000001]
    assert origin.bytes_sent("GET") == 24 * MiB
    for node in fleet.nodes:  # every node filled some of its blocks
        text = httpx.get(node.url + "/metrics").text
        fills = [ln for ln in text.splitlines() if ln.startswith("gateway_cache_fills_total ")]
        assert fills and float(fills[0].split()[1]) > 0


def test_an_overwrite_through_one_node_is_read_new_through_another(
    fleet: Fleet, origin_s3: Any
) -> None:
    a, b = fleet.nodes[0], fleet.nodes[1]
    a.client().put_object(Bucket="data", Key="rw/obj", Body=b"old" * 1000)
    assert _get(b, "rw/obj") == b"old" * 1000  # b now trusts this version for 600 s
    a.client().put_object(Bucket="data", Key="rw/obj", Body=b"new" * 1000)
    assert _get(b, "rw/obj") == b"new" * 1000
    assert _get(fleet.nodes[2], "rw/obj") == b"new" * 1000
    a.client().delete_object(Bucket="data", Key="rw/obj")
    with pytest.raises(Exception, match="NoSuchKey"):
        _get(b, "rw/obj")


def test_the_internal_api_refuses_requests_without_the_fleet_secret(fleet: Fleet) -> None:
    node = fleet.nodes[0]
    base = f"http://127.0.0.1:{fleet.internal[node.port]}"
    query = "m=1&k=small%2F0001&e=x&s=1024&b=1048576&i=0&a=0&z=10&p=0"
    target = f"/_fleet/block?{query}"
    assert httpx.get(base + target).status_code == 403
    forged = auth_value(b"not-the-secret", "GET", canonical("/_fleet/block", query))
    assert httpx.get(base + target, headers={AUTH_HEADER: forged}).status_code == 403
    stale = "1000.000:" + "0" * 64
    assert httpx.get(base + target, headers={AUTH_HEADER: stale}).status_code == 403
    signed = auth_value(SECRET.encode(), "GET", canonical("/_fleet/block", query))
    # Signed right, the request reaches the API (and fails on the made-up version instead).
    assert httpx.get(base + target, headers={AUTH_HEADER: signed}).status_code != 403
    # The internal routes do not exist on the public port.
    assert httpx.get(node.url + target).status_code >= 400


def test_a_killed_node_fails_over_and_the_fleet_converges(
    tmp_path: Path, origin: CountingProxy, origin_bucket: str
) -> None:
    with temp_database() as url:
        fleet = Fleet(tmp_path, url, origin, size=3)
        try:
            fleet.mount("kill", "replicas=2")
            ids = {f"node-{i}" for i in range(3)}
            for node in fleet.nodes:
                _wait(lambda n=node: fleet.live(n) == ids)
            time.sleep(1.0)
            body = _blob(24 * MiB, -1)
            survivors, victim = fleet.nodes[:2], fleet.nodes[2]
            assert _get(survivors[0], "big.bin", "kill") == body

            # Reads streaming through the survivors while the victim dies.
            def read(node: GatewayNode) -> str:
                try:
                    got = _get(node, "big.bin", "kill")
                except Exception as exc:  # a clean failure is allowed, a wrong body is not
                    return f"failed: {type(exc).__name__}"
                return "ok" if got == body else "WRONG BYTES"

            with ThreadPoolExecutor(4) as pool:
                running = [pool.submit(read, survivors[i % 2]) for i in range(4)]
                time.sleep(0.05)
                victim.proc.send_signal(signal.SIGKILL)
                victim.proc.wait()
                outcomes = [f.result() for f in running]
            assert "WRONG BYTES" not in outcomes
            # The next reads succeed at once: the dead owner's blocks come from the next
            # replica or the store.
            for node in survivors:
                assert _get(node, "big.bin", "kill") == body
                assert _get(node, "small/0007", "kill") == _blob(1024, 7)
            # And the fleet converges: the dead node leaves the placement.
            for node in survivors:
                _wait(lambda n=node: fleet.live(n) == {"node-0", "node-1"}, timeout=20)

            # The database goes away: reads of known mounts go on, hits and misses alike.
            with database_outage(url):
                for node in survivors:
                    assert _get(node, "big.bin", "kill") == body
                    assert _get(node, "small/0042", "kill") == _blob(1024, 42)
        finally:
            fleet.stop()
