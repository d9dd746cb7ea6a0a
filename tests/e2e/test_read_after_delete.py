"""Read-after-delete on every worker, tried as it was found: a node at its default worker count
with an S3 bucket store over moto, a key written, six readers GETting it over new connections,
and a DeleteObject 50 ms after the PUT's answer. Every GET sent after the DELETE's answer must
be 404, whichever worker answers it and whatever fill was under way when the delete came."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.support.gateway import GatewayNode, start_gateway
from tests.support.net import eventually
from tests.support.origin import MotoServer

BUCKET = "rad"
ROUNDS = 25
READERS = 6
AFTER = 0.4  # seconds the readers go on after the DELETE's answer, each round
MiB = 1 << 20


@pytest.fixture(scope="module")
def node(module_dir: Path, moto_server: MotoServer) -> Iterator[GatewayNode]:
    options = f"endpoint_url={moto_server.url},access_key=ak,secret_key=sk"
    args = ("--bucket-store", "s3://", "--bucket-store-options", options)
    node = start_gateway(module_dir / "node", args=args)
    node.client().create_bucket(Bucket=BUCKET)
    eventually(lambda: BUCKET in node.buckets())
    node.wait_workers()
    yield node
    node.stop()


def _get(url: str) -> tuple[float, int, bytes]:
    """A GET over a new connection: when it was sent, its status and its body."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        sent = time.monotonic()
        conn.request("GET", f"{parts.path}?{parts.query}")
        answer = conn.getresponse()
        return sent, answer.status, answer.read()
    finally:
        conn.close()


def _round(s3: Any, key: str, body: bytes) -> list[tuple[float, int]]:
    """One round: the key written, read by READERS threads over new connections, deleted 50 ms
    after the PUT's answer; the GETs sent after the DELETE's answer that were not 404, as
    (seconds after that answer, status)."""
    s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    url = s3.generate_presigned_url(
        "get_object", Params={"Bucket": BUCKET, "Key": key}, ExpiresIn=600
    )
    stop = threading.Event()
    seen: list[tuple[float, int]] = []
    wrong: list[int] = []

    def read() -> None:
        while not stop.is_set():
            sent, status, data = _get(url)
            seen.append((sent, status))
            if status == 200 and data != body:
                wrong.append(len(data))

    readers = [threading.Thread(target=read) for _ in range(READERS)]
    for reader in readers:
        reader.start()
    try:
        time.sleep(0.05)  # the delete comes 50 ms after the PUT's answer, as it was found
        s3.delete_object(Bucket=BUCKET, Key=key)
        deleted = time.monotonic()

        def enough() -> bool:
            after = sum(1 for sent, _ in seen if sent > deleted)
            return time.monotonic() > deleted + AFTER and after >= READERS * 3

        eventually(enough, timeout=60)
    finally:
        stop.set()
        for reader in readers:
            reader.join()
    assert not wrong, f"bodies of the wrong bytes: {wrong}"
    return [(sent - deleted, status) for sent, status in seen if sent > deleted and status != 404]


def test_no_get_sent_after_a_delete_is_answered_gets_the_deleted_bytes(
    node: GatewayNode,
) -> None:
    s3: Any = node.client()
    late = {}
    for round_ in range(ROUNDS):
        found = _round(s3, f"obj-{round_}", bytes([round_ % 251]) * MiB)
        if found:
            late[round_] = found
    assert not late, f"rounds with GETs after the DELETE's answer not 404: {late}"
