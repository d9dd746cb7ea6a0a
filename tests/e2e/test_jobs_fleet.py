"""Preload jobs on three gateway processes over one PostgreSQL database, the origin behind the
counting proxy: each object fetched once for the fleet, then a hit through every node; the
counts of --verify. Jobs through nodes killed, restarted and joining: test_jobs_fleet_faults.py
(a file of its own, so that the two run side by side)."""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from gateway.cluster.placement import Node, Placement, object_key
from tests.e2e.test_fleet import SECRET, Fleet
from tests.support.gateway import GatewayNode, start_gateway
from tests.support.net import eventually, free_port
from tests.support.origin import CountingProxy
from tests.support.postgres import temp_database

# Fleets of gateway processes on PostgreSQL, a node killed with SIGKILL.
pytestmark = pytest.mark.slow

ORIGIN = "origin-jobs"
OBJECTS = 1000
SMALL = 2048
MiB = 1 << 20


def blob(n: int, seed: str) -> bytes:
    block = hashlib.sha256(seed.encode()).digest() * 64  # 2 KiB
    return (block * (n // len(block) + 1))[:n]


def small(i: int) -> str:
    return f"ds/{i:04d}"


def make_origin(origin_s3: Any) -> None:
    """The origin bucket, whichever of this file and test_jobs_fleet_faults.py runs first
    against the session's origin."""
    made = (origin_s3.exceptions.BucketAlreadyOwnedByYou, origin_s3.exceptions.BucketAlreadyExists)
    with contextlib.suppress(*made):
        origin_s3.create_bucket(Bucket=ORIGIN)


def put_all(origin_s3: Any, data: dict[str, bytes]) -> None:
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda kv: origin_s3.put_object(Bucket=ORIGIN, Key=kv[0], Body=kv[1]),
                      data.items()))  # fmt: skip


def slow_objects() -> dict[str, bytes]:
    """slow/: small objects for the jobs that are stopped half way."""
    return {f"slow/{i:03d}": blob(SMALL, f"slow/{i}") for i in range(300)}


@pytest.fixture(scope="module")
def dataset(origin_s3: Any) -> dict[str, bytes]:
    """ds/: 1,000 small objects; big/: objects of several 1 MiB blocks; slow/: more small
    ones for the jobs that are stopped half way."""
    make_origin(origin_s3)
    data = {small(i): blob(SMALL, small(i)) for i in range(OBJECTS)}
    data.update({f"big/{i}": blob(3 * MiB + 1000 * i, f"big/{i}") for i in range(3)})
    data.update(slow_objects())
    put_all(origin_s3, data)
    return data


