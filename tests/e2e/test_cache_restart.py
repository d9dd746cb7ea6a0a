"""The page store across restarts of a real gateway over moto (origin requests and bytes counted
at the proxy): a restart after SIGTERM or kill -9 costs at most one small request per cached
object and no body bytes, and what a kill -9 left in inflight/ is swept at the next start."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.cache.janitor import read_stats
from gateway.cache.layout import BLOCKS_DIR
from gateway.cache.pages import key_name
from tests.e2e.test_cache_faults import blob, get, metric, mount
from tests.support.gateway import GatewayNode, start_gateway
from tests.support.net import eventually
from tests.support.origin import CountingProxy

MiB = 1 << 20
BUCKET = "origin-faults"  # the bucket test_cache_faults mounts
SMALL = [f"restart/small-{i:02d}" for i in range(50)]
LARGE = "restart/large.bin"


@pytest.fixture(scope="module")
def dataset(origin_s3: Any) -> dict[str, bytes]:
    if BUCKET not in {b["Name"] for b in origin_s3.list_buckets()["Buckets"]}:
        origin_s3.create_bucket(Bucket=BUCKET)
    bodies = {key: blob(100_000, 100 + i) for i, key in enumerate(SMALL)}
    bodies[LARGE] = blob(8 * MiB + 7, 99)
    for key, body in bodies.items():
        origin_s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    return bodies


@pytest.mark.parametrize("ttl", ["default", "immutable"])
@pytest.mark.parametrize("stop", ["sigterm", "sigkill"])
def test_a_restart_refetches_no_cached_bytes(
    tmp_path: Path, origin: CountingProxy, dataset: dict[str, bytes], ttl: str, stop: str
) -> None:
    node = start_gateway(tmp_path / "n")
    try:
        mount(node, origin, "faults", *(["metadata_ttl=-1"] if ttl == "immutable" else []))
        for key, body in dataset.items():
            assert get(node, "faults", key) == body
        eventually(lambda: metric(node, "gateway_cache_fills") >= len(SMALL) + 3)
        if ttl == "immutable":
            eventually(lambda: _recorded(tmp_path / "n") == len(dataset))
        # Each commit writes its key's record (keyrecords.py), unless a sibling held the file
        # then: that one is written within half a second, and a kill -9 before it loses it.
        eventually(lambda: _held(tmp_path / "n") == len(dataset))
        if stop == "sigkill":
            node.crash()
    finally:
        node.stop()

    again = start_gateway(tmp_path / "n", port=node.port)
    try:
        origin.reset()
        _hits_only(again, dataset)
        assert origin.bytes_sent("GET") == 0
        assert origin.count("GET") == 0
        # At most one small request each: a HEAD, unless the version is remembered (TTL -1).
        heads = [r.path for r in origin.requests if r.method == "HEAD"]
        assert len(heads) == (0 if ttl == "immutable" else len(dataset)), heads
    finally:
        again.stop()


def test_a_restarted_node_takes_the_versions_of_a_keys_neighbours_with_it(
    tmp_path: Path, origin: CountingProxy, dataset: dict[str, bytes]
) -> None:
    """After a restart, the first read of an immutable mount's key, found only in its row,
    brings the rows of the keys after it (one read): those are then hits answered at the
    edge, with no lookup of their own (each took the full path and a query before)."""
    node = start_gateway(tmp_path / "n")
    try:
        mount(node, origin, "faults", "metadata_ttl=-1")
        for key in SMALL:
            assert get(node, "faults", key) == dataset[key]
        eventually(lambda: _recorded(tmp_path / "n") == len(SMALL))
        eventually(lambda: _held(tmp_path / "n") == len(SMALL))
    finally:
        node.stop()

    again = start_gateway(tmp_path / "n", port=node.port)
    try:
        origin.reset()
        s3 = again.client()
        assert s3.get_object(Bucket="faults", Key=SMALL[0])["Body"].read() == dataset[SMALL[0]]
        rest = len(SMALL) - 1
        eventually(lambda: metric(again, "gateway_versions_neighbours_learnt") >= rest)
        fast = metric(again, "gateway_edge_fast_answers")
        for key in SMALL[1:]:
            got = s3.get_object(Bucket="faults", Key=key)
            assert got["Body"].read() == dataset[key]
            assert got["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit", key
        eventually(lambda: metric(again, "gateway_edge_fast_answers") - fast >= rest)
        assert origin.count("GET") == 0
    finally:
        again.stop()


@pytest.mark.parametrize("found_by", ["read", "load"])
def test_a_block_left_without_its_key_record_by_a_kill_is_found_and_recorded_again(
    tmp_path: Path, origin: CountingProxy, dataset: dict[str, bytes], found_by: str
) -> None:
    """Found in CI (tests/e2e/test_jobs_fleet_faults.py): a node killed -9 between a block's
    rename into place and its key's record kept the block, but no read found it: each read
    after the restart fetched the key from the store again, and a load counted it cached. A
    block 0 found by its name (a read's fill claiming it, a load's look) gets its record back,
    so the reads after the next restart are hits."""
    keys = SMALL[:10]
    node = start_gateway(tmp_path / "n")
    try:
        mount(node, origin, "faults")
        for key in keys:
            assert get(node, "faults", key) == dataset[key]
        eventually(lambda: _held(tmp_path / "n") >= len(keys))
    finally:
        node.stop()
    _drop_records(tmp_path / "n", keys)  # what the kill left: the blocks, not their records

    again = start_gateway(tmp_path / "n", port=node.port)
    try:
        origin.reset()
        if found_by == "read":
            for key in keys:  # its version unknown: opened from the store, as a cold read
                assert get(again, "faults", key) == dataset[key]
        else:
            out = again.cli("load", "faults/restart/small-0", "--format", "json")
            job = json.loads(out.stdout)
            assert (job["state"], job["cached_objects"]) == ("done", len(keys)), job
        assert origin.bytes_sent("GET") <= len(keys) * 100_000  # block 0 of each at most
        eventually(lambda: metric(again, "gateway_cache_records_kept") >= len(keys))
    finally:
        again.stop()

    third = start_gateway(tmp_path / "n", port=node.port)
    try:
        origin.reset()
        _hits_only(third, {key: dataset[key] for key in keys})
        assert origin.count("GET") == 0
    finally:
        third.stop()


def test_blocks_a_kill_kept_out_of_the_journals_count_against_the_capacity_at_the_restart(
    tmp_path: Path,
) -> None:
    """Found by trying: a node killed -9 right after 300 reads kept every block, but its
    journals had not told the janitor of the last ~90 (their records are flushed every half
    second): counted against no capacity, never evicted, until the hourly rescan. A journal
    its writer left unsealed now starts a rescan at the restart."""
    files = tmp_path / "files"
    files.mkdir()
    for i in range(300):
        (files / f"f{i:03d}").write_bytes(blob(20_000, i))
    node = start_gateway(tmp_path / "n")
    try:
        node.cli("mount", "add", "local", files.as_uri())
        eventually(lambda: node.client().head_bucket(Bucket="local"))
        s3 = node.client()
        for i in range(300):
            assert s3.get_object(Bucket="local", Key=f"f{i:03d}")["Body"].read() == blob(20_000, i)
        node.crash()  # at once: the reads' last records are still in the workers' memory
    finally:
        node.stop()
    cache = tmp_path / "n" / "cache"
    on_disk = sum(1 for p in (cache / BLOCKS_DIR).rglob("*") if p.is_file())
    assert on_disk == 300

    again = start_gateway(tmp_path / "n", port=node.port)
    try:
        eventually(lambda: (s := read_stats(str(cache))) is not None and s.entries == on_disk)
        stats = read_stats(str(cache))
        assert stats is not None and stats.bytes_used == sum(
            p.stat().st_size for p in (cache / BLOCKS_DIR).rglob("*") if p.is_file()
        )
    finally:
        again.stop()


def _hits_only(node: GatewayNode, bodies: dict[str, bytes]) -> None:
    """Each key read whole through the node and answered from its cache (x-cache: hit)."""
    s3 = node.client()
    for key, body in bodies.items():
        got = s3.get_object(Bucket="faults", Key=key)
        assert got["Body"].read() == body
        assert got["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit", key


def _drop_records(data_dir: Path, keys: list[str]) -> None:
    """Remove the keys' rows from keys.db (mount 1), as a process killed before it wrote them."""
    (found,) = data_dir.rglob("keys.db")
    with contextlib.closing(sqlite3.connect(found)) as db, db:
        for key in keys:
            db.execute(
                "DELETE FROM held WHERE mount = 1 AND key = ?", (bytes.fromhex(key_name(1, key)),)
            )
    assert _held(data_dir) == 0


