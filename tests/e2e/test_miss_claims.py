"""End to end: a miss claims its block's fill on the event loop when a spare file is at hand
(blockfile.claim(at_once=True), fills.py), so no thread hop holds its bytes back: a hop there
cost a cold GET ~5 ms of latency behind the other threads' commits (docs/performance.md).
Counted by gateway_cache_thread_claims, at the node's default worker count, through boto3."""

from __future__ import annotations

import os
import random
from pathlib import Path

from tests.support.gateway import start_gateway
from tests.support.net import eventually

OBJECTS = 24  # fewer than the spares a janitor keeps at rest (128): none made meanwhile
AT_REST = 128


def test_cold_misses_claim_their_fills_at_once_once_spares_are_listed(tmp_path: Path) -> None:
    files = tmp_path / "files"
    files.mkdir()
    data = {f"o{i:03d}.bin": random.Random(i).randbytes(5000 + i) for i in range(OBJECTS)}
    for key, body in data.items():
        (files / key).write_bytes(body)
    node = start_gateway(tmp_path / "node")
    try:
        node.wait_workers()
        node.cli("mount", "add", "claims", files.as_uri())
        eventually(lambda: "claims" in node.buckets())
        spares = node.data_dir / "cache" / "spare"
        # (names of a dot are not spares: those being made, or recycled)
        eventually(
            lambda: spares.is_dir() and sum(n[0] != "." for n in os.listdir(spares)) >= AT_REST
        )
        s3 = node.client()
        for key, body in data.items():
            got = s3.get_object(Bucket="claims", Key=key)
            assert got["Body"].read() == body
            assert got["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "miss"
        eventually(lambda: node.metric("gateway_cache_fills") == OBJECTS)
        on_threads = node.metric("gateway_cache_thread_claims")
        # A worker's first claim lists spare/ on a thread (the loop never lists a folder);
        # every later one takes a spare it listed, at once.
        assert 1 <= on_threads <= len(node.workers()), on_threads
        for key, body in data.items():  # kept: hits now
            got = s3.get_object(Bucket="claims", Key=key)
            assert got["Body"].read() == body
            assert got["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit"
    finally:
        node.stop()
