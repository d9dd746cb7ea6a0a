"""Plain cache hits answered at the HTTP edge (gateway/s3/fast.py), tried from outside with
boto3 and raw sockets against a real node: the same answer as the full path (whole objects,
satisfied ranges and conditions that hold), in order among pipelined requests, never for a
request that asks for more (a body, a header the edge does not judge) or for a condition that
fails or a range that cannot be served, never past a bad signature, an expired URL or a
deleted key, and the new bytes right after an overwrite."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.support.gateway import ACCESS_KEY, SECRET_KEY, GatewayNode, run_cli, start_gateway
from tests.support.net import eventually

BODY = bytes(range(256)) * 16  # 4 KiB
BIG = bytes(range(251)) * 4200  # ~1 MiB: above the memory tier's objects, one block on disk


@pytest.fixture(scope="module")
def node(module_dir: Path) -> Iterator[GatewayNode]:
    files = module_dir / "files"
    files.mkdir()
    (files / "small.bin").write_bytes(BODY)
    (files / "other.txt").write_bytes(b"other bytes")
    (files / "big.bin").write_bytes(BIG)
    data = module_dir / "data"
    # Versions trusted for an hour: a hit whose version outlived the default TTL (5 s) between
    # two requests of a test on a slow machine would be revalidated on the full path.
    run_cli(data, None, "mount", "add", "fast", files.as_uri(), "-o", "metadata_ttl=3600")
    # One worker: the fast path is each process's own (its memory tier, the blocks it has
    # read), and these tests count its answers exactly; a node of several workers is
    # tests/e2e/test_workers.py's.
    # Unsealed: a test here damages a block through the file system, which a sealed file
    # (fs-verity, where tmp has it) refuses.
    node = start_gateway(data, args=("--workers", "1", "--no-seal-blocks"))
    try:
        yield node
    finally:
        node.stop()


def _fast(node: GatewayNode) -> float:
    return node.metric("gateway_edge_fast_answers")


def _url(node: GatewayNode, *keys: str, expires: int = 3600, op: str = "get_object") -> str:
    s3 = node.client(*keys)
    url: str = s3.generate_presigned_url(
        op, Params={"Bucket": "fast", "Key": "small.bin"}, ExpiresIn=expires
    )
    return url


def _request(node: GatewayNode, url: str, method: bytes = b"GET", extra: bytes = b"") -> bytes:
    """The request a client sends for a presigned URL (its Host is part of what is signed)."""
    target = ("/" + url.split("/", 3)[3]).encode()
    host = b"Host: 127.0.0.1:%d\r\n" % node.port
    return method + b" " + target + b" HTTP/1.1\r\n" + host + extra + b"\r\n"


def _responses(
    port: int, payload: bytes, count: int, heads: tuple[int, ...] = ()
) -> list[tuple[int, dict[str, str], bytes]]:
    """Send `payload` at once and read `count` responses from the connection, in order; those
    numbered in `heads` answer a HEAD (no body)."""
    out = []
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(payload)
        stream = sock.makefile("rb")
        for i in range(count):
            status = int(stream.readline().split(b" ", 2)[1])
            headers: dict[str, str] = {}
            while (line := stream.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            length = 0 if i in heads else int(headers.get("content-length", "0"))
            out.append((status, headers, stream.read(length)))
    return out


def test_a_plain_hit_is_answered_at_the_edge_as_the_full_path_answers_it(
    node: GatewayNode,
) -> None:
    s3 = node.client()
    assert s3.get_object(Bucket="fast", Key="small.bin")["Body"].read() == BODY  # a miss
    before = _fast(node)
    got = s3.get_object(Bucket="fast", Key="small.bin")
    assert got["Body"].read() == BODY
    assert _fast(node) == before + 1
    # The same object through the full path (x-amz-request-payer is a header the edge does
    # not judge: it sends the request there).
    full = s3.get_object(Bucket="fast", Key="small.bin", RequestPayer="requester")
    assert full["Body"].read() == BODY
    assert _fast(node) == before + 1
    varying = {"date", "x-amz-request-id"}
    edge = {k: v for k, v in got["ResponseMetadata"]["HTTPHeaders"].items() if k not in varying}
    path = {k: v for k, v in full["ResponseMetadata"]["HTTPHeaders"].items() if k not in varying}
    assert edge == path
    assert edge["x-cache"] == "hit"
    head = s3.head_object(Bucket="fast", Key="small.bin")
    assert head["ContentLength"] == len(BODY)
    assert _fast(node) == before + 2
    requests = node.metric("gateway_requests", 'op="GetObject",status="200"')
    assert requests >= 3  # the edge's answers are counted as any other


def test_ranges_and_conditions_that_hold_are_answered_at_the_edge_as_the_full_path_does(
    node: GatewayNode,
) -> None:
    s3 = node.client()
    etag = s3.get_object(Bucket="fast", Key="small.bin")["ETag"]
    s3.get_object(Bucket="fast", Key="small.bin")["Body"].read()
    varying = {"date", "x-amz-request-id"}

    def headers(answer: dict[str, Any]) -> dict[str, str]:
        fields = answer["ResponseMetadata"]["HTTPHeaders"]
        return {k: v for k, v in fields.items() if k not in varying}

    asks: list[dict[str, str]] = [
        {"Range": "bytes=10-19"},
        {"Range": "bytes=-7"},
        {"Range": "bytes=4000-"},
        {"IfMatch": etag},
        {"IfNoneMatch": '"0123"'},
        {"IfModifiedSince": "Sat, 01 Jan 2000 00:00:00 GMT", "Range": "bytes=0-0"},
        {"IfUnmodifiedSince": "Fri, 01 Jan 2100 00:00:00 GMT"},
    ]
    for ask in asks:
        before = _fast(node)
        edge = s3.get_object(Bucket="fast", Key="small.bin", **ask)  # type: ignore[arg-type]
        body = edge["Body"].read()
        assert _fast(node) == before + 1, ask
        full = s3.get_object(
            Bucket="fast",
            Key="small.bin",
            RequestPayer="requester",
            **ask,  # type: ignore[arg-type]
        )
        assert body == full["Body"].read(), ask
        assert headers(edge) == headers(full), ask
        assert (
            edge["ResponseMetadata"]["HTTPStatusCode"] == full["ResponseMetadata"]["HTTPStatusCode"]
        )
    assert body == BODY
    head = s3.head_object(Bucket="fast", Key="small.bin", Range="bytes=100-199")
    assert head["ContentLength"] == 100 and head["ContentRange"] == f"bytes 100-199/{len(BODY)}"
    # What the edge does not answer: a condition that fails, a range past the end.
    before = _fast(node)
    for ask, status in [
        ({"IfNoneMatch": etag}, 304),
        ({"IfMatch": '"0123"'}, 412),
        ({"IfModifiedSince": "Fri, 01 Jan 2100 00:00:00 GMT"}, 304),
        ({"Range": f"bytes={len(BODY)}-"}, 416),
    ]:
        with pytest.raises(ClientError) as refused:
            s3.get_object(Bucket="fast", Key="small.bin", **ask)  # type: ignore[arg-type]
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == status, ask
    assert _fast(node) == before


def test_pipelined_requests_are_answered_in_order_fast_or_not(node: GatewayNode) -> None:
    url = _url(node)
    node.client().get_object(Bucket="fast", Key="small.bin")["Body"].read()
    plain = _request(node, url)
    ranged = _request(node, url, extra=b"Range: bytes=10-19\r\n")
    head = _request(node, _url(node, op="head_object"), b"HEAD")
    # A GET with a body of its own: never answered at the edge, and its body is not taken
    # for a request (the node closes the connection after it, as S3 does).
    smuggle = b"GET /fast/other.txt HTTP/1.1\r\nHost: x\r\n\r\n"
    with_body = _request(node, url, extra=b"Content-Length: %d\r\n" % len(smuggle)) + smuggle
    before = _fast(node)
    payload = plain + ranged + plain + head + plain + with_body
    answers = _responses(node.port, payload, 6, heads=(3,))
    assert [a[0] for a in answers] == [200, 206, 200, 200, 200, 200]
    assert answers[0][2] == BODY and answers[2][2] == BODY and answers[4][2] == BODY
    assert answers[1][2] == BODY[10:20]
    assert answers[3][2] == b"" and answers[3][1]["content-length"] == str(len(BODY))
    assert answers[5][2] == BODY
    assert _fast(node) - before >= 1  # the first at the edge; behind a slow one, queued


def test_conflicting_lengths_are_refused_not_answered(node: GatewayNode) -> None:
    extra = b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n"
    payload = _request(node, _url(node), extra=extra) + b"0\r\n\r\n"
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as sock:
        sock.sendall(payload)
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:100]
    assert BODY not in answer


def test_a_bad_or_expired_signature_is_refused_by_the_full_path(node: GatewayNode) -> None:
    url = _url(node)
    node.client().get_object(Bucket="fast", Key="small.bin")["Body"].read()
    assert _responses(node.port, _request(node, url), 1)[0][0] == 200
    tampered = url.replace("X-Amz-Signature=", "X-Amz-Signature=0")
    [(status, _, body)] = _responses(node.port, _request(node, tampered), 1)
    assert status == 403 and b"SignatureDoesNotMatch" in body
    # Another host than the one signed for: the same target is not the same request.
    [(status, _, body)] = _responses(
        node.port, _request(node, url).replace(b"Host: ", b"Host: x"), 1
    )
    assert status == 403 and b"SignatureDoesNotMatch" in body
    short = _url(node, expires=1)
    first = _responses(node.port, _request(node, short), 1)
    # Verified once, then kept: it must still expire (a second after it was signed).
    assert first[0][0] in (200, 403)

    def expired() -> bool:
        [(status, _, body)] = _responses(node.port, _request(node, short), 1)
        return status == 403 and b"Request has expired" in body

    eventually(expired, timeout=10)


def _url_v2(node: GatewayNode, key: str = "small.bin", expires: int = 3600) -> str:
    """A presigned GET as boto3 makes it for an endpoint of one's own by default: SigV2."""
    s3 = boto3.client(
        "s3", endpoint_url=node.url, aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
        config=Config(signature_version="s3", s3={"addressing_style": "path"}),
    )  # fmt: skip
    url: str = s3.generate_presigned_url(
        "get_object", Params={"Bucket": "fast", "Key": key}, ExpiresIn=expires
    )
    assert "Signature=" in url and "X-Amz-Signature" not in url
    return url


