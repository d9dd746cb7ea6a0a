"""The page store seen through S3: block-sized fetches from the origin (counted in bytes at
the proxy in front of moto), read-ahead, single flight across clients and worker processes,
restart and SIGKILL of a node, quotas, pins and scan resistance."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.cache import blockfile
from gateway.cache.layout import PIECE, TRAILER_SIZE, block_path, file_size
from gateway.cache.pages import BlockKey
from tests.support.gateway import GatewayNode, start_gateway
from tests.support.net import eventually
from tests.support.origin import CountingProxy

MiB = 1 << 20
BUCKET = "origin-pages"
BIG = 40 * MiB


def _blob(n: int, seed: int) -> bytes:
    block = hashlib.sha256(str(seed).encode()).digest() * 2048  # 64 KiB
    return (block * (n // len(block) + 1))[:n]


BIG_BODY = _blob(BIG, 1)


@pytest.fixture(scope="module")
def origin_bucket(origin_s3: Any) -> str:
    origin_s3.create_bucket(Bucket=BUCKET)
    origin_s3.put_object(Bucket=BUCKET, Key="big.bin", Body=BIG_BODY)
    for i in range(24):
        origin_s3.put_object(Bucket=BUCKET, Key=f"small/{i:03d}", Body=_blob(MiB, 100 + i))
    return BUCKET


def _mount(node: GatewayNode, origin: CountingProxy, bucket: str, *options: str) -> None:
    opts = ["-o", f"endpoint_url={origin.url}", "-o", "access_key=origin-ak"]
    opts += ["-o", "secret_key=origin-sk"]
    for option in options:
        opts += ["-o", option]
    node.cli("mount", "add", bucket, f"s3://{BUCKET}", *opts)
    eventually(lambda: bucket in node.buckets())


def _block_file(node: GatewayNode, origin_s3: Any, bucket: str, key: str) -> Path:
    """Where the node keeps block 0 of the key's current version (1 MiB blocks)."""
    db = node.data_dir / "gateway.db"
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        [(mount_id,)] = conn.execute("SELECT id FROM mounts WHERE bucket = ?", (bucket,))
    etag = origin_s3.head_object(Bucket=BUCKET, Key=key)["ETag"]
    name = BlockKey(mount_id, key, etag, MiB, 0).name
    return Path(block_path(str(node.data_dir / "cache"), mount_id, name))


def recorded(node: GatewayNode, key: str) -> bool:
    """The node's database has the object's version (its row of object versions is written)."""
    db = node.data_dir / "gateway.db"
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return bool(
            conn.execute("SELECT count(*) FROM object_versions WHERE key = ?", (key,)).fetchone()[0]
        )


@pytest.fixture(scope="module")
def node(module_dir: Path, origin: CountingProxy, origin_bucket: str) -> Iterator[GatewayNode]:
    node = start_gateway(module_dir / "node", args=("--cache-block-size", "4MiB"))
    _mount(node, origin, "pages", "metadata_ttl=600")  # no revalidation mid-test on a slow machine
    yield node
    node.stop()


def _get(node: GatewayNode, bucket: str, key: str, rng: str | None = None) -> bytes:
    kw = {"Range": rng} if rng else {}
    return bytes(node.client().get_object(Bucket=bucket, Key=key, **kw)["Body"].read())


def test_a_range_in_a_large_object_fetches_only_its_sub_blocks(
    node: GatewayNode, origin: CountingProxy
) -> None:
    node.client().head_object(Bucket="pages", Key="big.bin")  # metadata; no bytes
    origin.reset()
    start = 18 * MiB + MiB // 2  # inside block 4: [16 MiB, 20 MiB), on a sub-block's bound
    got = _get(node, "pages", "big.bin", f"bytes={start}-{start + MiB - 1}")
    assert got == BIG_BODY[start : start + MiB]
    # Not the whole 4 MiB block: the 128 KiB sub-blocks that hold the range, in one request.
    assert origin.bytes_sent("GET") == MiB
    assert origin.count("GET") == 1
    # A range inside it again: a hit.
    origin.reset()
    got = _get(node, "pages", "big.bin", f"bytes={start + 100_000}-{start + 600_000}")
    assert got == BIG_BODY[start + 100_000 : start + 600_001]
    assert origin.count() == 0
    # Another, unaligned range of the same block: its own sub-blocks, at most 1.2x its bytes.
    origin.reset()
    other = 16 * MiB + 100_000
    got = _get(node, "pages", "big.bin", f"bytes={other}-{other + MiB - 1}")
    assert got == BIG_BODY[other : other + MiB]
    assert origin.count("GET") == 1
    assert MiB <= origin.bytes_sent("GET") <= 1.2 * MiB


