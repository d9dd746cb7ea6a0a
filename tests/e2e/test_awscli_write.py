"""aws-cli (a real subprocess) writing through the gateway: multipart cp, sync both ways,
rm --recursive, s3api put-object with metadata."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.gateway import ACCESS_KEY, BIN, SECRET_KEY, GatewayNode, start_gateway
from tests.support.origin import CountingProxy


@pytest.fixture(scope="module")
def node(module_dir: Path, origin: CountingProxy, origin_s3: Any) -> Iterator[GatewayNode]:
    origin_s3.create_bucket(Bucket="origin-cli")
    node = start_gateway(module_dir / "node")
    node.cli(
        "mount", "add", "cliw", "s3://origin-cli", "-o", f"endpoint_url={origin.url}",
        "-o", "access_key=ak", "-o", "secret_key=sk",
    )  # fmt: skip
    (module_dir / "files").mkdir()
    node.cli("mount", "add", "clifile", (module_dir / "files").as_uri())
    yield node
    node.stop()


def aws(node: GatewayNode, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    }
    out = subprocess.run(
        [str(BIN / "aws"), "--endpoint-url", node.url, *args],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out


@pytest.mark.parametrize("bucket", ["cliw", "clifile"])
def test_cp_up_of_50_mib_is_multipart_and_round_trips(
    node: GatewayNode, bucket: str, tmp_path: Path
) -> None:
    data = os.urandom(50 << 20)
    (tmp_path / "big.bin").write_bytes(data)
    aws(node, "s3", "cp", str(tmp_path / "big.bin"), f"s3://{bucket}/big.bin")
    head = json.loads(
        aws(node, "s3api", "head-object", "--bucket", bucket, "--key", "big.bin").stdout
    )
    assert head["ContentLength"] == len(data)
    assert head["ETag"].endswith('-7"')  # aws-cli's 8 MiB parts
    aws(node, "s3", "cp", f"s3://{bucket}/big.bin", str(tmp_path / "back.bin"))
    assert (
        hashlib.sha256((tmp_path / "back.bin").read_bytes()).digest()
        == hashlib.sha256(data).digest()
    )


@pytest.mark.parametrize("bucket", ["cliw", "clifile"])
def test_sync_500_files_up_and_down_then_rm(node: GatewayNode, bucket: str, tmp_path: Path) -> None:
    up = tmp_path / "up"
    for i in range(500):
        path = up / f"d{i % 7}" / f"f{i:03d}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"file {i}\n".encode() * (i % 13 + 1))
        # Older than the upload: S3 lists LastModified to the second, and sync compares them.
        os.utime(path, (time.time() - 3600, time.time() - 3600))
    aws(node, "s3", "sync", str(up), f"s3://{bucket}/synced")
    down = tmp_path / "down"
    aws(node, "s3", "sync", f"s3://{bucket}/synced", str(down))
    files = sorted(p.relative_to(up) for p in up.rglob("*.txt"))
    assert sorted(p.relative_to(down) for p in down.rglob("*.txt")) == files
    assert all((up / f).read_bytes() == (down / f).read_bytes() for f in files)
    again = aws(node, "s3", "sync", str(up), f"s3://{bucket}/synced")
    assert "upload:" not in again.stdout  # nothing changed, nothing sent
    aws(node, "s3", "rm", f"s3://{bucket}/synced", "--recursive")
    listing = aws(node, "s3api", "list-objects-v2", "--bucket", bucket, "--prefix", "synced/")
    assert "Contents" not in (json.loads(listing.stdout) if listing.stdout.strip() else {})


def test_s3api_put_object_with_metadata(node: GatewayNode, tmp_path: Path) -> None:
    (tmp_path / "m.txt").write_bytes(b"meta")
    aws(
        node, "s3api", "put-object", "--bucket", "cliw", "--key", "m.txt", "--body",
        str(tmp_path / "m.txt"), "--metadata", "owner=ml,run=42", "--content-type", "text/plain",
    )  # fmt: skip
    head = json.loads(
        aws(node, "s3api", "head-object", "--bucket", "cliw", "--key", "m.txt").stdout
    )
    assert head["Metadata"] == {"owner": "ml", "run": "42"}
    assert head["ContentType"] == "text/plain"
