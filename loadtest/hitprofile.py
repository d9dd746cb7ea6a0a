"""Where a warm hit's CPU goes, layer by layer: `python -m loadtest.hitprofile`.

One node (`gateway serve --workers 1`, SQLite, a file mount, the access log on: the defaults
but one worker; `--workers N` for several, every one sampled) holds N objects of each size in
its cache; wrk (rotate.lua) GETs them over presigned SigV4 URLs at C connections for D
seconds, once per HTTP server (`--server gateway`, the node's own, and `--server uvicorn`),
while py-spy samples the worker. Each sample is put
in the layer of the innermost frame that names one (the rules below, by file and function):

- parse: the HTTP protocol's own code and the request head's parsing (gateway/server/,
  gateway/edge*.py, uvicorn's protocol, httptools, the request target in s3/fast.py);
- auth: SigV4/SigV2 verification and the authorization decision (s3/sigv4*.py, s3/sigv2.py,
  iam, service/authz.py);
- lookup: the version and the block (service/reads.py, service/metadata.py, cache/);
- render: the answer's head and body (s3/fast.py rendering, s3/handlers.py, s3/http.py,
  s3/app.py);
- log: the access log line and the request counters (logs.py, counters.py, prometheus);
- send: the connection's outbox (gateway/server/sends.py), `transport.write` and what the
  loop does for it (the sample's leaf in a write), sendfile;
- asgi: the ASGI cycle (the server's `Exchange`, uvicorn's cycle, the node's router,
  starlette) — what a hit answered in the parser's callback does not pay;
- loop: samples of the serving thread with no frame of a request: the event loop itself
  (epoll, libuv, accepting, timers), seen from Python as the loop's run frames only;
- threads: samples of the worker's other threads (the database driver's, the disk reads'),
  which run beside the loop and are counted in the worker's CPU;
- other: the rest.

CPU per request of a layer = its share of the samples x the worker's CPU seconds (from
/proc, over the run) / requests answered. py-spy's own sampling costs the worker a little
(it reads memory from outside, at 250 Hz here): the totals are a few per cent above an
unprofiled run's. `rechecks %`: the share of requests whose block was read and checked before
its zero-copy send (no worker of the node checked it within `zero_copy_recheck` seconds;
/metrics' gateway_cache_rechecks over the run): a warm epoch longer than the window pays
one a hit, the run here (warmed just before) few. Needs wrk and py-spy (`pip install py-spy`).
"""

from __future__ import annotations

import argparse
import linecache
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
from botocore.config import Config

from loadtest.fscost import drop_from_page_cache
from loadtest.procs import Cleanup, cpu_seconds, free_port, wait_http
from loadtest.servers import metric_sums
from loadtest.wrk import write_targets, wrk

_WARMERS = 16  # connections warming the node's cache before wrk

_BIN = Path(sys.executable).parent
_KEY, _SECRET = "GKHITPROFILE00000001", "hitprofile-secret-key-0000000000000000000"

# (layer, path fragment, function name or "" for any): the first rule a frame matches names its
# layer; a sample goes to the innermost frame that matches any rule.
_RULES: list[tuple[str, str, str]] = [
    ("log", "gateway/logs.py", ""),
    ("log", "gateway/counters.py", ""),
    ("log", "prometheus_client", ""),
    ("auth", "gateway/s3/sigv4", ""),
    ("auth", "gateway/s3/sigv2", ""),
    ("auth", "gateway/iam/", ""),
    ("auth", "gateway/service/authz.py", ""),
    ("lookup", "gateway/service/reads.py", ""),
    ("lookup", "gateway/service/metadata.py", ""),
    ("lookup", "gateway/cache/", ""),
    ("parse", "gateway/s3/fast.py", "object_target"),
    ("parse", "gateway/s3/routing.py", ""),
    ("render", "gateway/s3/fast.py", ""),
    ("render", "gateway/s3/handlers", ""),
    ("render", "gateway/s3/http.py", ""),
    ("render", "gateway/s3/app.py", ""),
    ("render", "gateway/s3/xml", ""),
    ("asgi", "gateway/server/exchange.py", ""),
    ("send", "gateway/server/sends.py", ""),
    ("asgi", "gateway/node.py", ""),
    ("asgi", "starlette", ""),
    ("asgi", "uvicorn/protocols/http/httptools_impl.py", "run_asgi"),
    ("asgi", "uvicorn/protocols/http/httptools_impl.py", "send"),
    ("asgi", "uvicorn/protocols/http/httptools_impl.py", "receive"),
    ("parse", "gateway/server/", ""),
    ("parse", "gateway/edge", ""),
    ("parse", "uvicorn/", ""),
    ("parse", "httptools", ""),
]
LAYERS = ["parse", "auth", "lookup", "render", "log", "send", "asgi", "loop", "threads", "other"]
# Frames of the process's start, beneath every request: not a layer.
_START = {"serve_process", "Serving.serve", "_worker", "_Supervisor.run", "_Supervisor._fork",
          "run_workers", "serve", "main", "Server.run", "Server.serve", "Server._serve",
          "Multiprocess.run", "Process.run", "Process._bootstrap"}  # fmt: skip
