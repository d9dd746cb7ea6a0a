"""Preload jobs on three gateway processes over one PostgreSQL database, the origin behind the
counting proxy: each object fetched once for the fleet, then a hit through every node; the
counts of --verify; a node killed mid-job; every node stopped and started again."""

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
from gateway.jobs.db import BATCH
from tests.e2e.test_fleet import SECRET, Fleet
from tests.support.gateway import GatewayNode, start_gateway
from tests.support.net import eventually, free_port
from tests.support.origin import CountingProxy
from tests.support.postgres import rows, temp_database

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


@pytest.fixture(scope="module")
def dataset(origin_s3: Any) -> dict[str, bytes]:
    """ds/: 1,000 small objects; big/: objects of several 1 MiB blocks; slow/: more small
    ones for the jobs that are stopped half way."""
    origin_s3.create_bucket(Bucket=ORIGIN)
    data = {small(i): blob(SMALL, small(i)) for i in range(OBJECTS)}
    data.update({f"big/{i}": blob(3 * MiB + 1000 * i, f"big/{i}") for i in range(3)})
    data.update({f"slow/{i:03d}": blob(SMALL, f"slow/{i}") for i in range(300)})
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda kv: origin_s3.put_object(Bucket=ORIGIN, Key=kv[0], Body=kv[1]),
                      data.items()))  # fmt: skip
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


@pytest.fixture
def fresh(tmp_path: Path, origin: CountingProxy, dataset: dict[str, bytes]) -> Iterator[JobsFleet]:
    """A fleet of its own, for a test that kills its nodes: a node gone 5 s has its share of
    a job taken over."""
    with own_fleet(tmp_path, origin, 5) as fleet:
        yield fleet


@pytest.fixture
def patient(
    tmp_path: Path, origin: CountingProxy, dataset: dict[str, bytes]
) -> Iterator[JobsFleet]:
    """A fleet of its own whose nodes wait a minute before taking over a share: longer than
    the restart of all three."""
    with own_fleet(tmp_path, origin, 60) as fleet:
        yield fleet


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


@pytest.mark.timeout(300)
def test_a_node_killed_mid_job_leaves_its_share_to_the_others(
    fresh: JobsFleet, origin: CountingProxy, dataset: dict[str, bytes]
) -> None:
    keys = sorted(k for k in dataset if k.startswith("slow/"))
    origin.reset()
    _, job = fresh.load("data/slow/", "--bandwidth", "48KiB/s", "--concurrency", "2", "--detach")

    def node_2_loaded() -> bool:
        return fresh.job(job["id"])["nodes"].get("node-2", {}).get("loaded_objects", 0) >= 10

    eventually(node_2_loaded, timeout=60)
    victim = fresh.nodes[2]
    victim.crash()
    # What node-2 had written down as loaded when it died (its shares' cursors): the others
    # take its share over only after 5 s, so this is node-2's own record.
    recorded = written_down(fresh.url, job["id"], "node-2")
    eventually(lambda: fresh.job(job["id"])["state"] == "done", timeout=120)
    ended = fresh.job(job["id"])
    assert ended["objects_done"] == len(keys), ended["message"]
    fetched = gets(origin, "slow/")
    assert {p.rsplit("/", 2)[-2] + "/" + p.rsplit("/", 1)[-1] for p in fetched} == set(keys)
    # Fetched twice: only node-2's objects that it had in flight, or had loaded but not yet
    # written down (within 0.1 s of each object, later when the database is slow to answer
    # on a busy machine); never one it had written down, never another node's.
    twice = {p.rsplit("/", 2)[-2] + "/" + p.rsplit("/", 1)[-1] for p, n in fetched.items()
             if n > 1}  # fmt: skip
    why = (sorted(twice), origin.upstream_failures)
    mine = owned_by("node-2", keys, dataset)
    assert twice <= mine - recorded, why
    assert len(twice) <= 12, why  # 2 in flight and ~1 s of its 8 objects/s, at the most
    assert max(fetched.values()) <= 2
    # What node-2 had not loaded was loaded by the others: read through them, only what
    # node-2 loaded (on its disk, back when it is) comes from the origin.
    origin.reset()
    assert read_all(fresh.nodes[:2], keys, dataset)
    assert len(gets(origin, "slow/")) <= ended["nodes"]["node-2"]["loaded_objects"] + 3


