"""The container image (Dockerfile), built and run as a fleet: two containers on the host's
network and the machine's PostgreSQL, read through with boto3, one restarted with its cache.
Skipped, saying why, where no container engine is usable; scripts/docker-base makes the
Dockerfile's base image where no image registry is reachable (docs/fleet.md)."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from botocore.config import Config
from cryptography.fernet import Fernet

from tests.support import procs
from tests.support.gateway import ACCESS_KEY, SECRET_KEY, run_cli
from tests.support.net import eventually, free_port
from tests.support.origin import CountingProxy
from tests.support.postgres import temp_database

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "s3-cache-gateway:e2e"
BUCKET = "container-origin"
KEYS = [f"obj/{i:02d}" for i in range(12)]


def _docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


def _why_not() -> str | None:
    """Why no image can be built and run here, or None when one can."""
    if shutil.which("docker") is None:
        return "no docker binary on PATH"
    info = _docker("info", "--format", "{{.ServerVersion}}", timeout=30)
    if info.returncode != 0:
        return f"the Docker daemon is not reachable: {info.stderr.strip()[:200]}"
    base = next(
        line.split()[1] for line in (ROOT / "Dockerfile").read_text().splitlines()
        if line.upper().startswith("FROM ")
    )  # fmt: skip
    if _docker("image", "inspect", base).returncode != 0 and shutil.which("debootstrap") is None:
        return f"the engine has no {base} image and there is no debootstrap to make one"
    return None


@pytest.fixture(scope="module")
def image() -> str:
    """The image of this tree: the base made if the engine lacks it (scripts/docker-base),
    then a build whose layers the engine keeps, so an unchanged tree builds in seconds."""
    why = _why_not()
    if why is not None:
        pytest.skip(why)
    subprocess.run([str(ROOT / "scripts" / "docker-base")], check=True, timeout=900)
    # The host's network for pip: the build fetches the gateway's dependencies.
    built = _docker("build", "--network", "host", "-t", IMAGE, str(ROOT), timeout=900)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return IMAGE


class Containers:
    """Containers this test started, each removed (with its volume) however the test ends:
    by the fixture, else at the session's end, else by the harness's reaper once the test
    process is gone (tests/support/procs.py)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def run(self, *args: str) -> str:
        name = f"gateway-e2e-{uuid.uuid4().hex[:10]}"
        self.names.append(name)
        procs.cleanup_at_end(name, ["docker", "rm", "-f", "-v", name])
        out = _docker("run", "-d", "--name", name, "--network", "host", *args)
        assert out.returncode == 0, out.stderr
        return name

    def remove_all(self) -> None:
        for name in self.names:
            _docker("rm", "-f", "-v", name)
            procs.ended(name)
        self.names.clear()


@pytest.fixture
def containers() -> Iterator[Containers]:
    found = Containers()
    try:
        yield found
    finally:
        found.remove_all()


def client(port: int) -> Any:
    return boto3.client(
        "s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                      retries={"max_attempts": 1, "mode": "standard"}),
    )  # fmt: skip


def ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def healthy(name: str) -> bool:
    """Whether the engine's HEALTHCHECK (the Dockerfile's) calls the container healthy."""
    out = _docker("inspect", "--format", "{{.State.Health.Status}}", name)
    return out.stdout.strip() == "healthy"


@pytest.mark.timeout(1200)
def test_two_containers_serve_as_a_fleet_and_one_restarted_keeps_its_cache(
    image: str, containers: Containers, origin: CountingProxy, origin_s3: Any, tmp_path: Path
) -> None:
    origin_s3.create_bucket(Bucket=BUCKET)
    data = {key: f"{key} ".encode() * 3000 for key in KEYS}
    for key, body in data.items():
        origin_s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    key = Fernet.generate_key().decode()
    with temp_database() as url:
        ports = [free_port() for _ in range(2)]
        names = []
        for i, port in enumerate(ports):  # one by one: the first makes the database's tables
            env = ["-e", f"GATEWAY_ENCRYPTION_KEY={key}", "-e", f"GATEWAY_PORT={port}"]
            names.append(containers.run(*env, image, *serve(url, i)))
            eventually(lambda p=port: ready(p), timeout=120, interval=0.5)
        run_cli(
            tmp_path / "cli", url, "mount", "add", "data", f"s3://{BUCKET}",
            "-o", f"endpoint_url={origin.url}", "-o", "access_key=origin-ak",
            "-o", "secret_key=origin-sk", "-o", "metadata_ttl=600",
            env={"GATEWAY_ENCRYPTION_KEY": key},
        )  # fmt: skip
        for port in ports:
            eventually(lambda p=port: "data" in buckets(p), timeout=30)
        origin.reset()
        for port in ports:
            for k, body in data.items():
                assert client(port).get_object(Bucket="data", Key=k)["Body"].read() == body
        # Each object fetched once, by its owner, for both nodes: they are one fleet.
        assert sorted(object_gets(origin)) == [f"/{BUCKET}/{k}" for k in KEYS], origin.requests
        eventually(lambda: all(healthy(n) for n in names), timeout=120, interval=1)

        restarted = _docker("restart", names[1])
        assert restarted.returncode == 0, restarted.stderr
        eventually(lambda: ready(ports[1]), timeout=120, interval=0.5)
        origin.reset()
        for k, body in data.items():
            assert client(ports[1]).get_object(Bucket="data", Key=k)["Body"].read() == body
        # Its own blocks from its own disk (and its peer's from its peer): no object's GET.
        assert object_gets(origin) == [], origin.requests


def serve(url: str, i: int) -> list[str]:
    """`gateway serve` as node-`i` of the fleet on the database `url`, on the host's loopback
    (its port in GATEWAY_PORT, which the image's HEALTHCHECK asks too)."""
    return [
        "serve", "--host", "127.0.0.1", "--internal-port", str(free_port()),
        "--database-url", url, "--database-connections", "4", "--workers", "1",
        "--fleet-secret", "container-fleet-secret", "--node-id", f"node-{i}",
        "--heartbeat-interval", "0.5", "--heartbeat-timeout", "3",
        "--admin-access-key", ACCESS_KEY, "--admin-secret-key", SECRET_KEY,
    ]  # fmt: skip


def object_gets(origin: CountingProxy) -> list[str]:
    """The paths of the GETs of objects the origin got (a listing's GET is the bucket's)."""
    prefix = f"/{BUCKET}/"
    return [r.path for r in origin.requests if r.method == "GET" and r.path.startswith(prefix)]


def buckets(port: int) -> set[str]:
    try:
        return {b["Name"] for b in client(port).list_buckets()["Buckets"]}
    except Exception:
        return set()