_ROOT = Path(__file__).resolve().parent.parent


def layer_of(stack: list[str]) -> str:
    """The layer of one sample: `stack` is py-spy's frames, outermost first, each
    "function (file:line)"."""
    if stack and "threading.py" in stack[0]:
        return "threads"
    for frame in reversed(stack):
        function, _, where = frame.partition(" (")
        if function in _START or "gateway/cli/" in where:
            return "loop"  # the process's own start: beneath it, no request's frame
        if where.startswith("gateway/") and _writes(where.rstrip(")")):
            return "send"
        for layer, fragment, name in _RULES:
            if fragment in where and (not name or function == name):
                return layer
    return "loop"


def _writes(where: str) -> bool:
    """Whether the source line at "path:line" writes to a transport (the time in the C
    call is the calling line's in a sample)."""
    path, _, line = where.rpartition(":")
    text = linecache.getline(str(_ROOT / path), int(line)) if line.isdigit() else ""
    return "transport.write" in text


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m loadtest.hitprofile", description=__doc__)
    p.add_argument("--sizes", default="4096,65536,1048576", help="object sizes in bytes")
    p.add_argument("--objects", type=int, default=200, help="objects of each size")
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--servers", default="gateway,uvicorn")
    p.add_argument(
        "--workers", type=int, default=1,
        help="worker processes (several share their metrics through files: all are sampled)",
    )  # fmt: skip
    p.add_argument("--rate", type=int, default=250, help="py-spy samples a second")
    p.add_argument("--top", type=int, default=0, help="print the N commonest leaf frames")
    p.add_argument(
        "--raw", type=Path, default=None,
        help="keep py-spy's raw stacks (one file per server and size) in this folder",
    )  # fmt: skip
    p.add_argument(
        "--evict", action="store_true",
        help="drop the cache's block files from the page cache before wrk (disk hits: a data"
        " set larger than memory); each object's first hit of the run reads the disk",
    )  # fmt: skip
    p.add_argument(
        "--gateway-args", default="", help="more `gateway serve` options, e.g. --no-fast-hits"
    )
    args = p.parse_args(argv)
    for tool in ("wrk", "py-spy"):
        if shutil.which(tool) is None and not (_BIN / tool).exists():
            sys.exit(f"{tool} is not installed")
    cleanup = Cleanup()
    try:
        work = Path(tempfile.mkdtemp(prefix="hitprofile-"))
        cleanup.push("work folder", lambda: shutil.rmtree(work, ignore_errors=True))
        files = work / "files"
        sizes = [int(s) for s in args.sizes.split(",")]
        for size in sizes:
            (files / str(size)).mkdir(parents=True)
            for i in range(args.objects):
                (files / str(size) / f"o{i}").write_bytes(os.urandom(size))
        rows = []
        for server in args.servers.split(","):
            rows += _profile(cleanup, work, files, server, sizes, args)
        _print(rows)
    finally:
        cleanup.run()


