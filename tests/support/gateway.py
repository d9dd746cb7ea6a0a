"""Gateway nodes as real subprocesses (`gateway serve`) for end-to-end tests."""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import httpx
from botocore.config import Config

from gateway.jobs.client import HttpClient
from tests.support import procs
from tests.support.net import eventually, free_port, wait_http

BIN = Path(sys.executable).parent
ACCESS_KEY = "GKTESTACCESSKEY00001"
SECRET_KEY = "test-secret-key-0123456789abcdefghijklmn"
# A fixed Fernet key so that the CLI and the server agree without sharing a key file.
ENCRYPTION_KEY = "1wDQwpdCma37OnLa2U7kZwPGbp7KgCGXbcz5nb-BPIA="
# Which HTTP server the gateway processes the tests start use, unless a test names one with
# `--server` itself: `gateway` (the node's own, the default) or `uvicorn` (the plain-ASGI
# fallback), e.g. `GATEWAY_TEST_SERVER=uvicorn pytest tests/e2e` runs the suite on uvicorn.
SERVER_ENV = "GATEWAY_TEST_SERVER"
SERVERS = ("gateway", "uvicorn")


def chosen_server() -> str:
    """The server named by GATEWAY_TEST_SERVER (default: the node's own)."""
    server = os.environ.get(SERVER_ENV, "") or "gateway"
    if server not in SERVERS:
        raise ValueError(f"{SERVER_ENV} must be one of {', '.join(SERVERS)}: {server!r}")
    return server


def server_args(args: tuple[str, ...] | list[str] = (), server: str | None = None) -> list[str]:
    """`--server NAME` to add to a `gateway serve` command line whose arguments are `args`:
    `server` if given, else GATEWAY_TEST_SERVER's; nothing if `args` name a server already."""
    if any(a == "--server" or a.startswith("--server=") for a in args):
        return []
    return ["--server", server or chosen_server()]


# Nodes still running: stopped at exit too, so that a fixture failing between start and yield
# (a mount that cannot be added, say) leaves no gateway process behind.
_LIVE: set[GatewayNode] = set()


@atexit.register
def _stop_leftovers() -> None:
    for node in list(_LIVE):
        node.stop()


@dataclass(eq=False)
class GatewayNode:
    url: str
    port: int
    data_dir: Path
    database_url: str | None
    proc: subprocess.Popen[bytes]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    cert: Path | None = None  # the CA to trust when the node serves HTTPS

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run `gateway ARGS` against this node's database."""
        return run_cli(self.data_dir, self.database_url, *args, check=check, env=self.env)

    def client(self, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY, **cfg: Any) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=self.url,
            verify=str(self.cert) if self.cert else None,
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            region_name="us-east-1",
            config=Config(
                signature_version="s3v4",
                s3={"addressing_style": "path"},
                retries={"max_attempts": 1, "mode": "standard"},
                **cfg,
            ),
        )

    def job(self, job_id: int) -> dict[str, Any]:
        """A preload job as `gateway jobs show ID --format json` prints it, through the node's
        jobs API as that command's --endpoint does (gateway.jobs.client.HttpClient, the admin
        key): a test polling a job's progress starts no CLI process a look (~0.7 s of CPU
        each, beside the job it watches)."""

        async def get() -> dict[str, Any]:
            verify = str(self.cert) if self.cert else True
            client = HttpClient(self.url, ACCESS_KEY, SECRET_KEY, verify=verify)
            try:
                view = await client.get(job_id)
            finally:
                await client.close()
            assert view is not None, f"no job {job_id} on {self.url}"
            return view.to_json()

        return asyncio.run(get())

    def buckets(self) -> set[str]:
        """The buckets the node lists now (a mount shows at the node's next refresh)."""
        return {b["Name"] for b in self.client().list_buckets()["Buckets"]}

    def metric(self, name: str, labels: str = "") -> float:
        """The sum of a metric's samples on /metrics whose labels contain `labels`."""
        text = httpx.get(self.url + "/metrics", verify=str(self.cert) if self.cert else True).text
        total = 0.0
        for line in text.splitlines():
            m = re.match(rf"^{name}(_total)?(\{{[^}}]*\}})? (\S+)$", line)
            if m and labels in (m.group(2) or ""):
                total += float(m.group(3))
        return total

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def warnings(self) -> list[str]:
        """The node's log lines (JSON, one a line) at warning level or above."""
        found = []
        for line in self.log().splitlines():
            try:
                level = json.loads(line).get("level")
            except (ValueError, AttributeError):
                continue  # the banner and other plain lines
            if level in ("warning", "error", "critical"):
                found.append(line)
        return found

    def workers(self) -> list[int]:
        """The node's worker processes (none: it runs in its one process)."""
        return children(self.proc.pid)

    def wait_workers(self, timeout: float = 60.0) -> None:
        """Return once every worker of the node has started (read the mounts, keys and
        tenants, and published its first figures): /healthz answers from the first one."""

        def started() -> bool:
            pids = self.workers()
            folder = self.data_dir / "metrics"
            return all((folder / f"cache_{pid}.json").exists() for pid in pids)

        eventually(started, timeout=timeout)

    def crash(self) -> None:
        """SIGKILL every process of the node at once, as a host or an OOM kill of the node
        does: no shutdown of any kind, in the supervisor or its workers."""
        _LIVE.discard(self)
        pids = self.workers()
        procs.end(self.proc)  # its group: the node and every worker at once
        self.proc.wait()
        for pid in pids:  # reparented to init, which reaps them (or keeps them as zombies)
            while _running(pid):
                time.sleep(0.01)  # a killed process ends in microseconds; nothing to await

    def stop(self, wait: float = 15) -> bool:
        """SIGTERM, and SIGKILL if the node has not ended `wait` seconds later; whether it
        ended by itself (or had ended already). Whatever ends the wait (a test's timeout
        too), no process of the node's group is left."""
        _LIVE.discard(self)
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(wait)
                except subprocess.TimeoutExpired:
                    self.crash()  # the workers too: none is left serving on its own
                    return False
            return True
        finally:
            procs.end(self.proc)


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _running(pid: int) -> bool:
    """Whether any thread of the process is still there. A killed process's leader is a
    zombie as soon as it has exited, while its other threads may still be exiting: its files
    (the sockets its clients hold the other end of) are closed only once the last has."""
    if _state(pid) not in ("Z", "X", ""):
        return True
    try:
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    env["GATEWAY_ENCRYPTION_KEY"] = ENCRYPTION_KEY
    env.pop("AWS_CA_BUNDLE", None)
    env.update(extra or {})
    return env


