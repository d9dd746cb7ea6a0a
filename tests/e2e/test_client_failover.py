"""A client reading an epoch from a fleet of two nodes when the node it uses is killed with
SIGKILL halfway: it goes on with the other node (one it was given, or one it learnt from the
fleet's placement), the dead node's short-circuit leases are dropped, and the epoch
completes with every byte right."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet

from gateway.client import GatewayDataset
from gateway.client.local import NODE_CHECK
from tests.support.gateway import ACCESS_KEY, SECRET_KEY, GatewayNode, start_gateway
from tests.support.net import eventually, free_port
from tests.support.origin import CountingProxy
from tests.support.postgres import temp_database

pytestmark = pytest.mark.slow  # two nodes on PostgreSQL, one killed

MiB = 1 << 20
BUCKET = "origin-failover"
OBJECTS = 96
BATCH = 8


def _size(i: int) -> int:
    return 2 * MiB + 5000 + i if i % 16 == 0 else 3000 + i  # some of several 1 MiB blocks


def _blob(i: int) -> bytes:
    n = _size(i)
    return (hashlib.sha256(str(i).encode()).digest() * (n // 32 + 1))[:n]


@pytest.fixture(scope="module")
def origin_bucket(origin_s3: Any) -> str:
    origin_s3.create_bucket(Bucket=BUCKET)

    def put(i: int) -> None:
        origin_s3.put_object(Bucket=BUCKET, Key=f"train/{i:03d}", Body=_blob(i))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, range(OBJECTS)))
    return BUCKET


def _heard(node: GatewayNode) -> set[str]:
    """The fleet's members as `node` knows them (the changes its membership logged)."""
    known: set[str] = set()
    for line in node.log().splitlines():
        if '"fleet changed"' in line:
            change = json.loads(line)
            known = (known | set(change["joined"])) - set(change["left"])
    return known


@pytest.fixture
def fleet(tmp_path: Path, origin: CountingProxy, origin_bucket: str) -> Iterator[list[GatewayNode]]:
    """Two nodes on one PostgreSQL database, the origin mounted with metadata_ttl=-1."""
    env = {"GATEWAY_ENCRYPTION_KEY": Fernet.generate_key().decode()}
    with temp_database() as url:
        nodes: list[GatewayNode] = []
        try:
            for i in range(2):
                args = (
                    "--fleet-secret", "failover-secret", "--internal-port", str(free_port()),
                    "--heartbeat-interval", "0.5", "--heartbeat-timeout", "3",
                    "--cache-block-size", "1MiB", "--node-id", f"node-{i}", "--no-access-log",
                )  # fmt: skip
                nodes.append(start_gateway(tmp_path / f"n{i}", database_url=url, env=env,
                                           args=args))  # fmt: skip
            nodes[0].cli(
                "mount", "add", "data", f"s3://{origin_bucket}", "-o",
                f"endpoint_url={origin.url}", "-o", "access_key=origin-ak", "-o",
                "secret_key=origin-sk", "-o", "metadata_ttl=-1",
            )  # fmt: skip
            for node in nodes:
                eventually(lambda n=node: "data" in n.buckets())
                eventually(lambda n=node: _heard(n) == {"node-0", "node-1"})
            yield nodes
        finally:
            for node in nodes:
                node.stop()


@pytest.mark.parametrize(
    ("local", "listed"),
    [(True, "both"), (False, "both"), (False, "first")],
    ids=["short-circuit", "http", "http-learnt-from-the-fleet"],
)
def test_an_epoch_goes_on_through_another_node_when_its_node_is_killed(
    fleet: list[GatewayNode], local: bool, listed: str
) -> None:
    used, other = fleet
    options: dict[str, Any] = {
        "endpoint_url": [used.url, other.url] if listed == "both" else used.url,
        "key": ACCESS_KEY,
        "secret": SECRET_KEY,
    }
    if local:
        options["local_socket"] = str(used.data_dir / "gateway.sock")
    dataset = GatewayDataset([f"data/train/{i:03d}" for i in range(OBJECTS)], **options)
    fs = dataset.fs
    now = [0.0]
    if fs._local is not None:
        fs._local._clock = lambda: now[0]  # the client's clock: when it looks at its node
    order = list(range(OBJECTS))[::-1]
    batches = [order[i : i + BATCH] for i in range(0, OBJECTS, BATCH)]
    wrong = []
    for n, batch in enumerate(batches):
        if n == len(batches) // 2:
            assert fs.endpoint_url == used.url
            if local:
                assert fs.stats.short_circuit_reads > 0
            used.crash()  # SIGKILL, mid-epoch
            now[0] += NODE_CHECK
        for i, data in zip(batch, dataset.__getitems__(batch), strict=True):
            if data != _blob(i):
                wrong.append(i)
    assert wrong == []
    assert fs.endpoint_url == other.url and fs.stats.failovers == 1
    if local:
        assert fs.stats.leases_lost > 0  # the dead node's leases, dropped
    # The next epoch reads through the node that answers, from the start.
    assert [dataset[i] == _blob(i) for i in range(OBJECTS)] == [True] * OBJECTS
    assert fs.stats.failovers == 1
    fs.close()