def test_a_sigv2_presigned_get_is_answered_at_the_edge_for_its_key_only(
    node: GatewayNode,
) -> None:
    node.client().get_object(Bucket="fast", Key="small.bin")["Body"].read()
    url = _url_v2(node)
    before = _fast(node)
    [(status, headers, body)] = _responses(node.port, _request(node, url), 1)
    assert (status, body, headers["x-cache"]) == (200, BODY, "hit")
    assert _fast(node) == before + 1
    # Its signature is for small.bin: on another key, tampered or expired, the full path
    # refuses it.
    other = _request(node, url).replace(b"/small.bin?", b"/other.txt?")
    tampered = _request(node, url.replace("Signature=", "Signature=0"))
    expired = _request(node, _url_v2(node, expires=-10))
    for request in (other, tampered, expired):
        [(status, _, body)] = _responses(node.port, request, 1)
        assert status == 403 and b"<Code>" in body and BODY not in body, body
    assert _fast(node) == before + 1


def test_a_deleted_key_is_refused_at_once_after_its_urls_were_answered(
    node: GatewayNode,
) -> None:
    out = node.cli("keys", "create").stdout
    access_key = out.split("access key:")[1].split()[0]
    secret = out.split("secret key:")[1].split()[0]
    eventually(lambda: _can_read(node, access_key, secret))
    request = _request(node, _url(node, access_key, secret))
    assert _responses(node.port, request, 1)[0][0] == 200
    assert _responses(node.port, request, 1)[0][0] == 200  # now verified from memory
    node.cli("keys", "delete", access_key)

    def refused() -> bool:
        [(status, _, body)] = _responses(node.port, request, 1)
        return status == 403 and b"InvalidAccessKeyId" in body

    eventually(refused, timeout=15)