# Unaligned 1 MiB ranges far apart (never starting where another ended, so the node takes no
# reader for a sequential one), one across the boundary of blocks 5 and 6.
SCATTERED = [5 * MiB + 12_345, 33 * MiB + 777, 13 * MiB + 99_999, 24 * MiB - 300_000,
             37 * MiB + 100, MiB + 3, 29 * MiB + 65_536]  # fmt: skip


def test_random_ranges_fetch_little_more_than_their_bytes_and_a_whole_read_only_the_rest(
    node: GatewayNode, origin: CountingProxy, origin_s3: Any
) -> None:
    origin_s3.put_object(Bucket=BUCKET, Key="scattered.bin", Body=BIG_BODY)
    node.client().head_object(Bucket="pages", Key="scattered.bin")
    origin.reset()
    for start in SCATTERED:
        got = _get(node, "pages", "scattered.bin", f"bytes={start}-{start + MiB - 1}")
        assert got == BIG_BODY[start : start + MiB]
    ranged = origin.bytes_sent("GET")
    assert ranged <= 1.2 * len(SCATTERED) * MiB, [(r.method, r.range) for r in origin.requests]
    assert origin.count("GET") == len(SCATTERED) + 1  # one request a block touched
    # The whole object: each block made of the sub-blocks held and the rest, no byte twice.
    assert _get(node, "pages", "scattered.bin") == BIG_BODY
    assert origin.bytes_sent("GET") == BIG, origin.requests
    origin.reset()
    assert _get(node, "pages", "scattered.bin") == BIG_BODY
    assert origin.count() == 0


def test_concurrent_readers_of_a_range_make_one_fetch_across_the_workers(
    node: GatewayNode, origin: CountingProxy, origin_s3: Any
) -> None:
    origin_s3.put_object(Bucket=BUCKET, Key="together.bin", Body=BIG_BODY)
    for _ in range(4):  # each worker learns the version (HEADs only)
        node.client().head_object(Bucket="pages", Key="together.bin")
    origin.reset()
    gate = origin.hold_bodies("together.bin")  # the fill stays in flight until all have come
    start = 9 * MiB + 4321
    misses = node.metric("gateway_cache_misses")

    def read(_: int) -> bytes:
        return _get(node, "pages", "together.bin", f"bytes={start}-{start + MiB - 1}")

    try:
        with ThreadPoolExecutor(8) as pool:
            results = pool.map(read, range(8))
            # Every reader has missed (published by each worker within a second): all are
            # waiting on the one fill in flight, in whichever worker they came to.
            eventually(lambda: node.metric("gateway_cache_misses") - misses >= 8)
            gate.set()
            assert all(r == BIG_BODY[start : start + MiB] for r in results)
    finally:
        gate.set()
    assert origin.count("GET") == 1, origin.requests
    assert origin.bytes_sent("GET") <= 1.2 * MiB
    assert len(node.workers()) >= 2


def test_a_sequential_reader_of_ranges_is_read_ahead_and_nothing_is_fetched_twice(
    node: GatewayNode, origin: CountingProxy, origin_s3: Any
) -> None:
    origin_s3.put_object(Bucket=BUCKET, Key="walk.bin", Body=BIG_BODY)
    s3 = node.client()
    s3.head_object(Bucket="pages", Key="walk.bin")
    origin.reset()
    prefetched = node.metric("gateway_cache_prefetches")
    out = bytearray()
    for pos in range(0, BIG, MiB):
        out += _get(node, "pages", "walk.bin", f"bytes={pos}-{pos + MiB - 1}")
    assert out == BIG_BODY
    assert origin.bytes_sent("GET") == BIG  # every block once, no more
    # Each worker publishes its cache figures within a second (gateway/admin/metrics.py).
    eventually(lambda: node.metric("gateway_cache_prefetches") - prefetched >= 5)


