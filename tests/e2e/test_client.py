"""The client for training jobs (gateway/client/) against a real node: the gw:// filesystem
over HTTP and with short-circuit reads of the node's block files, a PyTorch DataLoader with
worker processes (fork and spawn), leases asked in batches (more descriptors than one message
carries) and held across epochs, the node's refusals (a uid not allowed, a connection without
a hello or with a bad one), and an overwrite read new once the client's lease has run out."""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import fsspec
import pytest

from gateway.client import GatewayDataset, GatewayFileSystem
from tests.support.gateway import ACCESS_KEY, SECRET_KEY, GatewayNode, run_cli, start_gateway
from tests.support.net import eventually, free_port

MiB = 1 << 20
OBJECTS = 24
MANY = 300  # small objects: more descriptors than one message carries (253)


def _blob(n: int, seed: int) -> bytes:
    block = hashlib.sha256(str(seed).encode()).digest() * 2048  # 64 KiB
    return (block * (n // len(block) + 1))[:n]


@pytest.fixture(scope="module")
def files(module_dir: Path) -> Path:
    files = module_dir / "files"
    (files / "train").mkdir(parents=True)
    for i in range(OBJECTS):
        (files / "train" / f"{i:03d}.bin").write_bytes(_blob(50_000 + i, i))
    (files / "big.bin").write_bytes(_blob(3 * MiB + 12345, -1))
    (files / "many").mkdir()
    for i in range(MANY):
        (files / "many" / f"{i:03d}").write_bytes(b"%d" % i)
    return files


def _node(root: Path, files: Path, *args: str) -> GatewayNode:
    data = root / "data"
    run_cli(data, None, "mount", "add", "data", files.as_uri(), "-o", "metadata_ttl=600")
    return start_gateway(data, args=("--cache-block-size", "1MiB", *args))


@pytest.fixture(scope="module")
def node(module_dir: Path, files: Path) -> Iterator[GatewayNode]:
    node = _node(module_dir / "node", files)
    try:
        yield node
    finally:
        node.stop()


def _options(node: GatewayNode, local: bool = True, **more: Any) -> dict[str, Any]:
    options: dict[str, Any] = {"endpoint_url": node.url, "key": ACCESS_KEY, "secret": SECRET_KEY}
    if local:
        options["local_socket"] = str(node.data_dir / "gateway.sock")
    return {**options, **more}


def _fs(node: GatewayNode, local: bool = True, **more: Any) -> GatewayFileSystem:
    return GatewayFileSystem(skip_instance_cache=True, **_options(node, local, **more))


@pytest.mark.parametrize("local", [True, False], ids=["short-circuit", "http"])
def test_bytes_read_through_the_client_are_the_origins(
    node: GatewayNode, files: Path, local: bool
) -> None:
    fs = _fs(node, local)
    big = (files / "big.bin").read_bytes()
    assert fs.cat_file("data/big.bin") == big
    assert fs.cat_file("gw://data/big.bin", 1_000_000, 2_500_000) == big[1_000_000:2_500_000]
    assert fs.cat_file("data/big.bin", -100) == big[-100:]
    assert fs.cat_file("data/train/003.bin") == _blob(50_003, 3)
    with fs.open("data/big.bin") as f:
        f.seek(3 * MiB)
        assert f.read() == big[3 * MiB :]
    if local:
        assert fs.stats.short_circuit_reads > 0
        assert fs.stats.http_reads == 0  # every block of a one-node mount is the node's
    else:
        assert fs.stats.short_circuit_reads == 0 and fs.stats.http_reads > 0
    fs.close()


def test_fsspec_finds_the_filesystem_by_its_protocol(node: GatewayNode) -> None:
    with fsspec.open("gw://data/train/007.bin", "rb", **_options(node)) as f:
        assert f.read() == _blob(50_007, 7)
    fs = fsspec.filesystem("gw", **_options(node))
    assert sorted(fs.ls("data", detail=False)) == ["data/big.bin", "data/many", "data/train"]
    assert len(fs.find("data/train")) == OBJECTS
    assert fs.info("data/train/000.bin")["size"] == 50_000
    assert fs.info("data/train")["type"] == "directory"
    with pytest.raises(FileNotFoundError):
        fs.cat_file("data/train/missing.bin")


def test_a_second_epoch_asks_the_node_nothing(node: GatewayNode) -> None:
    fs = _fs(node)
    for i in range(OBJECTS):
        fs.cat_file(f"data/train/{i:03d}.bin")
    handed = node.metric("gateway_local_reads", 'outcome="handed"')
    requests = node.metric("gateway_requests")
    asked = fs.stats.lease_requests
    for i in reversed(range(OBJECTS)):
        assert fs.cat_file(f"data/train/{i:03d}.bin") == _blob(50_000 + i, i)
    assert node.metric("gateway_local_reads", 'outcome="handed"') == handed
    # One request of the test's own, waited for on /metrics (a positive signal, whatever the
    # figures' staleness): the node then counts that one and none of the epoch's.
    node.client().head_object(Bucket="data", Key="train/000.bin")
    assert eventually(lambda: node.metric("gateway_requests") >= requests + 1, timeout=5)
    assert node.metric("gateway_requests") == requests + 1
    assert fs.stats.lease_requests == asked  # no round trip on the socket either
    assert fs.stats.leases_reused == OBJECTS
    assert fs.stats.connections == 1  # one hello for the filesystem's life
    fs.close()


def test_a_listed_small_object_is_read_over_http_with_a_plain_get(node: GatewayNode) -> None:
    # A whole object of one block goes to its owner without a Range: the node answers it on
    # its quickest path (the edge's, for an object in its memory tier) once it is cached.
    dataset = GatewayDataset("data/train/", **_options(node, local=False))
    assert [dataset[i] for i in range(OBJECTS)] == [_blob(50_000 + i, i) for i in range(OBJECTS)]
    fast = node.metric("gateway_edge_fast_answers")
    assert [dataset[i] for i in range(OBJECTS)] == [_blob(50_000 + i, i) for i in range(OBJECTS)]
    assert eventually(lambda: node.metric("gateway_edge_fast_answers") >= fast + OBJECTS, 5)
    assert node.metric("gateway_edge_fast_answers") == fast + OBJECTS


def test_a_batch_of_keys_is_leased_in_one_request(node: GatewayNode) -> None:
    fs = _fs(node)
    paths = [f"gw://data/train/{i:03d}.bin" for i in range(OBJECTS)]
    got = fs.cat(paths)
    assert got == {p[5:]: _blob(50_000 + i, i) for i, p in enumerate(paths)}
    assert fs.stats.lease_requests == 1 and fs.stats.leases == OBJECTS
    assert fs.stats.short_circuit_reads == OBJECTS and fs.stats.http_reads == 0
    # A DataLoader's batch: held already, no request; with one new key, one request.
    dataset = GatewayDataset([p[5:] for p in paths], **_options(node))
    dataset._fs = fs
    dataset._pid = os.getpid()
    assert dataset.__getitems__([3, 1, 2]) == [_blob(50_003, 3), _blob(50_001, 1), _blob(50_002, 2)]
    assert fs.stats.lease_requests == 1
    fs.prefetch(["data/big.bin", "data/train/000.bin", "data/train/missing.bin"])
    assert fs.stats.lease_requests == 2 and fs.stats.leases == OBJECTS + 2
    with pytest.raises(FileNotFoundError):
        fs.cat_file("data/train/missing.bin")
    fs.close()


def test_more_descriptors_than_one_message_carries(node: GatewayNode) -> None:
    fs = _fs(node)
    paths = [f"data/many/{i:03d}" for i in range(MANY)]
    got = fs.cat(paths)
    assert got == {p: b"%d" % i for i, p in enumerate(paths)}
    # One request; its answer came as several messages (SCM_MAX_FD is 253).
    assert fs.stats.lease_requests == 1 and fs.stats.leases == MANY
    assert fs.stats.short_circuit_reads == MANY and fs.stats.http_reads == 0
    fs.close()


def _size(data: bytes) -> int:
    return len(data)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_dataloader_with_four_workers_reads_the_dataset(node: GatewayNode, context: str) -> None:
    torch_data = pytest.importorskip("torch.utils.data")
    dataset = GatewayDataset("gw://data/train", transform=_size, **_options(node))
    assert len(dataset) == OBJECTS
    loader = torch_data.DataLoader(
        dataset, batch_size=4, num_workers=4, multiprocessing_context=context
    )
    sizes = sorted(int(n) for batch in loader for n in batch)
    assert sizes == [50_000 + i for i in range(OBJECTS)]
    raw = GatewayDataset([f"data/train/{i:03d}.bin" for i in range(3)], **_options(node))
    assert raw[2] == _blob(50_002, 2)


def test_a_bad_signature_gets_no_descriptor(node: GatewayNode) -> None:
    fs = _fs(node, secret="not-the-secret")
    refused = node.metric("gateway_local_reads", 'outcome="SignatureDoesNotMatch"')
    with pytest.raises(PermissionError):
        fs.cat_file("data/train/001.bin")
    assert node.metric("gateway_local_reads", 'outcome="SignatureDoesNotMatch"') == refused + 1
    assert fs.stats.short_circuit_reads == 0
    fs.close()


def test_a_uid_not_allowed_gets_no_descriptor_and_reads_over_http(
    tmp_path: Path, files: Path
) -> None:
    node = _node(tmp_path, files, "--local-socket-uids", "54321")
    try:
        fs = _fs(node)
        assert fs.cat_file("data/train/002.bin") == _blob(50_002, 2)
        assert fs.stats.short_circuit_reads == 0
        assert fs.stats.fallbacks == 1 and fs.stats.http_reads == 1
        refused = node.metric("gateway_local_reads", 'outcome="uid_refused"')
        assert refused >= 1
        # Told once: the next reads go over HTTP without asking the socket again.
        for i in range(3, 6):
            assert fs.cat_file(f"data/train/{i:03d}.bin") == _blob(50_000 + i, i)
        assert node.metric("gateway_local_reads", 'outcome="uid_refused"') == refused
        assert fs.stats.short_circuit_reads == 0 and fs.stats.http_reads == 4
        fs.close()
    finally:
        node.stop()


def test_an_overwrite_is_read_new_once_the_lease_runs_out(tmp_path: Path) -> None:
    files = tmp_path / "files"
    files.mkdir()
    data = tmp_path / "data"
    run_cli(data, None, "mount", "add", "rwb", files.as_uri(), "-o", "metadata_ttl=1")
    node = start_gateway(data)
    try:
        fs = _fs(node)
        fs.pipe_file("rwb/obj", b"old" * 1000)
        assert fs.cat_file("rwb/obj") == b"old" * 1000
        fs.pipe_file("rwb/obj", b"new" * 2000)
        eventually(lambda: fs.cat_file("rwb/obj") == b"new" * 2000, timeout=10)
        assert fs.stats.short_circuit_reads >= 2  # both versions from their block files
        fs.close()
    finally:
        node.stop()


# -- the wire, as a client that does not follow the protocol sees it ---------------------------


def _connect(node: GatewayNode) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(30)
    conn.connect(str(node.data_dir / "gateway.sock"))
    return conn


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    body = json.dumps(message).encode()
    conn.sendall(len(body).to_bytes(4, "big") + body)


def _receive(conn: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """One message and the descriptors that came with it; None when the node hung up."""
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 253)
    if not data:
        return None, fds
    size = int.from_bytes(data[:4], "big")
    rest = data[4:]
    while len(rest) < size:
        rest += conn.recv(size - len(rest))
    return json.loads(rest), fds


def test_a_connection_without_a_valid_hello_gets_nothing(node: GatewayNode) -> None:
    request = {"bucket": "data", "keys": ["train/000.bin"], "first": 0, "count": 64}
    # No hello: the request is refused and the connection closed.
    with _connect(node) as conn:
        greeting, fds = _receive(conn)
        assert greeting is not None and greeting["nonce"] and fds == []
        _send(conn, request)
        answer, fds = _receive(conn)
        assert answer is not None and answer["error"] == "InvalidRequest" and fds == []
        assert answer["scope"] == "connection"
        assert _receive(conn) == (None, [])
    signer = _fs(node)
    # A hello signed for another connection's nonce (a replay) is refused.
    with _connect(node) as conn:
        greeting, _ = _receive(conn)
        target, host = signer._sign_hello("0123456789abcdef0123456789abcdef")
        _send(conn, {"hello": target, "host": host})
        answer, fds = _receive(conn)
        assert answer is not None and answer["error"] == "AccessDenied" and fds == []
        assert _receive(conn) == (None, [])
    # A hello signed with a wrong secret is refused.
    wrong = _fs(node, secret="not-the-secret")
    refused = node.metric("gateway_local_reads", 'outcome="SignatureDoesNotMatch"')
    with _connect(node) as conn:
        greeting, _ = _receive(conn)
        assert greeting is not None
        target, host = wrong._sign_hello(greeting["nonce"])
        _send(conn, {"hello": target, "host": host})
        answer, fds = _receive(conn)
        assert answer is not None and answer["error"] == "SignatureDoesNotMatch" and fds == []
        assert _receive(conn) == (None, [])
    assert node.metric("gateway_local_reads", 'outcome="SignatureDoesNotMatch"') == refused + 1
    # The right hello, then requests without signatures.
    with _connect(node) as conn:
        greeting, _ = _receive(conn)
        assert greeting is not None
        target, host = signer._sign_hello(greeting["nonce"])
        _send(conn, {"hello": target, "host": host})
        answer, _ = _receive(conn)
        assert answer == {"key": ACCESS_KEY}
        _send(conn, {**request, "keys": ["train/000.bin", "train/missing.bin"]})
        answer, fds = _receive(conn)
        assert answer is not None and not answer["more"]
        found, missing = answer["objects"]
        assert found["size"] == 50_000 and len(found["blocks"]) == len(fds) == 1
        assert missing["error"] == "NoSuchKey"
        assert os.pread(fds[0], 5, 0) == _blob(50_000, 0)[:5]
        for fd in fds:
            os.close(fd)
        _send(conn, {**request, "bucket": "nothing-here"})
        answer, fds = _receive(conn)
        assert answer is not None and answer["error"] == "NoSuchBucket" and fds == []
    signer.close()
    wrong.close()


def test_a_lease_is_the_version_check_an_overwrite_is_read_after_it(tmp_path: Path) -> None:
    files = tmp_path / "files"
    files.mkdir()
    data = tmp_path / "data"
    run_cli(data, None, "mount", "add", "rwb", files.as_uri(), "-o", "metadata_ttl=30")
    node = start_gateway(data)
    try:
        fs = _fs(node)
        now = [0.0]
        assert fs._local is not None
        fs._local._clock = lambda: now[0]  # the client's clock: its leases' time
        fs.pipe_file("rwb/obj", b"old" * 1000)
        assert fs.cat_file("rwb/obj") == b"old" * 1000
        asked = fs.stats.lease_requests
        fs.pipe_file("rwb/obj", b"new" * 2000)
        # Within the lease: the version the client holds, no question to the node.
        assert fs.cat_file("rwb/obj") == b"old" * 1000
        assert fs.stats.lease_requests == asked
        now[0] += 31  # the mount's TTL later: the lease is asked again, the new version read
        assert fs.cat_file("rwb/obj") == b"new" * 2000
        # Its renewal is refused (another version), then the new version is leased.
        assert fs.stats.lease_requests == asked + 2 and fs.stats.leases_renewed == 0
        assert fs.stats.short_circuit_reads == 3 and fs.stats.http_reads == 0
        fs.close()
    finally:
        node.stop()


@contextmanager
def _read_an_epoch(
    tmp_path: Path, bucket: str, ttl: int
) -> Iterator[tuple[GatewayNode, Any, list[float]]]:
    """A node with the files of an epoch mounted as `bucket` at `ttl`, and a client that has
    read each once, an object at a time as a DataLoader reads; the client's clock (its
    leases' time) is the list's one number."""
    files = tmp_path / "files"
    (files / "train").mkdir(parents=True)
    for i in range(OBJECTS):
        (files / "train" / f"{i:03d}.bin").write_bytes(_blob(50_000 + i, i))
    data = tmp_path / "data"
    run_cli(data, None, "mount", "add", bucket, files.as_uri(), "-o", f"metadata_ttl={ttl}")
    node = start_gateway(data)
    try:
        fs = _fs(node)
        now = [0.0]
        assert fs._local is not None
        fs._local._clock = lambda: now[0]
        for i in range(OBJECTS):
            assert fs.cat_file(f"{bucket}/train/{i:03d}.bin") == _blob(50_000 + i, i)
        yield node, fs, now
        fs.close()
    finally:
        node.stop()


def test_leases_past_the_ttl_are_renewed_in_one_request_for_the_epoch(tmp_path: Path) -> None:
    with _read_an_epoch(tmp_path, "rwb", 600) as (node, fs, now):
        asked, leased = fs.stats.lease_requests, fs.stats.leases
        handed = node.metric("gateway_local_reads", 'outcome="handed"')
        now[0] += 601  # the next epoch, past the TTL: every lease has run out
        for i in range(OBJECTS):
            assert fs.cat_file(f"rwb/train/{i:03d}.bin") == _blob(50_000 + i, i)
        # One request renewed them all (the versions only: no descriptor handed again).
        assert fs.stats.lease_requests == asked + 1
        assert fs.stats.leases_renewed == OBJECTS and fs.stats.leases == leased
        assert node.metric("gateway_local_reads", 'outcome="handed"') == handed
        # A version that changed is not renewed: it is leased again and read new.
        fs.pipe_file("rwb/train/000.bin", b"new" * 2000)
        now[0] += 601
        assert fs.cat_file("rwb/train/000.bin") == b"new" * 2000
        assert fs.stats.leases == leased + 1
        assert fs.stats.short_circuit_reads == 2 * OBJECTS + 1 and fs.stats.http_reads == 0


def test_leases_of_a_short_ttl_are_renewed_together_with_the_one_read(tmp_path: Path) -> None:
    """A TTL shorter than an epoch: the first read past it renews the epoch's other leases in
    the same request (the node answers them from listings of their prefix, not a store
    request each: tests/e2e/test_freshness.py), so the reads after it need none."""
    with _read_an_epoch(tmp_path, "short", 30) as (_, fs, now):
        asked = fs.stats.lease_requests
        now[0] += 31  # every lease has run out
        assert fs.cat_file("short/train/005.bin") == _blob(50_005, 5)
        assert fs.stats.lease_requests == asked + 1 and fs.stats.leases_renewed == OBJECTS
        assert fs.cat_file("short/train/006.bin") == _blob(50_006, 6)
        assert fs.stats.lease_requests == asked + 1


def test_several_endpoints_a_job_starts_with_the_first_node_down(node: GatewayNode) -> None:
    down = f"http://127.0.0.1:{free_port()}"  # no node listens there
    fs = _fs(node, endpoint_url=f"{down},{node.url}")
    assert fs.cat_file("data/train/001.bin") == _blob(50_001, 1)
    assert fs.endpoint_url == node.url and fs.stats.short_circuit_reads == 1
    assert [p["name"] for p in fs.ls("data/train")][:1] == ["data/train/000.bin"]
    fs.close()
    listed = _fs(node, local=False, endpoint_url=[down, node.url])
    assert listed.cat_file("data/train/002.bin") == _blob(50_002, 2)
    listed.close()