def _can_read(node: GatewayNode, access_key: str, secret: str) -> bool:
    try:
        node.client(access_key, secret).head_object(Bucket="fast", Key="small.bin")
    except ClientError:
        return False
    return True


def test_an_overwrite_is_read_new_right_away(node: GatewayNode) -> None:
    s3 = node.client()
    s3.put_object(Bucket="fast", Key="rw.bin", Body=b"old" * 100)
    assert s3.get_object(Bucket="fast", Key="rw.bin")["Body"].read() == b"old" * 100
    assert s3.get_object(Bucket="fast", Key="rw.bin")["Body"].read() == b"old" * 100
    s3.put_object(Bucket="fast", Key="rw.bin", Body=b"new" * 100)
    assert s3.get_object(Bucket="fast", Key="rw.bin")["Body"].read() == b"new" * 100
    s3.delete_object(Bucket="fast", Key="rw.bin")
    with pytest.raises(ClientError, match="NoSuchKey"):
        s3.get_object(Bucket="fast", Key="rw.bin")


def test_http_1_0_is_answered_and_closed(node: GatewayNode) -> None:
    request = _request(node, _url(node)).replace(b"HTTP/1.1", b"HTTP/1.0")
    node.client().get_object(Bucket="fast", Key="small.bin")["Body"].read()
    before = _fast(node)
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):  # the node closes: the loop ends
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert b"connection: close" in answer.lower()
    assert answer.endswith(BODY)
    assert _fast(node) == before + 1


