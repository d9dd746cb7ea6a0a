"""`gateway load --unpin` on a fleet of two gateway processes over PostgreSQL, each with a
small cache: pinned blocks on both nodes survive cache pressure; the unpin, through the real
command line, takes every pin off on every node (pinned bytes drop to 0), durably (a node
killed right after the command returned comes back without the pins, and so does one
stopped), and the blocks, still cached, are then evicted under pressure like any other."""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet

from gateway.cache.janitor import read_stats
from gateway.cache.layout import file_size
from tests.e2e.test_fleet import SECRET, heard
from tests.support.gateway import GatewayNode, start_gateway
from tests.support.net import eventually, free_port
from tests.support.origin import CountingProxy
from tests.support.postgres import temp_database

# Two gateway processes, one killed with SIGKILL and both restarted.
pytestmark = pytest.mark.slow

ORIGIN = "origin-unpin"
KiB = 1 << 10
BLOCK = 256 * KiB
CAPACITY = 2 << 20  # per node: the filler below is several times that over two nodes


def blob(n: int, seed: str) -> bytes:
    block = hashlib.sha256(seed.encode()).digest() * 64
    return (block * (n // len(block) + 1))[:n]


# pinned/: four one-block objects and one of three blocks, 1.1 MiB in all over both nodes.
PINNED = {f"pinned/{i}": blob(100 * KiB, f"pinned/{i}") for i in range(4)}
PINNED["pinned/three-blocks"] = blob(2 * BLOCK + 50 * KiB, "pinned/three-blocks")
PINNED_BLOCKS = 4 + 3
# Filler: one-block objects read once each, 8 MiB of them a round.
FILLER = {f"{p}/{i:02d}": blob(BLOCK, f"{p}/{i}") for p in ("other", "more") for i in range(32)}


def on_disk(body: bytes) -> int:
    """Bytes a cached object takes on disk: its blocks' files, checksums included."""
    return sum(file_size(min(BLOCK, len(body) - o)) for o in range(0, len(body), BLOCK))


class Pair:
    """node-0 and node-1 on one database, each with its own data directory (kept over
    restarts) and a 2 MiB cache."""

    def __init__(self, root: Path, url: str) -> None:
        self.root, self.url = root, url
        self.env = {"GATEWAY_ENCRYPTION_KEY": Fernet.generate_key().decode()}
        self.nodes: list[GatewayNode] = []
        for i in range(2):
            self.nodes.append(self.start(i))

    def start(self, i: int) -> GatewayNode:
        args = (
            "--fleet-secret", SECRET, "--internal-port", str(free_port()),
            "--heartbeat-interval", "0.5", "--heartbeat-timeout", "3",
            "--cache-block-size", "256KiB", "--cache-capacity", str(CAPACITY),
            "--cache-memory", "0", "--node-id", f"node-{i}", "--no-access-log",
        )  # fmt: skip
        node = start_gateway(self.root / f"n{i}", database_url=self.url, env=self.env, args=args)
        if i < len(self.nodes):
            self.nodes[i] = node
        return node

    def settled(self) -> bool:
        """Both nodes live in the database, and each has heard of both."""
        ids = {"node-0", "node-1"}
        out = self.nodes[0].cli("status", "--json", "--heartbeat-timeout", "3").stdout
        live = {n["id"] for n in json.loads(out) if n["live"]}
        return live == ids and all(heard(node) == ids for node in self.nodes)

    def load(self, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
        """`gateway load ... --format json` through the real command line, on the database."""
        out = self.nodes[0].cli("load", *args, "--format", "json", check=False)
        assert out.returncode in (0, 3), f"load {args} ended {out.returncode}:\n{out.stderr}"
        return out, json.loads(out.stdout)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def pinned_bytes(node: GatewayNode) -> float:
    return node.metric("gateway_cache_pinned_bytes")


def evictions(node: GatewayNode) -> float:
    return node.metric("gateway_cache_evictions")


def read(node: GatewayNode, keys: list[str], data: dict[str, bytes]) -> None:
    s3 = node.client()

    def one(key: str) -> None:
        assert s3.get_object(Bucket="data", Key=key)["Body"].read() == data[key]

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, keys))


def fetched(origin: CountingProxy, prefix: str) -> collections.Counter[str]:
    """GETs of objects under `prefix` the origin received, by path."""
    with origin._lock:
        return collections.Counter(
            r.path for r in origin.requests
            if r.method == "GET" and f"/{ORIGIN}/{prefix}" in r.path
        )  # fmt: skip


def janitor_of(node: GatewayNode) -> Any:
    """The figures a janitor in one of the node's worker processes of now has published:
    None until the node's janitor, after a restart, has loaded its index and made its pass."""
    stats = read_stats(os.path.join(node.data_dir, "cache"))
    processes = {node.proc.pid, *node.workers()}  # one worker: the node's own process
    return stats if stats is not None and stats.pid in processes else None


def create_bucket(origin_s3: Any, name: str) -> None:
    """The origin's bucket; there already when the session ran this file before."""
    made = (origin_s3.exceptions.BucketAlreadyOwnedByYou, origin_s3.exceptions.BucketAlreadyExists)
    with contextlib.suppress(*made):
        origin_s3.create_bucket(Bucket=name)


@pytest.fixture
def pair(tmp_path: Path, origin: CountingProxy, origin_s3: Any) -> Iterator[Pair]:
    create_bucket(origin_s3, ORIGIN)
    for key, body in {**PINNED, **FILLER}.items():
        origin_s3.put_object(Bucket=ORIGIN, Key=key, Body=body)
    with temp_database() as url:
        pair = Pair(tmp_path, url)
        try:
            pair.nodes[0].cli(
                "mount", "add", "data", f"s3://{ORIGIN}", "-o", f"endpoint_url={origin.url}",
                "-o", "access_key=origin-ak", "-o", "secret_key=origin-sk",
                "-o", "metadata_ttl=600",
            )  # fmt: skip
            for node in pair.nodes:
                eventually(lambda n=node: "data" in n.buckets())
            eventually(pair.settled, timeout=30)
            yield pair
        finally:
            pair.stop()


@pytest.mark.timeout(400)
def test_unpin_takes_every_pin_off_on_every_node_durably_and_the_blocks_become_evictable(
    pair: Pair, origin: CountingProxy
) -> None:
    node0, node1 = pair.nodes
    data = {**PINNED, **FILLER}
    pinned_total = sum(on_disk(body) for body in PINNED.values())

    _, job = pair.load("data/pinned/", "--pin")
    assert job["state"] == "done", job
    eventually(lambda: pinned_bytes(node0) + pinned_bytes(node1) == pinned_total, timeout=30)
    assert pinned_bytes(node0) > 0 and pinned_bytes(node1) > 0  # pins on both nodes

    # Pressure: 8 MiB through two 2 MiB caches. The pins stay: read back, no origin GET.
    before = [evictions(n) for n in pair.nodes]
    read(node0, sorted(k for k in FILLER if k.startswith("other/")), data)
    eventually(lambda: all(evictions(n) > b for n, b in zip(pair.nodes, before, strict=True)))
    origin.reset()
    read(node1, sorted(PINNED), data)
    assert not fetched(origin, "pinned/")

    # The unpin, through the real command line: the prefix's blocks on both nodes.
    out, job = pair.load("data/pinned/", "--unpin")
    assert (out.returncode, job["state"], job["kind"]) == (0, "done", "unpin"), job
    assert job["objects_done"] == len(PINNED) and job["unpinned_blocks"] == PINNED_BLOCKS, job
    assert job["unpinned_bytes"] == sum(len(b) for b in PINNED.values()), job
    assert all(n["cached_objects"] > 0 for n in job["nodes"].values()), job  # both nodes
    assert job["message"].startswith(f"unpinned the {PINNED_BLOCKS} blocks"), job
    assert f"job {job['id']} " in out.stderr and " objects" in out.stderr  # its progress
    # node-0 is killed the moment the command returns, whatever its janitor read by then;
    # node-1 once its janitor shows the pins gone, and stopped as an operator stops it.
    node0.crash()
    eventually(lambda: pinned_bytes(node1) == 0, timeout=30)
    assert node1.metric("gateway_cache_unpinned_blocks") > 0
    node1.stop()

    node0, node1 = pair.start(0), pair.start(1)
    stats = [eventually(lambda n=n: janitor_of(n), timeout=60) for n in (node0, node1)]
    assert [s.pinned_bytes for s in stats] == [0, 0]  # the restarts brought no pin back
    assert sum(s.unpinned_blocks for s in stats) == PINNED_BLOCKS
    eventually(pair.settled, timeout=30)
    _, verify = pair.load("data/pinned/", "--verify")
    assert verify["cached_bytes"] == sum(len(b) for b in PINNED.values()), verify  # still cached

    # Pressure again: ordinary blocks now, the oldest of those used once, they go first.
    read(node0, sorted(k for k in FILLER if k.startswith("more/")), data)
    eventually(
        lambda: pair.load("data/pinned/", "--verify")[1]["cached_bytes"] == 0,
        timeout=90, interval=0.5,
    )  # fmt: skip
    assert [pinned_bytes(n) for n in pair.nodes] == [0, 0]
    origin.reset()
    read(node1, sorted(PINNED), data)
    assert set(fetched(origin, "pinned/")) == {f"/{ORIGIN}/{k}" for k in PINNED}


ORPHANS = "origin-unpin-all"


@pytest.fixture
def lone(tmp_path: Path, origin: CountingProxy, origin_s3: Any) -> Iterator[GatewayNode]:
    """One node on its own database, a bucket of two small objects mounted."""
    create_bucket(origin_s3, ORPHANS)
    for i in range(2):
        origin_s3.put_object(Bucket=ORPHANS, Key=f"a/{i}", Body=blob(100 * KiB, f"a/{i}"))
    args = ("--cache-block-size", "256KiB", "--cache-memory", "0")
    node = start_gateway(tmp_path / "lone", args=args)
    try:
        node.cli(
            "mount", "add", "orphans", f"s3://{ORPHANS}", "-o", f"endpoint_url={origin.url}",
            "-o", "access_key=origin-ak", "-o", "secret_key=origin-sk",
        )  # fmt: skip
        eventually(lambda: "orphans" in node.buckets())
        yield node
    finally:
        node.stop()


def test_an_unpin_of_a_whole_bucket_reaches_pins_of_versions_no_longer_listed(
    lone: GatewayNode, origin_s3: Any
) -> None:
    """The issue's unreachable pins: an object overwritten at the origin after its load keeps
    its old version's blocks pinned, under a name no listing gives. An unpin of its prefix
    cannot name them; an unpin of the whole bucket takes them off too."""
    one = file_size(100 * KiB)
    load = lone.cli("load", "orphans/a/", "--pin", "--format", "json")
    assert json.loads(load.stdout)["state"] == "done"
    eventually(lambda: pinned_bytes(lone) == 2 * one)
    origin_s3.put_object(Bucket=ORPHANS, Key="a/0", Body=blob(100 * KiB, "a/0, again"))

    prefix = json.loads(lone.cli("load", "orphans/a/", "--unpin", "--format", "json").stdout)
    assert (prefix["state"], prefix["unpinned_blocks"]) == ("done", 1), prefix  # a/1 only
    eventually(lambda: lone.metric("gateway_cache_unpinned_blocks") == 1)
    assert pinned_bytes(lone) == one  # a/0's old version: still pinned

    whole = json.loads(lone.cli("load", "orphans", "--unpin", "--format", "json").stdout)
    assert whole["state"] == "done", whole
    eventually(lambda: pinned_bytes(lone) == 0)
    assert lone.metric("gateway_cache_unpinned_blocks") == 2
