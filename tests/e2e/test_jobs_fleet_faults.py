"""Preload jobs on fleets of their own whose nodes are killed, all stopped and started again,
or joined by a new one mid-job (test_jobs_fleet.py has the fleet that nothing happens to)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from gateway.jobs.db import BATCH
from tests.e2e.test_jobs_fleet import (
    JobsFleet,
    gets,
    make_origin,
    own_fleet,
    owned_by,
    put_all,
    read_all,
    slow_objects,
)
from tests.support.net import eventually
from tests.support.origin import CountingProxy
from tests.support.postgres import rows

# Fleets of gateway processes on PostgreSQL, a node killed with SIGKILL.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dataset(origin_s3: Any) -> dict[str, bytes]:
    make_origin(origin_s3)
    data = slow_objects()
    put_all(origin_s3, data)
    return data


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
