"""The cache's state where an operator looks (issue 43): one node over a real store, some
objects read by a client, others loaded by `gateway load` (some pinned); `gateway status`,
/metrics and the console then show the same bytes cached and pinned, capacity, the clients'
hits and misses, and the preload's fills counted apart from the misses, for the node and its
mount. A reload of the unchanged prefix says it fetched nothing."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.gateway import ACCESS_KEY, SECRET_KEY, GatewayNode, start_gateway
from tests.support.net import eventually
from tests.support.origin import CountingProxy

ORIGIN = "origin-cache-status"
KiB, MiB = 1 << 10, 1 << 20
CAPACITY = 64 * MiB
READ = [f"read/{i}" for i in range(5)]  # read twice by a client: 5 misses, then 5 hits
LOADED = [f"pre/{i}" for i in range(8)]  # preloaded: 8 fills, no miss
PINNED = [f"pin/{i}" for i in range(2)]  # preloaded with --pin: 2 fills more, pinned
SIZE = 16 * KiB  # one block each


def blob(seed: str) -> bytes:
    return (hashlib.sha256(seed.encode()).digest() * (SIZE // 32 + 1))[:SIZE]


@pytest.fixture(scope="module")
def node(module_dir: Path, origin: CountingProxy, origin_s3: Any) -> Iterator[GatewayNode]:
    origin_s3.create_bucket(Bucket=ORIGIN)
    for key in READ + LOADED + PINNED:
        origin_s3.put_object(Bucket=ORIGIN, Key=key, Body=blob(key))
    args = ("--cache-block-size", "1MiB", "--cache-capacity", "64MiB", "--cache-memory", "0")
    n = start_gateway(module_dir / "n", args=args)
    try:
        n.cli(
            "mount", "add", "data", f"s3://{ORIGIN}", "-o", f"endpoint_url={origin.url}",
            "-o", "access_key=origin-ak", "-o", "secret_key=origin-sk",
            "-o", "metadata_ttl=600",
        )  # fmt: skip
        eventually(lambda: "data" in n.buckets())
        yield n
    finally:
        n.stop()


@pytest.fixture(scope="module")
def used(node: GatewayNode) -> GatewayNode:
    """The node after a client read READ twice and `gateway load` loaded LOADED and PINNED."""
    s3 = node.client()
    for _ in range(2):
        for key in READ:
            assert s3.get_object(Bucket="data", Key=key)["Body"].read() == blob(key)
    loaded = node.cli("load", "data/pre/")
    assert "done: loaded 8 objects" in loaded.stdout + loaded.stderr
    pinned = node.cli("load", "data/pin/", "--pin")
    assert "done: loaded 2 objects" in pinned.stdout + pinned.stderr
    return node


def status(node: GatewayNode) -> dict[str, Any]:
    rows = json.loads(node.cli("status", "--json").stdout)
    assert len(rows) == 1, rows
    return dict(rows[0])


def settled(node: GatewayNode) -> dict[str, Any]:
    """The status once the janitor's pass has counted every block and every pin."""
    every = len(READ + LOADED + PINNED) * SIZE

    def counted() -> dict[str, Any] | None:
        row = status(node)
        return row if row["cache_bytes"] >= every and row["pinned_bytes"] >= 2 * SIZE else None

    return eventually(counted, timeout=30)


def test_status_shows_the_nodes_and_the_mounts_cache_with_preload_fills_apart(
    used: GatewayNode,
) -> None:
    row = settled(used)
    assert row["state"] == "alone" and row["live"]
    assert row["capacity_bytes"] == CAPACITY
    assert (row["hits"], row["misses"], row["preload_fills"]) == (5, 5, 10)
    assert row["hit_ratio"] == 0.5  # the clients': the preload's fills are no misses
    # Block files hold their checksums besides the data: a few bytes more than the data.
    assert 2 * SIZE <= row["pinned_bytes"] < 3 * SIZE
    (mount,) = row["mounts"]
    assert mount["mount"] == "data"
    assert (mount["hits"], mount["misses"], mount["preload_fills"]) == (5, 5, 10)
    assert mount["cache_bytes"] == row["cache_bytes"]
    assert mount["pinned_bytes"] == row["pinned_bytes"]
    assert mount["capacity_bytes"] == CAPACITY  # no quota: the node's

    table = used.cli("status").stdout
    assert re.search(r"\bPINNED\b.*\bCAPACITY\b.*\bHITS\b.*\bMISSES\b.*\bPRELOADED\b", table)
    assert re.search(r"this node .* 64\.0 MiB\s+5\s+5\s+10\s+50\.0%", table), table
    assert re.search(r"this node\s+data\s+.* 64\.0 MiB\s+5\s+5\s+10\s+50\.0%", table), table


def test_metrics_count_the_preloads_fills_apart_from_the_misses(used: GatewayNode) -> None:
    row = settled(used)
    assert used.metric("gateway_cache_hits") == 5
    assert used.metric("gateway_cache_misses") == 5
    assert used.metric("gateway_cache_preload_fills") == 10
    assert used.metric("gateway_cache_capacity_bytes") == CAPACITY
    assert used.metric("gateway_cache_pinned_bytes") == row["pinned_bytes"]
    assert used.metric("gateway_cache_mount_hits") == 5
    assert used.metric("gateway_cache_mount_misses") == 5
    assert used.metric("gateway_cache_mount_preload_fills") == 10
    assert used.metric("gateway_cache_mount_pinned_bytes") == row["pinned_bytes"]
    assert used.metric("gateway_cache_mount_capacity_bytes") == CAPACITY


def test_the_console_shows_the_same_figures(used: GatewayNode) -> None:
    row = settled(used)
    with httpx.Client(base_url=used.url + "/_gateway/console", timeout=30) as console:
        token = re.search(r'name="csrf" value="([^"]+)"', console.get("/login").text)
        assert token is not None
        form = {"csrf": token.group(1), "access_key": ACCESS_KEY, "secret_key": SECRET_KEY}
        assert console.post("/login", data=form).status_code == 303
        for page in ("/fleet", "/mounts"):
            html = console.get(page).text
            cells = dict(
                re.findall(r'<td class="num (hits|misses|preload-fills)">(\d+)</td>', html)
            )
            assert cells == {"hits": "5", "misses": "5", "preload-fills": "10"}, (page, html)
            pinned = re.search(r'<td class="num pinned">([^<]+)</td>', html)
            assert pinned is not None and pinned.group(1) == f"{row['pinned_bytes'] / KiB:.1f} KiB"


def test_a_reload_of_an_unchanged_cached_prefix_says_it_fetched_nothing(
    used: GatewayNode, origin: CountingProxy
) -> None:
    before = status(used)["preload_fills"]
    out = used.cli("load", "data/pre/", "--refresh")
    said = out.stdout + out.stderr
    assert "nothing fetched, all 8 already cached" in said, said
    assert status(used)["preload_fills"] == before
