"""Cold leases: the client asks the node on its host for a batch of objects whose bytes the
node has not cached, over an origin whose GETs are held at a gate until several are in
flight. The node fetches the batch's misses together (one after another, a batch cost a
store round trip per object in turn: 21 objects/s over a 20 ms WAN); a key it has never seen
costs one store request (its version and bytes together, as a cold GET over HTTP), and
concurrent leases of one key still make one store request."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from gateway.client import GatewayFileSystem
from tests.support.gateway import ACCESS_KEY, SECRET_KEY, GatewayNode, run_cli, start_gateway
from tests.support.origin import CountingProxy, MotoServer
from tests.support.origin import _Handler as _ProxyHandler

BUCKET = "origin-cold"
OBJECTS = 12
AT_ONCE = 6  # store GETs the gate waits to see in flight together
HOLD = 1.0  # seconds a GET is held at most: a node fetching one at a time waits it out each


def _blob(n: int, seed: int) -> bytes:
    return (hashlib.sha256(str(seed).encode()).digest() * (n // 32 + 1))[:n]


class GatedProxy(CountingProxy):
    """A CountingProxy that holds each GET of an object under `prefix` until `at_once` of them
    have been in flight together (or `hold` seconds passed), and records the most that ever
    were (`peak`): concurrency seen on the wire, not timed."""

    def __init__(self, upstream: str, prefix: str, at_once: int, hold: float) -> None:
        super().__init__(upstream)
        self.prefix, self.at_once, self.hold = prefix, at_once, hold
        self.peak = 0
        self._in_flight = 0
        self._gate = threading.Condition()
        self._server.RequestHandlerClass = _GatedHandler  # read per request by socketserver

    def enter(self) -> None:
        with self._gate:
            self._in_flight += 1
            self.peak = max(self.peak, self._in_flight)
            self._gate.notify_all()
            self._gate.wait_for(lambda: self.peak >= self.at_once, timeout=self.hold)

    def leave(self) -> None:
        with self._gate:
            self._in_flight -= 1

    def reset(self) -> None:
        super().reset()
        with self._gate:
            self.peak = 0


class _GatedHandler(_ProxyHandler):
    server: Any

    def do_GET(self) -> None:
        proxy: GatedProxy = self.server.owner
        if not self.path.partition("?")[0].startswith(proxy.prefix):
            self.do_any()
            return
        proxy.enter()
        try:
            self.do_any()
        finally:
            proxy.leave()


@pytest.fixture(scope="module")
def gated(moto_server: MotoServer, origin_s3: Any) -> Iterator[GatedProxy]:
    origin_s3.create_bucket(Bucket=BUCKET)
    for folder in ("train", "headed"):
        for i in range(OBJECTS):
            body = _blob(3000 + i, i)
            origin_s3.put_object(Bucket=BUCKET, Key=f"{folder}/{i:03d}", Body=body)
    proxy = GatedProxy(moto_server.url, f"/{BUCKET}/", AT_ONCE, HOLD)
    yield proxy
    proxy.stop()


@pytest.fixture(scope="module")
def node(module_dir: Path, gated: GatedProxy) -> Iterator[GatewayNode]:
    data = module_dir / "data"
    run_cli(
        data, None, "mount", "add", "cold", f"s3://{BUCKET}", "-o",
        f"endpoint_url={gated.url}", "-o", "access_key=origin-ak", "-o",
        "secret_key=origin-sk", "-o", "metadata_ttl=-1",
    )  # fmt: skip
    node = start_gateway(data)
    try:
        yield node
    finally:
        node.stop()


def _fs(node: GatewayNode) -> GatewayFileSystem:
    return GatewayFileSystem(
        skip_instance_cache=True, endpoint_url=node.url, key=ACCESS_KEY, secret=SECRET_KEY,
        local_socket=str(node.data_dir / "gateway.sock"),
    )  # fmt: skip


def _read_all(fs: GatewayFileSystem, paths: list[str]) -> None:
    got = [fs.cat_file(p) for p in paths]
    assert got == [_blob(3000 + i, i) for i in range(OBJECTS)]
    assert fs.stats.short_circuit_reads == OBJECTS and fs.stats.http_reads == 0
    assert fs.stats.lease_requests == 1
    fs.close()


def test_a_batch_lease_of_keys_never_read_fetches_them_together(
    node: GatewayNode, gated: GatedProxy
) -> None:
    paths = [f"cold/train/{i:03d}" for i in range(OBJECTS)]
    clients = [_fs(node), _fs(node)]
    gated.reset()
    # Two processes' batches of the same keys at once (DataLoader workers leasing ahead in
    # the dataset's order): one store request per object for both.
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda fs: fs.prefetch(paths), clients))
    assert gated.peak >= AT_ONCE  # the batch's misses were in flight together
    assert gated.count("GET", f"/{BUCKET}/train/") == OBJECTS
    assert gated.count("HEAD", f"/{BUCKET}/train/") == 0  # version and bytes in one request
    for fs in clients:
        _read_all(fs, paths)
    assert gated.count(None, f"/{BUCKET}/train/") == OBJECTS


def test_a_batch_lease_of_known_keys_not_cached_fetches_them_together(
    node: GatewayNode, gated: GatedProxy
) -> None:
    paths = [f"cold/headed/{i:03d}" for i in range(OBJECTS)]
    fs = _fs(node)
    for path in paths:  # the node learns the versions (HEAD), and caches no byte
        assert fs.info(path)["size"] == 3000 + int(path[-3:])
    gated.reset()
    fs.prefetch(paths)
    assert gated.peak >= AT_ONCE
    assert gated.count(None, f"/{BUCKET}/headed/") == OBJECTS  # a GET each, no HEAD again
    _read_all(fs, paths)
