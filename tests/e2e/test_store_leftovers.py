"""What a gateway killed (kill -9) in the middle of large PUTs leaves in its stores is swept
when it starts again (and periodically), while a live PUT of another node or worker on the
same store is left alone and completes.

- file://: the hidden temp file beside the destination. Its writer holds a flock on it and a
  marker (<root>/.s3gw-writes/) names it; a marked file nobody holds locked is removed.
- s3://: the origin multipart upload the gateway opened to stream the PUT. It is recorded in
  the database under a lease its writer renews (write_lease); one whose lease ran out is
  aborted by the janitor of any node.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.support.gateway import GatewayNode, start_gateway
from tests.support.net import eventually
from tests.support.postgres import temp_database

# Gateway processes killed with SIGKILL in the middle of large PUTs, then restarted.
pytestmark = pytest.mark.slow

MiB = 1 << 20


class SlowPut:
    """A presigned PUT sent over a raw socket, as slowly as the test says."""

    def __init__(self, node: GatewayNode, bucket: str, key: str, size: int) -> None:
        url = node.client().generate_presigned_url(
            "put_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=600
        )
        parts = urlsplit(url)
        self.data = os.urandom(size)
        self.sent = 0
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=60)
        head = (
            f"PUT {parts.path}?{parts.query} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            f"Content-Length: {size}\r\n\r\n"
        )
        self.sock.sendall(head.encode())

    def send(self, count: int) -> None:
        self.sock.sendall(self.data[self.sent : self.sent + count])
        self.sent += count

    def finish(self) -> int:
        """Send the rest; the status the gateway answers."""
        self.send(len(self.data) - self.sent)
        reply = b""
        while b"\r\n" not in reply:
            chunk = self.sock.recv(4096)
            assert chunk, f"connection closed after {reply!r}"
            reply += chunk
        self.sock.close()
        return int(reply.split(b" ", 2)[1])

    def close(self) -> None:
        self.sock.close()


def _killed(node: GatewayNode) -> None:
    node.crash()  # SIGKILL: no shutdown of any kind
    node.proc.wait(10)
    node.stop()  # forgets the node; nothing left to stop


@pytest.fixture
def puts() -> Iterator[list[SlowPut]]:
    opened: list[SlowPut] = []
    yield opened
    for put in opened:
        put.close()


def _temps(folder: Path) -> set[Path]:
    return set(folder.rglob(".*.s3gw-*.tmp"))


def test_temp_files_of_a_killed_node_are_swept_and_a_live_writers_are_not(
    tmp_path: Path, puts: list[SlowPut]
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    a = start_gateway(tmp_path / "a")
    b = start_gateway(tmp_path / "b", args=("--workers", "2"))
    try:
        for node in (a, b):
            node.cli("mount", "add", "shared", shared.as_uri())
            eventually(lambda node=node: node.client().head_bucket(Bucket="shared"))
        dying = SlowPut(a, "shared", "dir/dying.bin", 64 * MiB)
        puts.append(dying)
        dying.send(8 * MiB)
        (left,) = eventually(lambda: [t for t in _temps(shared) if t.stat().st_size >= 4 * MiB])
        _killed(a)

        live = SlowPut(b, "shared", "dir/live.bin", 24 * MiB)
        puts.append(live)
        live.send(6 * MiB)
        (held,) = eventually(lambda: _temps(shared) - {left})

        a = start_gateway(tmp_path / "a")
        eventually(lambda: not left.exists(), timeout=30)
        assert held.exists(), "a live writer's temp file was removed"
        assert live.finish() == 200
        got = b.client().get_object(Bucket="shared", Key="dir/live.bin")["Body"].read()
        assert got == live.data
        assert _temps(shared) == set()
        assert not list((shared / ".s3gw-writes").iterdir())  # no marker outlives its write
        eventually(lambda: "left in shared by writers that died" in a.log() + b.log())
    finally:
        a.stop()
        b.stop()


def test_origin_uploads_of_a_killed_node_are_aborted_and_a_live_writers_are_not(
    tmp_path: Path, puts: list[SlowPut], origin: Any, origin_s3: Any
) -> None:
    name = f"o{uuid.uuid4().hex[:10]}"
    origin_s3.create_bucket(Bucket=name)
    config = tmp_path / "gateway.toml"
    config.write_text("write_lease = 2\n")  # renewed every 2/3 s; lapsed 2 s after a death
    args = ("--config", str(config))

    def uploads() -> dict[str, str]:
        listed = origin_s3.list_multipart_uploads(Bucket=name).get("Uploads", [])
        return {u["Key"]: u["UploadId"] for u in listed}

    with temp_database() as db:
        a = start_gateway(tmp_path / "a", database_url=db, args=args)
        b = start_gateway(tmp_path / "b", database_url=db, args=args)
        try:
            a.cli("mount", "add", "via-s3", f"s3://{name}", "-o", f"endpoint_url={origin.url}",
                  "-o", "access_key=a", "-o", "secret_key=s")  # fmt: skip
            for node in (a, b):
                eventually(lambda node=node: node.client().head_bucket(Bucket="via-s3"))
            dying = SlowPut(a, "via-s3", "dying.bin", 40 * MiB)
            puts.append(dying)
            dying.send(10 * MiB)
            eventually(lambda: "dying.bin" in uploads())
            _killed(a)

            live = SlowPut(b, "via-s3", "live.bin", 40 * MiB)
            puts.append(live)
            live.send(10 * MiB)
            live_upload = eventually(lambda: uploads().get("live.bin"))

            a = start_gateway(tmp_path / "a", database_url=db, args=args)
            eventually(lambda: "dying.bin" not in uploads(), timeout=30)
            assert uploads().get("live.bin") == live_upload, "a live writer's upload was aborted"
            # the janitor logs after it has aborted the upload and closed its row: wait for it
            eventually(lambda: "whose lease ran out" in a.log() + b.log())
            assert live.finish() == 200
            got = origin_s3.get_object(Bucket=name, Key="live.bin")["Body"].read()
            assert got == live.data
            assert uploads() == {}
        finally:
            a.stop()
            b.stop()