def written_down(url: str, job_id: int, node_id: str) -> set[str]:
    """The keys of `node_id`'s shares of the job that its progress in the database counts as
    done: a share's items before its cursor (all of a share that is done)."""
    found = rows(
        url,
        "SELECT i.key FROM job_items i JOIN job_work w ON w.job_id = i.job_id"
        " AND i.seq >= w.batch * $3"
        " AND i.seq < w.batch * $3 + CASE WHEN w.state = 'done' THEN $3 ELSE w.cursor END"
        " WHERE w.job_id = $1 AND w.node_id = $2",
        job_id,
        node_id,
        BATCH,
    )
    return {str(r["key"]) for r in found}


@pytest.mark.timeout(300)
def test_a_job_resumes_when_every_node_is_started_again(
    patient: JobsFleet, origin: CountingProxy, dataset: dict[str, bytes]
) -> None:
    keys = sorted(k for k in dataset if k.startswith("slow/"))
    origin.reset()
    # 600 KiB at 24 KiB/s: most of the job is left when the nodes stop, however long a loaded
    # machine takes to stop them.
    _, job = patient.load("data/slow/", "--bandwidth", "24KiB/s", "--detach")
    eventually(lambda: patient.job(job["id"])["objects_done"] >= 60, timeout=60)
    # Stopped together, as a fleet's restart does, and not killed: a stop lets the loads in
    # flight end and writes down its share.
    with ThreadPoolExecutor(len(patient.nodes)) as pool:
        ended_alone = list(pool.map(lambda node: node.stop(wait=60), patient.nodes))
    for node, alone in zip(patient.nodes, ended_alone, strict=True):
        assert alone, node.log()[-3000:]
    stopped = patient.job(job["id"])
    assert stopped["state"] == "running" and stopped["objects_done"] < len(keys)
    for i in range(3):
        patient.start(i)
    eventually(lambda: patient.job(job["id"])["state"] != "running", timeout=120)
    ended = patient.job(job["id"])
    assert (ended["state"], ended["objects_done"]) == ("done", len(keys)), ended
    fetched = gets(origin, "slow/")
    twice = sorted(p for p, n in fetched.items() if n > 1)
    assert len(fetched) == len(keys) and not twice, (twice, origin.upstream_failures)
    origin.reset()
    assert read_all(patient.nodes, keys, dataset)
    assert origin.count("GET") == 0, (sorted(gets(origin, "slow/")), ended)


@pytest.mark.timeout(300)
def test_a_node_joining_mid_job_loads_the_keys_that_moved_to_it(
    fresh: JobsFleet, origin: CountingProxy, dataset: dict[str, bytes]
) -> None:
    keys = sorted(k for k in dataset if k.startswith("slow/"))
    origin.reset()
    # 600 KiB at 12 KiB/s: the newcomer joins with most of the job still to do, however long
    # a loaded machine takes to start it.
    _, job = fresh.load("data/slow/", "--bandwidth", "12KiB/s", "--detach")
    eventually(lambda: fresh.job(job["id"])["objects_done"] >= 30, timeout=60)
    fresh.start(3)
    eventually(lambda: fresh.job(job["id"])["state"] != "running", timeout=180)
    ended = fresh.job(job["id"])
    assert (ended["state"], ended["objects_done"]) == ("done", len(keys)), ended
    assert ended["nodes"]["node-3"]["loaded_objects"] > 0
    # Keys loaded before the join and moved to the newcomer were loaded there too; no other
    # key was fetched twice.
    fetched = gets(origin, "slow/")
    assert len(fetched) == len(keys) and max(fetched.values()) <= 2
    eventually(lambda: fresh.settled({f"node-{i}" for i in range(4)}), timeout=30)
    origin.reset()
    assert read_all(fresh.nodes, keys, dataset)
    assert not gets(origin, "slow/")  # every key where reads look for it