def test_cold_full_read_then_hot(node: GatewayNode, origin: CountingProxy, origin_s3: Any) -> None:
    origin_s3.put_object(Bucket=BUCKET, Key="full.bin", Body=BIG_BODY)
    origin.reset()
    assert _get(node, "pages", "full.bin") == BIG_BODY
    assert origin.count("HEAD") == 0  # the first block's GET told the size
    assert origin.count("GET") == BIG // (4 * MiB)
    assert origin.bytes_sent("GET") == BIG
    origin.reset()
    assert _get(node, "pages", "full.bin") == BIG_BODY
    assert origin.count() == 0


def test_concurrent_clients_fetch_each_block_once(
    node: GatewayNode, origin: CountingProxy, origin_s3: Any
) -> None:
    origin_s3.put_object(Bucket=BUCKET, Key="crowd.bin", Body=BIG_BODY)
    origin.reset()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: _get(node, "pages", "crowd.bin"), range(8)))
    assert all(r == BIG_BODY for r in results)
    # Which block came twice, if one did (a block 0 without If-Match: a second open of the
    # key; with it: a second fill), what the upstream failed, and what the node warned of.
    assert origin.bytes_sent("GET") == BIG, (
        origin.repeated(),
        origin.upstream_failures,
        node.warnings(),
    )
    eventually(lambda: node.metric("gateway_cache_joins") > 0)


def test_concurrent_cold_readers_of_a_small_object_make_one_request(
    node: GatewayNode, origin: CountingProxy, origin_s3: Any
) -> None:
    body = _blob(300_000, 77)
    origin_s3.put_object(Bucket=BUCKET, Key="cold/one", Body=body)
    origin.reset()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: _get(node, "pages", "cold/one"), range(8)))
    assert all(r == body for r in results)
    assert origin.count() == 1  # one GET told the version and brought the bytes


def _access_lines(node: GatewayNode, key: str) -> list[dict[str, Any]]:
    lines = (json.loads(line) for line in node.log().splitlines() if line.startswith("{"))
    return [x for x in lines if x.get("msg") == "request" and x.get("key") == key]


def test_the_access_log_tells_the_store_s_share_of_a_miss_for_the_reader_that_asked_it(
    node: GatewayNode, origin: CountingProxy, origin_s3: Any
) -> None:
    # nginx's $upstream_header_time: a line's `store_ms` is the time its own store reads took
    # to their first byte (gateway/timing.py); readers that joined the fill asked nothing.
    body = _blob(200_000, 78)
    origin_s3.put_object(Bucket=BUCKET, Key="timed/one", Body=body)
    origin.reset()
    opened = node.metric("gateway_store_first_byte_seconds_count", 'store="s3"')
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda _: _get(node, "pages", "timed/one"), range(6)))
    assert all(r == body for r in results)
    assert _get(node, "pages", "timed/one") == body  # a hit
    assert origin.count() == 1
    lines = eventually(
        lambda: (found := _access_lines(node, "timed/one")) and len(found) == 7 and found
    )
    asked = [x for x in lines if x["store_ms"] > 0]
    assert len(asked) == 1, lines
    assert 0 < asked[0]["store_ms"] <= asked[0]["ms"]
    assert asked[0]["cache"] == "miss"
    assert node.metric("gateway_store_first_byte_seconds_count", 'store="s3"') == opened + 1


def test_metrics_count_store_bytes_and_cache_use(node: GatewayNode) -> None:
    _get(node, "pages", "small/000")
    _get(node, "pages", "small/000")
    assert node.metric("gateway_store_bytes", 'store="s3"') >= MiB
    eventually(lambda: node.metric("gateway_cache_hits") >= 1)
    eventually(lambda: node.metric("gateway_cache_bytes") >= MiB)  # the janitor published
    assert node.metric("gateway_cache_mount_bytes") >= MiB
    text = httpx.get(node.url + "/metrics").text
    for name in ("gateway_cache_fills_in_flight", "gateway_cache_evictions_total"):
        assert name in text