def run_cli(
    data_dir: Path,
    database_url: str | None,
    *args: str,
    check: bool = True,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    cmd = [str(BIN / "gateway"), *args, "--data-dir", str(data_dir)]
    if args[:1] == ("serve",):
        cmd += server_args(args)
    if database_url:
        cmd += ["--database-url", database_url]
    out = subprocess.run(cmd, capture_output=True, text=True, env=_env(env), timeout=120)
    if check and out.returncode != 0:
        raise AssertionError(f"{cmd} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out


def start_gateway(
    data_dir: Path,
    *,
    database_url: str | None = None,
    args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    port: int | None = None,
    tls: tuple[Path, Path] | None = None,
    ca: Path | None = None,
    server: str | None = None,
) -> GatewayNode:
    """A `gateway serve` subprocess, once it answers. With `tls` (certificate, key) it serves
    HTTPS, and clients trust `ca` (default: the certificate itself, self-signed). Its HTTP
    server is the one `args` name (`--server`), else `server`, else GATEWAY_TEST_SERVER's."""
    data_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    cmd = [
        str(BIN / "gateway"), "serve", "--host", "127.0.0.1", "--port", str(port),
        "--data-dir", str(data_dir), "--admin-access-key", ACCESS_KEY,
        "--admin-secret-key", SECRET_KEY, *args, *server_args(args, server),
    ]  # fmt: skip
    # The node's default worker count (one per core) and refresh interval unless a test is
    # about one worker or another interval: what users run is what the tests run. (A change
    # holds on the node that made it at once; other nodes catch up within the interval.)
    if database_url:
        # Small pools: a test file runs fleets of several nodes of several workers, and test
        # files run side by side on one PostgreSQL (max_connections 100).
        cmd += ["--database-url", database_url]
        if "--database-connections" not in args:
            cmd += ["--database-connections", "4"]
    if tls:
        cmd += ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])]
    log_path = data_dir / f"gateway-{port}.log"
    full_env = _env(env)
    with log_path.open("wb") as log:
        proc = procs.start(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env)
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    cert = (ca or tls[0]) if tls else None
    node = GatewayNode(url, port, data_dir, database_url, proc, log_path, env or {}, cert)
    _LIVE.add(node)
    try:
        wait_http(url + "/healthz", timeout=60, proc=proc, cafile=str(cert) if cert else None)
    except RuntimeError as exc:
        node.stop()
        raise RuntimeError(f"{exc}\n--- gateway log ---\n{node.log()}") from None
    return node