def _profile(
    cleanup: Cleanup,
    work: Path,
    files: Path,
    server: str,
    sizes: list[int],
    args: argparse.Namespace,
) -> list[dict[str, object]]:
    data = work / f"data-{server}"
    env = dict(os.environ, GATEWAY_ENCRYPTION_KEY="1wDQwpdCma37OnLa2U7kZwPGbp7KgCGXbcz5nb-BPIA=")
    gateway = str(_BIN / "gateway")
    subprocess.run(
        [gateway, "mount", "add", "files", files.as_uri(), "--data-dir", str(data),
         "-o", "metadata_ttl=-1"],
        check=True, env=env, capture_output=True,
    )  # fmt: skip
    port = free_port()
    log = (work / f"{server}.log").open("wb")
    proc = subprocess.Popen(
        [gateway, "serve", "--port", str(port), "--data-dir", str(data),
         "--workers", str(args.workers),
         "--server", server, "--admin-access-key", _KEY, "--admin-secret-key", _SECRET,
         *shlex.split(args.gateway_args)],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    cleanup.push(f"gateway ({server})", lambda: (proc.terminate(), proc.wait(20)))
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/healthz", proc)
    s3 = boto3.client(
        "s3", endpoint_url=url, aws_access_key_id=_KEY, aws_secret_access_key=_SECRET,
        region_name="us-east-1",
        config=Config(signature_version="s3v4", max_pool_connections=_WARMERS),
    )  # fmt: skip

    def warm(key: str) -> str:
        s3.get_object(Bucket="files", Key=key)["Body"].read()  # warm: read twice
        s3.get_object(Bucket="files", Key=key)["Body"].read()
        signed = s3.generate_presigned_url(
            "get_object", Params={"Bucket": "files", "Key": key}, ExpiresIn=3600
        )
        return str(signed).removeprefix(url)

    rows = []
    for size in sizes:
        # Warmed by several connections at once: one by one, 20,000 objects took minutes,
        # and the first were past the zero-copy recheck window (60 s) when wrk read them.
        with ThreadPoolExecutor(_WARMERS) as pool:
            targets = list(pool.map(warm, [f"{size}/o{i}" for i in range(args.objects)]))
        targets_file = work / f"targets-{server}-{size}"
        write_targets(targets_file, targets)
        if args.evict:
            files, dropped = drop_from_page_cache(data / "cache" / "blocks")
            print(f"{server} {size}: {files} block files, {dropped >> 20} MiB, off the page cache")
        raw = work / f"spy-{server}-{size}.txt"
        spy = subprocess.Popen(
            [shutil.which("py-spy") or str(_BIN / "py-spy"), "record", "--pid", str(proc.pid),
             "--format", "raw", "--output", str(raw), "--rate", str(args.rate),
             "--duration", str(int(args.seconds) + 2), "--nonblocking", "--gil",
             *(["--subprocesses"] if args.workers > 1 else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        cpu0 = cpu_seconds(proc.pid)
        rechecks = metric_sums(url, "gateway_cache_rechecks_total")[0]
        counts = wrk(url, [targets_file], args.connections, args.seconds)
        cpu = cpu_seconds(proc.pid) - cpu0
        time.sleep(1.2)  # the workers' figures are published once a second
        rechecks = metric_sums(url, "gateway_cache_rechecks_total")[0] - rechecks
        spy.wait(60)
        if args.raw is not None:
            args.raw.mkdir(parents=True, exist_ok=True)
            shutil.copy(raw, args.raw / raw.name)
        layers: Counter[str] = Counter()
        leaves: Counter[tuple[str, str]] = Counter()
        for line in raw.read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            if stack:
                frames = stack.split(";")
                layer = layer_of(frames)
                layers[layer] += int(n)
                leaves[(layer, frames[-1])] += int(n)
        for (layer, leaf), n in leaves.most_common(args.top):
            print(f"{server} {size} {layer:>6} {n:>6}  {leaf}")
        total = sum(layers.values()) or 1
        per_request_us = cpu / max(counts.requests, 1) * 1e6
        row: dict[str, object] = {
            "server": server,
            "size": size,
            "req/s": round(counts.rps),
            "errors": counts.errors,
            "p99 ms": counts.p99_ms,
            "CPU µs/req": round(per_request_us, 1),
            # Hits whose block was read and checked before its zero-copy send (not checked by
            # the node within zero_copy_recheck): a warm epoch past the window pays one each.
            "rechecks %": round(100 * rechecks / max(counts.requests, 1), 1),
        }
        for layer in LAYERS:
            row[layer] = round(per_request_us * layers[layer] / total, 1)
        rows.append(row)
    return rows


def _print(rows: list[dict[str, object]]) -> None:
    columns = list(rows[0])
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in columns) + " |")


if __name__ == "__main__":
    main()
