"""End to end, a node at its default two workers: a block that one worker filled is sent from
its file by the other without being read and checked again, within `zero_copy_recheck`
seconds of its fill (gateway/cache/checks.py: the workers share their checks). Found with
`loadtest.hitprofile --workers 2` over 6,000 distinct objects: 13-15 % of the hits read their
block on the event loop before sending it, each a first send by the worker that had not
filled it (0.1 % now). (`loadtest epochs` runs one worker, as many as nginx: the rechecks its
warm epoch counts are blocks filled more than the window before.)"""

from __future__ import annotations

import http.client
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.support.gateway import GatewayNode, start_gateway
from tests.support.net import eventually

OBJECTS = 12
SIZE = 100 << 10  # one block; sent from its file at a worker's first disk hit (64 KiB on)
READERS = 6  # connections held at once: the node's workers take them in turn


@pytest.fixture(scope="module")
def node(module_dir: Path) -> Iterator[GatewayNode]:
    files = module_dir / "files"
    files.mkdir()
    for i in range(OBJECTS):
        (files / f"o{i}.bin").write_bytes(os.urandom(SIZE))
    node = start_gateway(
        module_dir / "node",
        # The node's own server (the one that sends files), its default workers; unsealed
        # blocks: sealed ones are never read before a send (test_sealed_blocks.py).
        args=("--server", "gateway", "--no-seal-blocks"),
    )
    try:
        node.cli("mount", "add", "zwork", files.as_uri(), "-o", "metadata_ttl=-1")
        eventually(lambda: "zwork" in node.buckets())
        yield node
    finally:
        node.stop()  # however the mount or the test ends


def _gets(node: GatewayNode) -> float:
    return node.metric("gateway_requests", 'op="GetObject"')


def test_a_block_one_worker_filled_is_sent_unread_by_the_other(node: GatewayNode) -> None:
    s3 = node.client()
    files = node.data_dir.parent / "files"
    for i in range(OBJECTS):  # filled, over one connection: by one worker
        assert (
            s3.get_object(Bucket="zwork", Key=f"o{i}.bin")["Body"].read()
            == (files / f"o{i}.bin").read_bytes()
        )
    urls = [
        s3.generate_presigned_url("get_object", Params={"Bucket": "zwork", "Key": f"o{i}.bin"})
        for i in range(OBJECTS)
    ]
    eventually(lambda: _gets(node) >= OBJECTS)
    gets = _gets(node)
    rechecks = node.metric("gateway_cache_rechecks")
    zero_copy = node.metric("gateway_cache_zero_copy")
    where = urlsplit(node.url)
    # Connections open at once split between the workers (gateway/server/accept.py): every
    # object is read by each worker, so the worker that did not fill it sends it too.
    readers = [http.client.HTTPConnection(where.hostname, where.port) for _ in range(READERS)]
    try:
        for conn in readers:
            conn.connect()
        for i, url in enumerate(urls):
            target = url.removeprefix(node.url)
            for conn in readers:
                conn.request("GET", target)
                answer = conn.getresponse()
                assert answer.status == 200
                assert answer.read() == (files / f"o{i}.bin").read_bytes()
    finally:
        for conn in readers:
            conn.close()
    eventually(lambda: _gets(node) >= gets + OBJECTS * READERS)  # the workers' figures out
    # Each worker's first send of an object it did not fill went from its file ...
    assert node.metric("gateway_cache_zero_copy") - zero_copy >= OBJECTS
    # ... unread: the filler's check was the node's (each was a recheck before).
    assert node.metric("gateway_cache_rechecks") - rechecks == 0