@pytest.mark.slow
def test_restart_keeps_the_cache_and_a_kill_mid_fill_serves_no_torn_block(
    tmp_path: Path, origin: CountingProxy, origin_s3: Any, origin_bucket: str
) -> None:
    origin_s3.put_object(Bucket=BUCKET, Key="crash.bin", Body=BIG_BODY)
    node = start_gateway(tmp_path / "n", args=("--cache-block-size", "4MiB"))
    try:
        _mount(node, origin, "pages", "metadata_ttl=-1")
        assert _get(node, "pages", "small/001") == _blob(MiB, 101)
        # The version is written behind the read, in the next batch of rows (a kill before
        # that loses only the record, and the restarted node asks the origin once).
        eventually(lambda: recorded(node, "small/001"))
        # Kill -9 while a large read streams through the node.
        with httpx.stream("GET", node.client().generate_presigned_url(
            "get_object", Params={"Bucket": "pages", "Key": "crash.bin"}
        )) as response:  # fmt: skip
            next(response.iter_bytes(64 << 10))
            node.crash()
    finally:
        node.stop()
    again = start_gateway(tmp_path / "n", port=node.port, args=("--cache-block-size", "4MiB"))
    try:
        origin.reset()
        assert _get(again, "pages", "small/001") == _blob(MiB, 101)
        assert origin.count() == 0  # metadata from the database, bytes from the old cache
        assert _get(again, "pages", "crash.bin") == BIG_BODY
    finally:
        again.stop()


def _whole_files(cache: Path) -> list[Path]:
    """Every committed file of the page store, each checked whole (size, trailer, CRC32C)."""
    files = [p for p in (cache / "blocks").rglob("*") if p.is_file()]
    for path in files:
        tail = path.read_bytes()
        length = int.from_bytes(tail[-TRAILER_SIZE - 4 * pieces_of(path) :][8:16], "big")
        blockfile.read(str(path), length, 0, length, True)  # raises Corrupt if torn
    return files


def pieces_of(path: Path) -> int:
    """How many checksum-table entries the file at `path` has (the table ends the file)."""
    size = path.stat().st_size
    for n in range(size // PIECE + 2):
        if file_size(size - TRAILER_SIZE - 4 * n) == size:
            return n
    raise AssertionError(f"{path}: no length fits its size {size}")


@pytest.mark.slow
def test_a_kill_mid_sub_block_fill_leaves_no_torn_sub_block(
    tmp_path: Path, origin: CountingProxy, origin_s3: Any, origin_bucket: str
) -> None:
    origin_s3.put_object(Bucket=BUCKET, Key="torn.bin", Body=BIG_BODY)
    node = start_gateway(tmp_path / "n", args=("--cache-block-size", "4MiB"))
    held = 21 * MiB + 5000
    gate = origin.hold_bodies("torn.bin", from_byte=20 * MiB)
    try:
        _mount(node, origin, "torn", "metadata_ttl=-1")
        done = 2 * MiB + 77
        assert (
            _get(node, "torn", "torn.bin", f"bytes={done}-{done + MiB - 1}")
            == BIG_BODY[done : done + MiB]
        )
        cache = node.data_dir / "cache"
        eventually(lambda: len(_whole_files(cache)) == 9)  # its sub-blocks, committed
        origin.reset()
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(_get, node, "torn", "torn.bin", f"bytes={held}-{held + MiB - 1}")
            # Its sub-blocks claimed, the first bytes sent: kill -9 mid-fill.
            eventually(lambda: origin.bytes_sent("GET") > 0)
            assert any(p.name[0] != "." for p in (cache / "inflight").iterdir())
            node.crash()
            gate.set()
            with pytest.raises(Exception):  # noqa: B017 - the connection dies, however it says so
                pending.result()
    finally:
        gate.set()
        node.stop()
    files = _whole_files(cache)  # nothing torn in blocks/
    assert len(files) == 9  # only the first range's sub-blocks
    again = start_gateway(tmp_path / "n", port=node.port, args=("--cache-block-size", "4MiB"))
    try:
        origin.reset()
        assert (
            _get(again, "torn", "torn.bin", f"bytes={done}-{done + MiB - 1}")
            == BIG_BODY[done : done + MiB]
        )
        assert origin.count("GET") == 0  # kept across the restart
        got = _get(again, "torn", "torn.bin", f"bytes={held}-{held + MiB - 1}")
        assert got == BIG_BODY[held : held + MiB]
        assert origin.count("GET") == 1 and origin.bytes_sent("GET") <= 1.2 * MiB
        # The crash's leftovers were swept at the start; the fill just made commits (after its
        # last byte reached the client) and leaves nothing in flight either.
        eventually(lambda: not [p for p in (cache / "inflight").iterdir() if p.name[0] != "."])
        assert len(_whole_files(cache)) == 9 + 9
    finally:
        again.stop()


@pytest.mark.slow
def test_worker_processes_of_a_node_share_fills_and_blocks(
    tmp_path: Path, origin: CountingProxy, origin_s3: Any, origin_bucket: str
) -> None:
    origin_s3.put_object(Bucket=BUCKET, Key="shared.bin", Body=BIG_BODY)
    node = start_gateway(tmp_path / "w", args=("--cache-block-size", "4MiB", "--workers", "2"))
    try:
        # TTL -1: the version is kept in the database, so every worker knows it without
        # asking the origin, and single flight across the workers is exact.
        _mount(node, origin, "shared", "metadata_ttl=-1")
        for _ in range(4):
            node.client().head_object(Bucket="shared", Key="shared.bin")
        eventually(lambda: recorded(node, "shared.bin"))  # written behind the requests
        origin.reset()

        def read(_: int) -> bytes:
            return _get(node, "shared", "shared.bin")

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(read, range(16)))
        assert all(r == BIG_BODY for r in results)
        assert origin.bytes_sent("GET") == BIG
        assert len(node.workers()) >= 2  # the node's worker processes
    finally:
        node.stop()