def _recorded(data_dir: Path) -> int:
    with sqlite3.connect(data_dir / "gateway.db") as db:
        row = db.execute(
            "SELECT count(*) FROM object_versions WHERE key LIKE 'restart/%'"
        ).fetchone()
    return int(row[0])


def _held(data_dir: Path) -> int:
    (found,) = data_dir.rglob("keys.db")
    with contextlib.closing(sqlite3.connect(found)) as db:
        return int(db.execute("SELECT count(*) FROM held").fetchone()[0])


# -- leftovers of a kill -9 ----------------------------------------------------------------------


def test_a_kill_during_cold_reads_and_puts_leaves_nothing_in_inflight_after_a_restart(
    tmp_path: Path, origin: CountingProxy, origin_s3: Any, dataset: dict[str, bytes]
) -> None:
    big = blob(40 * MiB, 50)
    origin_s3.put_object(Bucket=BUCKET, Key="leftovers/cold.bin", Body=big)
    node = start_gateway(tmp_path / "n")
    try:
        inflight = tmp_path / "n" / "cache" / "inflight"
        mount(node, origin, "faults")
        s3 = node.client()
        get_url = s3.generate_presigned_url(
            "get_object", Params={"Bucket": "faults", "Key": "leftovers/cold.bin"}
        )
        put_url = s3.generate_presigned_url(
            "put_object", Params={"Bucket": "faults", "Key": "leftovers/put.bin"}
        )
        release = threading.Event()
        # The cold read's fills past its first block (read ahead) are held at the origin after
        # their first piece: in flight until the kill, however fast the store answers.
        held = origin.hold_bodies("leftovers/cold.bin", from_byte=1)

        def body() -> Iterator[bytes]:
            yield blob(16 * MiB, 51)
            release.wait(60)
            yield blob(8 * MiB, 52)

        def put() -> None:
            with contextlib.suppress(httpx.HTTPError):  # the node is killed under it
                httpx.put(
                    put_url, content=body(), headers={"Content-Length": str(24 * MiB)}, timeout=60
                )

        writer = threading.Thread(target=put)
        writer.start()
        with httpx.Client(timeout=60) as client:
            streams = [client.stream("GET", get_url) for _ in range(3)]
            try:
                for stream in streams:
                    next(stream.__enter__().iter_bytes(64 << 10))

                def both_kinds_in_flight() -> bool:
                    names = [p.name for p in inflight.iterdir()]
                    spooled = any(n.startswith(".w.") for n in names)
                    filling = any(not n.startswith(".") for n in names)
                    assert spooled and filling, f"in flight: {names}; origin saw {origin.requests}"
                    return True

                eventually(both_kinds_in_flight)
                node.crash()
            finally:
                release.set()
                held.set()
                for stream in streams:
                    with contextlib.suppress(httpx.HTTPError):
                        stream.__exit__(None, None, None)
        writer.join()
    finally:
        node.stop()
    assert list(inflight.iterdir())  # what the kill left

    again = start_gateway(tmp_path / "n", port=node.port)
    try:
        assert list(inflight.iterdir()) == []
        assert get(again, "faults", "leftovers/cold.bin") == big
        eventually(lambda: list(inflight.iterdir()) == [])
    finally:
        again.stop()
