"""The servers under test on loopback: a gateway node with one mount, and nginx baselines.

nginx runs as our own process (`daemon off`, its own prefix and config in a temp folder)
with one worker, like the single uvicorn process of a gateway node.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from loadtest.procs import Cleanup, free_port, stop_process, wait_http

BIN = Path(sys.executable).parent
ACCESS_KEY = "LTACCESSKEY000000001"
SECRET_KEY = "loadtest-secret-key-0123456789abcdefghij"
ORIGIN_KEY, ORIGIN_SECRET = "origin-access-key", "origin-secret-key"
BUCKET = "loadtest"  # the bucket clients see on the gateway
ORIGIN_BUCKET, ORIGIN_PREFIX = "loadtest-origin", "data"  # where it lives at the origin


def base_env() -> dict[str, str]:
    env = dict(os.environ)
    # Credentials are always given explicitly; no SDK should go looking for instance metadata.
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    env.pop("AWS_CA_BUNDLE", None)
    return env


@dataclass
class Gateway:
    url: str
    pid: int
    data_dir: Path
    proc: subprocess.Popen[bytes] | None = None

    def stop(self) -> None:
        """Stop it now (it is also stopped at cleanup): its CPU and memory go back to the
        next phase."""
        if self.proc is not None:
            stop_process(self.proc)

    def metric(self, name: str) -> float:
        """Sum of one Prometheus series (all label sets) from /metrics."""
        return self.metrics(name)[0]

    def metrics(self, *names: str) -> list[float]:
        """Sums of Prometheus series (each over all its label sets), from one /metrics."""
        return metric_sums(self.url, *names)


def metric_sums(url: str, *names: str) -> list[float]:
    """Sums of Prometheus series (each over all its label sets) from one read of the node's
    /metrics at `url`."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    sums = []
    for name in names:
        pattern = rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.eE+-]+)$"
        sums.append(sum(float(v) for v in re.findall(pattern, text, re.M)))
    return sums


def add_mount(data_dir: Path, bucket: str, origin_url: str, metadata_ttl: str) -> None:
    """Mount the origin's data set as `bucket` on the gateway over `data_dir` (running or
    not: a running node has it when the command returns)."""
    mount = [
        str(BIN / "gateway"), "mount", "add", bucket, f"s3://{ORIGIN_BUCKET}/{ORIGIN_PREFIX}",
        "-o", f"endpoint_url={origin_url}", "-o", f"access_key={ORIGIN_KEY}",
        "-o", f"secret_key={ORIGIN_SECRET}", "-o", f"metadata_ttl={metadata_ttl}",
        "--data-dir", str(data_dir),
    ]  # fmt: skip
    out = subprocess.run(mount, capture_output=True, text=True, env=base_env(), timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"gateway mount add failed: {out.stderr or out.stdout}")


def start_gateway(
    cleanup: Cleanup,
    workdir: Path,
    origin_url: str,
    metadata_ttl: str,
    extra_args: list[str],
    name: str = "gateway",
    port: int | None = None,
) -> Gateway:
    """A node over `workdir / name`, the data set mounted; with `port`, the node of that
    folder started again on its port (a restart: its mount and cache as they were)."""
    data_dir = workdir / name
    data_dir.mkdir(parents=True, exist_ok=True)
    env = base_env()
    if port is None:
        add_mount(data_dir, BUCKET, origin_url, metadata_ttl)
        port = free_port()
    cmd = [
        str(BIN / "gateway"), "serve", "--host", "127.0.0.1", "--port", str(port),
        "--data-dir", str(data_dir), "--admin-access-key", ACCESS_KEY,
        "--admin-secret-key", SECRET_KEY, *extra_args,
    ]  # fmt: skip
    proc = cleanup.spawn(name, cmd, workdir / f"{name}.log", env)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/healthz", proc, timeout=60)
    return Gateway(url, proc.pid, data_dir, proc)


_NGINX_CONF = """\
daemon off;
master_process on;
worker_processes {workers};
user root root;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    sendfile on;
    # tcp_nopush (TCP_CORK) stays off: on loopback it held the tail of 64 KiB responses
    # for ~40 ms, and a proxy_cache hit of 64 KiB then took 44 ms every time.
    tcp_nopush off;
    keepalive_requests 10000000;
    keepalive_timeout 120s;
    default_type application/octet-stream;
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy_temp;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    proxy_cache_path {prefix}/cache levels=1:2 keys_zone=lt:32m max_size=50g inactive=1d
                     use_temp_path=off;
    upstream origin {{
        server {origin};
        keepalive 64;
    }}
    # The same bytes as the gateway serves, from files on disk: the local-disk ceiling.
    server {{
        listen 127.0.0.1:{static_port} backlog=4096;
        root {root};
        location / {{ }}
    }}
    # A plain HTTP cache in front of the same origin: what the gateway's cache competes with.
    server {{
        listen 127.0.0.1:{proxy_port} backlog=4096;
        location / {{
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            # Clients send URLs presigned for the origin (moto refuses anonymous reads);
            # the Host they were signed for is the origin's, and the cache key ignores them.
            proxy_set_header Host {origin};
            proxy_cache lt;
            proxy_cache_key $uri;
            proxy_cache_valid 200 1d;
            proxy_cache_lock on;
            proxy_max_temp_file_size 0;
            add_header x-cache $upstream_cache_status;
        }}
    }}
}}
"""


@dataclass
class Nginx:
    static_url: str  # files under `root`, path /<bucket>/<key>
    proxy_url: str  # proxy_cache in front of the origin: URLs presigned for the origin
    pid: int


def nginx_missing() -> str | None:
    missing = [tool for tool in ("nginx", "wrk") if shutil.which(tool) is None]
    if missing:
        return (
            f"{' and '.join(missing)} not found: install with `apt-get install -y wrk nginx` "
            "(or run loadtest/setup.sh)"
        )
    return None


def start_nginx(
    cleanup: Cleanup, workdir: Path, root: Path, origin_url: str, workers: int = 1
) -> Nginx:
    prefix = workdir / "nginx"
    for sub in ("client_body", "proxy_temp", "fastcgi", "uwsgi", "scgi", "cache"):
        (prefix / sub).mkdir(parents=True, exist_ok=True)
    static_port, proxy_port = free_port(), free_port()
    conf = prefix / "nginx.conf"
    conf.write_text(
        _NGINX_CONF.format(
            workers=workers,
            prefix=prefix,
            root=root,
            origin=origin_url.removeprefix("http://"),
            static_port=static_port,
            proxy_port=proxy_port,
        )
    )
    # -e: the error log of start-up goes here too, not to /var/log/nginx.
    cmd = ["nginx", "-p", str(prefix), "-c", str(conf), "-e", str(prefix / "error.log")]
    proc = cleanup.spawn("nginx", cmd, workdir / "nginx.log")
    static_url = f"http://127.0.0.1:{static_port}"
    wait_http(static_url + "/", proc, timeout=30)
    return Nginx(static_url, f"http://127.0.0.1:{proxy_port}", proc.pid)