class JobsFleet(Fleet):
    """Three nodes; a node gone `takeover` seconds has its share of a job taken over."""

    def __init__(self, root: Path, url: str, origin: CountingProxy, takeover: float = 5) -> None:
        self.takeover = takeover
        super().__init__(root, url, origin)

    def add(self, issuer: Any = None) -> GatewayNode:
        return self.start(len(self.nodes))

    def mount(self, bucket: str, *options: str) -> None:
        opts = ["-o", f"endpoint_url={self.origin.url}", "-o", "access_key=origin-ak"]
        opts += ["-o", "secret_key=origin-sk", "-o", "metadata_ttl=600"]
        for option in options:
            opts += ["-o", option]
        self.nodes[0].cli("mount", "add", bucket, f"s3://{ORIGIN}", *opts)
        for node in self.nodes:
            eventually(lambda n=node: bucket in n.buckets())

    def load(self, *args: str, check: bool = True) -> tuple[int, dict[str, Any]]:
        """`gateway load ... --format json` against the database: exit status and the job."""
        out = self.nodes[0].cli("load", *args, "--format", "json", check=False)
        if check and out.returncode not in (0, 3, 4):
            raise AssertionError(f"load failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
        return out.returncode, json.loads(out.stdout)

    def start(self, i: int) -> GatewayNode:
        """Start node-<i> again, on its own data directory (so with its cache and its id)."""
        internal = free_port()
        args = (
            "--fleet-secret", SECRET, "--internal-port", str(internal),
            "--heartbeat-interval", "0.5", "--heartbeat-timeout", "3",
            "--cache-block-size", "1MiB", "--node-id", f"node-{i}", "--no-access-log",
            "--job-takeover-delay", str(self.takeover),
        )  # fmt: skip
        node = start_gateway(self.root / f"n{i}", database_url=self.url, env=self.env, args=args)
        if i < len(self.nodes):
            self.nodes[i] = node
        else:
            self.nodes.append(node)
        self.internal[node.port] = internal
        return node

    def job(self, job_id: int) -> dict[str, Any]:
        """The job from a running node's API (a look costs no CLI process), or from the
        database through the CLI when every node is stopped."""
        for node in self.nodes:
            if node.proc.poll() is None:
                return node.job(job_id)
        out = self.nodes[0].cli("jobs", "show", str(job_id), "--format", "json")
        return dict(json.loads(out.stdout))


@pytest.fixture(scope="module")
def fleet(
    module_dir: Path, origin: CountingProxy, dataset: dict[str, bytes]
) -> Iterator[JobsFleet]:
    with temp_database() as url:
        fleet = JobsFleet(module_dir, url, origin)
        try:
            fleet.mount("data")
            ids = {f"node-{i}" for i in range(3)}
            eventually(lambda: fleet.settled(ids), timeout=30)
            yield fleet
        finally:
            fleet.stop()


@contextlib.contextmanager
def own_fleet(root: Path, origin: CountingProxy, takeover: float) -> Iterator[JobsFleet]:
    with temp_database() as url:
        fleet = JobsFleet(root, url, origin, takeover)
        try:
            fleet.mount("data")
            ids = {f"node-{i}" for i in range(3)}
            eventually(lambda: fleet.settled(ids), timeout=30)
            yield fleet
        finally:
            fleet.stop()


def owned_by(node_id: str, keys: list[str], data: dict[str, bytes]) -> set[str]:
    """The keys whose owner `node_id` is among the three nodes (mount 1, equal weights)."""
    placement = Placement([Node(f"node-{i}", "", 10.0) for i in range(3)])
    out = set()
    for key in keys:
        if placement.owners(object_key(1, key))[0].id == node_id:
            out.add(key)
    return out


def gets(origin: CountingProxy, prefix: str) -> collections.Counter[str]:
    """GETs of objects under `prefix` the origin received, by path (a listing is no GET of an
    object: its path is the bucket's)."""
    with origin._lock:
        return collections.Counter(
            r.path for r in origin.requests if r.method == "GET" and f"/{prefix}" in r.path
        )


def read_all(nodes: list[GatewayNode], keys: list[str], data: dict[str, bytes]) -> bool:
    def through(node: GatewayNode) -> bool:
        s3 = node.client()
        return all(s3.get_object(Bucket="data", Key=k)["Body"].read() == data[k] for k in keys)

    with ThreadPoolExecutor(len(nodes)) as pool:
        return all(pool.map(through, nodes))


@pytest.mark.timeout(300)
def test_a_job_fetches_each_object_once_and_then_every_node_hits(
    fleet: JobsFleet, origin: CountingProxy, dataset: dict[str, bytes]
) -> None:
    origin.reset()
    status, job = fleet.load("data/ds/", "--concurrency", "16")
    assert (status, job["state"]) == (0, "done"), job
    assert (job["total_objects"], job["objects_done"]) == (OBJECTS, OBJECTS), json.dumps(job)
    assert job["bytes_done"] == OBJECTS * SMALL
    fetched = gets(origin, "ds/")
    assert len(fetched) == OBJECTS and set(fetched.values()) == {1}
    # Each node loaded the objects it owns, and only those: a third or so each.
    loaded = {node: p["loaded_objects"] for node, p in job["nodes"].items()}
    assert set(loaded) == {"node-0", "node-1", "node-2"}
    assert sum(loaded.values()) == OBJECTS and min(loaded.values()) > OBJECTS // 6

    origin.reset()
    keys = [small(i) for i in range(OBJECTS)]
    assert read_all(fleet.nodes, keys, dataset)
    assert origin.count("GET") == 0  # every read a hit, at the owner (HEADs: each node's TTL)


def test_verify_counts_what_each_node_holds(fleet: JobsFleet) -> None:
    _, loaded = fleet.load("data/ds/", "--detach")
    eventually(lambda: fleet.job(loaded["id"])["state"] == "done", timeout=60)
    status, job = fleet.load("data/ds/", "--verify")
    assert (status, job["state"], job["kind"]) == (0, "done", "verify")
    assert job["cached_objects"] == OBJECTS and job["cached_bytes"] == OBJECTS * SMALL
    assert job["loaded_bytes"] == 0
    first = fleet.job(1)  # the first load: what each node holds is what it loaded
    per_node = {n: p["cached_objects"] for n, p in job["nodes"].items()}
    assert per_node == {n: p["loaded_objects"] for n, p in first["nodes"].items()}
    assert "1000 of 1000 objects" in job["message"]


def test_a_job_over_large_objects_fetches_each_block_once(
    fleet: JobsFleet, origin: CountingProxy, dataset: dict[str, bytes]
) -> None:
    origin.reset()
    status, job = fleet.load("data/big/")
    assert (status, job["state"]) == (0, "done"), job
    total = sum(len(v) for k, v in dataset.items() if k.startswith("big/"))
    with origin._lock:
        ranges = [(r.path, r.range) for r in origin.requests if "/big/" in r.path]
    blocks = sum(-(-len(v) // MiB) for k, v in dataset.items() if k.startswith("big/"))
    assert len(ranges) == len(set(ranges)) == blocks  # each block once, by its owner
    assert sum(p["loaded_bytes"] for p in job["nodes"].values()) == total
    assert all(p["loaded_bytes"] > 0 for p in job["nodes"].values())  # spread over the fleet
    origin.reset()
    assert read_all(fleet.nodes, [f"big/{i}" for i in range(3)], dataset)
    assert origin.count("GET") == 0

    # A second copy of each block at its second owner, copied from the first, not fetched.
    status, again = fleet.load("data/big/", "--replicas", "2")
    assert (status, again["state"]) == (0, "done"), again
    assert not gets(origin, "big/")
    assert sum(p["loaded_bytes"] for p in again["nodes"].values()) == total
    _, verify = fleet.load("data/big/", "--replicas", "2", "--verify")
    assert verify["cached_bytes"] == 2 * total