def _block_file(node: GatewayNode, size: int) -> Path:
    """The one block file in the node's cache that holds `size` bytes (and its tail)."""
    found = [
        p for p in (node.data_dir / "cache" / "blocks").rglob("*")
        if p.is_file() and size < p.stat().st_size < size + 4096
    ]  # fmt: skip
    assert len(found) == 1, found
    return found[0]


def _access_line(node: GatewayNode, request_id: str) -> dict[str, object] | None:
    for text in node.log().splitlines():
        if '"gateway.access"' in text and request_id in text:
            line: dict[str, object] = json.loads(text)
            return line
    return None


def _committed_block(node: GatewayNode, size: int) -> Path | None:
    try:
        return _block_file(node, size)
    except AssertionError:  # not committed yet
        return None


def _resident_pages(path: Path) -> int:
    """How many of the file's pages are in the page cache (util-linux's fincore: asking with a
    read, even RWF_NOWAIT, starts the kernel's read-ahead)."""
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "PAGES", str(path)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(out.stdout.split()[0])


def _evict(path: Path) -> bool:
    """Drop the file's pages from the page cache (written back first: dirty pages stay)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return _resident_pages(path) == 0


def test_a_hit_on_disk_is_answered_at_the_edge_and_read_in_on_a_thread_if_not_in_memory(
    node: GatewayNode,
) -> None:
    s3 = node.client()
    for _ in range(2):  # a miss, then a hit read from disk on a thread
        assert s3.get_object(Bucket="fast", Key="big.bin")["Body"].read() == BIG
    before = _fast(node)
    got = s3.get_object(Bucket="fast", Key="big.bin")
    assert got["Body"].read() == BIG and got["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit"
    assert _fast(node) == before + 1
    # A HEAD needs no byte of it: not read from disk at the edge, answered by the full path.
    assert s3.head_object(Bucket="fast", Key="big.bin")["ContentLength"] == len(BIG)
    assert _fast(node) == before + 1
    # Out of the page cache: read in (and checked) on a thread, the answer held meanwhile;
    # the loop never waits for the disk.
    block = _block_file(node, len(BIG))
    eventually(lambda: _evict(block))
    read_in = node.metric("gateway_cache_disk_sends")
    assert s3.get_object(Bucket="fast", Key="big.bin")["Body"].read() == BIG
    assert _fast(node) == before + 2
    assert s3.get_object(Bucket="fast", Key="big.bin")["Body"].read() == BIG  # back in memory
    assert _fast(node) == before + 3
    eventually(lambda: node.metric("gateway_cache_disk_sends") == read_in + 1)
    # A small range of a large object out of the page cache: the full path reads its pieces
    # (the edge would read the whole block in).
    eventually(lambda: _evict(block))
    got = s3.get_object(Bucket="fast", Key="big.bin", Range="bytes=1000-1999")
    assert got["Body"].read() == BIG[1000:2000]
    assert _fast(node) == before + 3
    # (A block damaged on disk: tests/e2e/test_edge_disk_files.py, under the zero-copy rules.)


def test_a_block_damaged_on_disk_and_read_in_at_the_edge_is_a_500_then_fetched_again(
    node: GatewayNode,
) -> None:
    s3 = node.client()
    for _ in range(2):
        assert s3.get_object(Bucket="fast", Key="big.bin")["Body"].read() == BIG
    block = eventually(lambda: _committed_block(node, len(BIG)))
    with open(block, "r+b") as f:  # on the disk: written back, then out of the page cache
        f.seek(5000)
        byte = f.read(1)
        f.seek(5000)
        f.write(bytes([byte[0] ^ 0xFF]))
    eventually(lambda: _evict(block))
    corrupt, fast = node.metric("gateway_cache_corrupt_blocks"), _fast(node)
    url = s3.generate_presigned_url(
        "get_object", Params={"Bucket": "fast", "Key": "big.bin"}, ExpiresIn=3600
    )
    # The read in checks the whole block, within the zero-copy window or not: the damage is
    # found before a byte is sent, and the answer is an error the client retries, not bytes.
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as sock:
        # One request: one pipelined behind it would take the full path (the edge answers one
        # at a time), find the damage too and fetch the block again, unanswered
        # (tests/unit/test_server.py has the requests behind a failed read in).
        sock.sendall(_request(node, url))
        stream = sock.makefile("rb")
        assert stream.readline() == b"HTTP/1.1 500 Internal Server Error\r\n"
        headers: dict[str, str] = {}
        while (line := stream.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        body = stream.read(int(headers["content-length"]))
        assert b"<Code>InternalError</Code>" in body and headers["x-amz-request-id"]
        assert headers["connection"] == "close"
        assert stream.read() == b""
    assert _fast(node) == fast + 1
    # Logged and counted as what the client got: the 500, under the answer's request id.
    rid = headers["x-amz-request-id"]
    assert f"<RequestId>{rid}</RequestId>".encode() in body
    line = eventually(lambda: _access_line(node, rid))
    assert (line["status"], line["bytes"], line["key"]) == (500, 0, "big.bin")
    eventually(lambda: node.metric("gateway_cache_corrupt_blocks") == corrupt + 1)
    eventually(lambda: not block.exists())
    got = s3.get_object(Bucket="fast", Key="big.bin")  # fetched again from the store
    assert got["Body"].read() == BIG and got["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "miss"


def _default_node(tmp_path: Path, key: str, body: bytes) -> GatewayNode:
    """A node at the default workers over a file mount `fast` that holds `key`."""
    files = tmp_path / "files"
    files.mkdir()
    (files / key).write_bytes(body)
    data = tmp_path / "data"
    run_cli(data, None, "mount", "add", "fast", files.as_uri(), "-o", "metadata_ttl=3600")
    return start_gateway(data, args=("--no-seal-blocks",))


def test_a_hit_out_of_the_page_cache_is_read_in_at_the_default_workers(tmp_path: Path) -> None:
    # The node as users run it (a worker per core): whichever worker takes the hit of a block
    # out of the page cache reads it in, checked, and the bytes are the object's.
    node = _default_node(tmp_path, "big.bin", BIG)
    try:
        for _ in range(3):  # a miss, then hits: the version known to the workers
            assert node.client().get_object(Bucket="fast", Key="big.bin")["Body"].read() == BIG
        block = eventually(lambda: _committed_block(node, len(BIG)))
        eventually(lambda: _evict(block))
        for _ in range(6):  # each on a client of its own: connections over the workers
            got = node.client().get_object(Bucket="fast", Key="big.bin")
            assert got["Body"].read() == BIG
            assert got["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "hit"
        eventually(lambda: node.metric("gateway_cache_disk_sends") >= 1)
    finally:
        node.stop()


def test_every_answer_is_in_the_access_log_after_a_graceful_stop(tmp_path: Path) -> None:
    # The access log is written in batches (a quarter second apart): the lines of the last
    # answers before a stop are written as the workers stop, not lost with them.
    node = _default_node(tmp_path, "small.bin", BODY)
    try:
        ids: dict[str, str] = {}
        for _ in range(3):  # a new connection each: the workers warm their memory tiers
            got = node.client().get_object(Bucket="fast", Key="small.bin")
            ids[got["ResponseMetadata"]["HTTPHeaders"]["x-amz-request-id"]] = "GetObject"
        for i in range(20):  # each on a connection of its own, over the workers
            if i % 2:
                got = node.client().head_object(Bucket="fast", Key="small.bin")
                op = "HeadObject"
            else:
                got = node.client().get_object(Bucket="fast", Key="small.bin")
                assert got["Body"].read() == BODY
                op = "GetObject"
            ids[got["ResponseMetadata"]["HTTPHeaders"]["x-amz-request-id"]] = op
        fast = _fast(node)
    finally:
        assert node.stop()
    assert fast > 0  # some were answered at the edge
    lines = [json.loads(x) for x in node.log().splitlines() if '"gateway.access"' in x]
    logged = {line["request_id"]: line for line in lines if line["request_id"] in ids}
    assert sorted(logged) == sorted(ids)
    # The edge's lines (rendered from parts kept per object) and the full path's alike.
    assert {tuple(line) for line in logged.values()} == {
        ("ts", "level", "logger", "msg", "request_id", "op", "method", "bucket", "key",
         "status", "bytes", "ms", "cache", "access_key", "store_ms"),
    }  # fmt: skip
    assert {line["cache"] for line in logged.values()} >= {"hit"}
    for request_id, op in ids.items():
        line = logged[request_id]
        assert (line["op"], line["bucket"], line["key"], line["status"]) == (
            op, "fast", "small.bin", 200,
        )  # fmt: skip
        assert line["bytes"] == (len(BODY) if op == "GetObject" else 0)
        assert line["level"] == "info" and line["msg"] == "request"