def test_quota_pins_and_scan_resistance(
    tmp_path: Path, origin: CountingProxy, origin_s3: Any, origin_bucket: str
) -> None:
    node = start_gateway(
        tmp_path / "q",
        args=("--cache-block-size", "1MiB", "--cache-capacity", "12MiB", "--cache-min-free", "0"),
    )
    try:
        _mount(node, origin, "pinned", "pin=small/000|small/001")
        _mount(node, origin, "quota", "cache_quota=3MiB")
        for key in ("small/000", "small/001"):
            _get(node, "pinned", key)
        hot = [f"small/{i:03d}" for i in range(2, 6)]
        for _ in range(2):  # used twice: the protected working set
            for key in hot:
                _get(node, "pinned", key)
        # Each worker tells the janitor of its uses within about half a second (its journal's
        # flush); a use the janitor has not read yet protects nothing. A sweep begun in that
        # window would evict the set (docs/cache.md): wait until all four are protected.
        eventually(lambda: node.metric("gateway_cache_protected_bytes") >= 4 * MiB)
        for i in range(6, 24):  # a one-off sweep of 18 MiB through a 12 MiB cache
            _get(node, "pinned", f"small/{i:03d}")
        for i in range(6, 14):
            _get(node, "quota", f"small/{i:03d}")
        # The janitor (a pass every half second) has evicted down to the capacity and quota.
        eventually(
            lambda: node.metric("gateway_cache_evictions") > 0
            and node.metric("gateway_cache_bytes") <= 12 * MiB + 12 * 64
            and 0 < node.metric("gateway_cache_mount_bytes", 'mount="2"') <= 3 * MiB + 3 * 64
        )
        # Scan resistance itself: the pinned and the hot blocks are still on disk.
        kept = ["small/000", "small/001", *hot]
        gone = [key for key in kept if not _block_file(node, origin_s3, "pinned", key).exists()]
        assert gone == [], f"evicted by a sweep: {gone}"
        # And they are read from there: nothing asked of the origin but their versions (past
        # the mount's TTL: a HEAD, or a listing of their prefix).
        origin.reset()
        for key in kept:
            assert _get(node, "pinned", key) == _blob(MiB, 100 + int(key[-3:]))
        fetched = [
            (r.path, r.range)
            for r in origin.requests
            if r.method == "GET" and "list-type" not in r.query
        ]
        assert fetched == [], (
            f"blocks on disk were fetched again: {fetched}; the node's log:\n{node.log()[-6000:]}"
        )
        quota_bytes = node.metric("gateway_cache_mount_bytes", 'mount="2"')
        assert 0 < quota_bytes <= 3 * MiB + 3 * 64
        assert node.metric("gateway_cache_bytes") <= 12 * MiB + 12 * 64
        assert node.metric("gateway_cache_evictions") > 0
    finally:
        node.stop()
