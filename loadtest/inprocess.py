"""Benchmark `inprocess`: the CPU a cache hit (or a cold miss) costs the node itself, with no
socket, server or load client in the way, so that it can be read on a busy machine too.

    python -m loadtest inprocess [--sizes 4KiB,64KiB,1MiB] [--requests 20000] [--profile]
    python -m loadtest inprocess --miss [--objects 2000] [--object-size 100KiB] [--readers 16]

A node is built in this process on a temporary data dir with a file mount, each object is
read once (a miss), then the same presigned GET is answered `--requests` times: through the
node's ASGI app (what uvicorn calls for every request), and, where the object qualifies, by
the answer the HTTP edge gives a plain hit (gateway/s3/fast.py). Each with the access log on
and off. Prints CPU µs per request (process time: other work on the machine does not count);
`--profile` adds cProfile's top functions of the ASGI path.

`--miss`: the CPU of a cold miss. The origin (`--origin`: rclone by default, SeaweedFS or
moto, loadtest/origins.py) on loopback, no WAN, holds `--objects` objects; a node in this
process mounts them as the `epochs` scenario does (S3, static credentials, metadata_ttl=-1)
and reads each once through its ASGI app, `--readers` at a time, every body read to its end.
Process time over the run, until the fills are on disk and the rows of object versions have
written to the database (cache-io and SQLite threads count), divided by the objects: µs per
miss. Then the same objects again, warm, for scale.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import botocore.session
from botocore.config import Config

from loadtest.common import Options
from loadtest.report import Row, format_table
from loadtest.sizes import fmt_size, parse_size

SUMMARY = "CPU per cache hit inside one node process: the ASGI path and the edge's answer"
COLUMNS = ["size", "access log", "path", "CPU us/req"]
_ACCESS_KEY = "GKLOADTESTINPROCESS1"
_SECRET = "loadtest-inprocess-secret-0123456789abcd"
_FERNET = "1wDQwpdCma37OnLa2U7kZwPGbp7KgCGXbcz5nb-BPIA="
Message = MutableMapping[str, Any]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", default="4KiB,64KiB,1MiB", help="object sizes (4KiB,64KiB,1MiB)")
    p.add_argument("--requests", type=int, default=20000, help="requests per figure (20000)")
    p.add_argument("--profile", action="store_true", help="print the ASGI path's profile")
    p.add_argument("--miss", action="store_true", help="CPU per cold miss from the origin")
    p.add_argument("--objects", type=int, default=2000, help="objects for --miss (2000)")
    p.add_argument("--object-size", default="100KiB", help="their size for --miss (100KiB)")
    p.add_argument("--readers", type=int, default=16, help="concurrent reads for --miss (16)")
    p.add_argument("--ttl", default="-1", help="the mount's metadata_ttl for --miss (-1)")


def run(options: Options, args: argparse.Namespace) -> None:
    if args.miss:
        print(format_table(MISS_COLUMNS, _misses(args, options)))
        return
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    rows = []
    for log in (True, False):
        for size in sizes:
            rows += _measure(size, args.requests, log, args.profile and log)
    print(format_table(COLUMNS, rows))


def _measure(size: int, n: int, access_log: bool, profile: bool) -> list[Row]:
    from gateway.config import build_settings
    from gateway.node import Node

    root = Path(tempfile.mkdtemp(prefix="loadtest-inprocess-"))
    files = root / "files"
    files.mkdir()
    (files / "obj.bin").write_bytes(os.urandom(size))
    data = root / "data"
    os.environ.setdefault("GATEWAY_ENCRYPTION_KEY", _FERNET)
    gateway = Path(sys.executable).parent / "gateway"
    mount = [str(gateway), "mount", "add", "bench", files.as_uri(), "--data-dir", str(data)]
    subprocess.run(mount, check=True, capture_output=True)
    settings = build_settings(
        {
            "data_dir": data,
            "admin_access_key": _ACCESS_KEY,
            "admin_secret_key": _SECRET,
            "access_log": access_log,
        }
    )
    node = Node(settings)
    client = botocore.session.get_session().create_client(
        "s3",
        endpoint_url="http://127.0.0.1:9000",
        aws_access_key_id=_ACCESS_KEY,
        aws_secret_access_key=_SECRET,
        region_name="us-east-1",
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
    )
    url = client.generate_presigned_url("get_object", Params={"Bucket": "bench", "Key": "obj.bin"})
    target = url.split("127.0.0.1:9000", 1)[1]
    path, _, query = target.partition("?")
    log_sink = io.StringIO()
    stderr, sys.stderr = sys.stderr, log_sink  # the access log's lines, not the terminal
    try:
        return asyncio.run(_hits(node, path, query, size, n, access_log, profile))
    finally:
        sys.stderr = stderr


async def _started(node: Any) -> Callable[[], Awaitable[None]]:
    """Run the node's lifespan startup, with the load's access key, as `gateway serve` does
    with --admin-access-key; returns what ends the lifespan."""
    lifespan: asyncio.Queue[Message] = asyncio.Queue()
    said: list[Message] = []
    started = asyncio.Event()

    async def tell(message: Message) -> None:
        said.append(message)
        started.set()

    await lifespan.put({"type": "lifespan.startup"})
    running = asyncio.create_task(node({"type": "lifespan"}, lifespan.get, tell))
    await started.wait()
    if said[0]["type"] != "lifespan.startup.complete":
        raise RuntimeError(f"the node did not start: {said[0]}")
    if await node.shared.meta.get_key(_ACCESS_KEY) is None:
        await node.shared.meta.create_key(_ACCESS_KEY, _SECRET, "loadtest inprocess")
    await node.shared.namespace.refresh()

    async def stop() -> None:
        await lifespan.put({"type": "lifespan.shutdown"})
        await running

    return stop


async def _hits(
    node: Any, path: str, query: str, size: int, n: int, access_log: bool, profile: bool
) -> list[Row]:
    stop = await _started(node)
    headers = [(b"host", b"127.0.0.1:9000"), (b"user-agent", b"wrk"), (b"accept", b"*/*")]
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": path, "raw_path": path.encode(),
        "query_string": query.encode(), "root_path": "", "headers": headers,
        "server": ("127.0.0.1", 9000), "client": ("127.0.0.1", 5555),
    }  # fmt: skip
    statuses: set[int] = set()

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            statuses.add(message["status"])

    async def asgi() -> None:
        await node(scope, receive, send)

    for _ in range(100):  # the miss, then warm
        await asgi()
    rows: list[Row] = []
    label = "on" if access_log else "off"
    rows.append(_row(size, label, "ASGI app", f"{await _cpu(asgi, n):.1f}"))
    if statuses != {200}:
        raise RuntimeError(f"the benchmark's GETs were answered {sorted(statuses)}")
    target = f"{path}?{query}".encode()
    date = [(b"date", b"Tue, 01 Dec 2026 00:00:00 GMT")]

    async def edge() -> None:
        node.s3.fast.answer(b"GET", target, headers, True, date)

    if node.s3.fast.answer(b"GET", target, headers, True, date) is not None:
        rows.append(_row(size, label, "edge answer", f"{await _cpu(edge, n):.1f}"))
    else:
        rows.append(_row(size, label, "edge answer", "(full path)"))
    if profile:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(n):
            await asgi()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(20)
    await stop()
    return rows


async def _cpu(call: Callable[[], Awaitable[None]], n: int) -> float:
    """CPU µs per call, over n calls."""
    started = time.process_time()
    for _ in range(n):
        await call()
    return (time.process_time() - started) / n * 1e6


def _row(size: int, log: str, path: str, cpu: str) -> Row:
    return dict(zip(COLUMNS, [fmt_size(size), log, path, cpu], strict=True))


# -- cold misses ------------------------------------------------------------------------------

MISS_COLUMNS = ["objects", "size", "readers", "pass", "seconds", "objects/s", "CPU us/object"]


def _misses(args: argparse.Namespace, options: Options) -> list[Row]:
    from gateway.config import build_settings
    from gateway.node import Node
    from loadtest.data import seed_objects
    from loadtest.procs import Cleanup, free_port
    from loadtest.servers import (
        ORIGIN_BUCKET,
        ORIGIN_KEY,
        ORIGIN_PREFIX,
        ORIGIN_SECRET,
        base_env,
    )
    from loadtest.wan import start_server

    size = parse_size(args.object_size)
    cleanup = Cleanup()
    try:
        root = Path(tempfile.mkdtemp(prefix="loadtest-inprocess-miss-"))
        cleanup.push(f"remove {root}", lambda: subprocess.run(["rm", "-rf", str(root)]))
        port = free_port()
        start_server(cleanup, root, [], "127.0.0.1", port, options.wan, own_netns=False)
        origin = f"http://127.0.0.1:{port}"
        keys = [f"miss/{i:07d}.bin" for i in range(args.objects)]
        seed_objects(origin, keys, size, None, lambda _: None)
        data = root / "data"
        os.environ.setdefault("GATEWAY_ENCRYPTION_KEY", _FERNET)
        gateway = Path(sys.executable).parent / "gateway"
        mount = [
            str(gateway), "mount", "add", "bench", f"s3://{ORIGIN_BUCKET}/{ORIGIN_PREFIX}",
            "-o", f"endpoint_url={origin}", "-o", f"access_key={ORIGIN_KEY}",
            "-o", f"secret_key={ORIGIN_SECRET}", "-o", f"metadata_ttl={args.ttl}",
            "--data-dir", str(data),
        ]  # fmt: skip
        subprocess.run(mount, check=True, capture_output=True, env={**base_env(), **os.environ})
        settings = build_settings(
            {
                "data_dir": data,
                "admin_access_key": _ACCESS_KEY,
                "admin_secret_key": _SECRET,
                "encryption_key": os.environ["GATEWAY_ENCRYPTION_KEY"],
            }
        )
        node = Node(settings)
        client = botocore.session.get_session().create_client(
            "s3",
            endpoint_url="http://127.0.0.1:9000",
            aws_access_key_id=_ACCESS_KEY,
            aws_secret_access_key=_SECRET,
            region_name="us-east-1",
            config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
        )
        targets = []
        for key in keys:
            url = client.generate_presigned_url(
                "get_object", Params={"Bucket": "bench", "Key": key}
            )
            targets.append(url.split("127.0.0.1:9000", 1)[1])
        log_sink = io.StringIO()
        stderr, sys.stderr = sys.stderr, log_sink
        try:
            import uvloop  # as `gateway serve` runs

            return uvloop.run(_cold(node, targets, size, args.readers, args.profile))
        finally:
            sys.stderr = stderr
    finally:
        cleanup.run()


async def _cold(node: Any, targets: list[str], size: int, readers: int, profile: bool) -> list[Row]:
    stop = await _started(node)
    headers = [(b"host", b"127.0.0.1:9000"), (b"user-agent", b"wrk"), (b"accept", b"*/*")]
    problems: list[str] = []
    caches: dict[str, int] = {}

    async def get(target: str) -> None:
        path, _, query = target.partition("?")
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
            "scheme": "http", "path": path, "raw_path": path.encode(),
            "query_string": query.encode(), "root_path": "", "headers": headers,
            "server": ("127.0.0.1", 9000), "client": ("127.0.0.1", 5555),
        }  # fmt: skip
        got = 0

        async def receive() -> Message:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: Message) -> None:
            nonlocal got
            if message["type"] == "http.response.start":
                if message["status"] != 200:
                    problems.append(f"{target}: {message['status']}")
                for name, value in message["headers"]:
                    if name == b"x-cache":
                        caches[value.decode()] = caches.get(value.decode(), 0) + 1
            elif message["type"] == "http.response.body":
                got += len(message.get("body", b""))

        await node(scope, receive, send)
        if got != size:
            problems.append(f"{target}: {got} bytes")

    async def epoch(targets: list[str]) -> tuple[float, float]:
        queue = list(reversed(targets))

        async def reader() -> None:
            while queue:
                await get(queue.pop())

        wall, cpu = time.monotonic(), time.process_time()
        await asyncio.gather(*(reader() for _ in range(readers)))
        # What a miss leaves behind is its cost too: the fill on disk, the metadata written.
        await node.shared.fills.settle()
        rows = node.shared.versions.rows
        while (writing := rows._task) is not None:
            await asyncio.wait([writing])
        return time.monotonic() - wall, time.process_time() - cpu

    await get(targets[0])  # the store's client made, the first connection: not a miss's cost
    profiler = _Profiler() if profile else None
    if profiler is not None:
        profiler.start()
    rows: list[Row] = []
    rest = targets[1:]
    seconds, cpu = await epoch(rest)
    if profiler is not None:
        profiler.stop()
    rows.append(_miss_row(len(rest), size, readers, "cold", seconds, cpu))
    seconds, cpu = await epoch(rest)
    rows.append(_miss_row(len(rest), size, readers, "warm", seconds, cpu))
    # What the node spends doing nothing (the janitor, journal flushes, polls of the database)
    # is in the figures above too: this much a second.
    wall, idle = time.monotonic(), time.process_time()
    await asyncio.sleep(3)
    idle = (time.process_time() - idle) / (time.monotonic() - wall)
    rows.append({**_miss_row(1, size, readers, "idle", 1, idle), "objects": "-", "objects/s": "-"})
    if problems:
        raise RuntimeError(f"{len(problems)} reads went wrong, e.g. {problems[:3]}")
    print(f"x-cache: {dict(sorted(caches.items()))}")
    if profiler is not None:
        profiler.report()
    await stop()
    return rows


def _miss_row(n: int, size: int, readers: int, how: str, seconds: float, cpu: float) -> Row:
    values = [n, fmt_size(size), readers, how, f"{seconds:.2f}", f"{n / seconds:.0f}",
              f"{cpu / n * 1e6:.0f}"]  # fmt: skip
    return dict(zip(MISS_COLUMNS, values, strict=True))


class _Profiler:
    """yappi's CPU clock over every thread where yappi is installed (the cache-io and SQLite
    threads count, and a coroutine's time is its own, not the time it waited); else
    cProfile, on the event loop's thread, in wall time."""

    def __init__(self) -> None:
        try:
            import yappi
        except ImportError:
            self._yappi: Any = None
            self._cprofile = cProfile.Profile()
        else:
            self._yappi = yappi

    def start(self) -> None:
        if self._yappi is None:
            self._cprofile.enable()
            return
        self._yappi.set_clock_type("cpu")
        self._yappi.start(builtins=True)

    def stop(self) -> None:
        if self._yappi is None:
            self._cprofile.disable()
        else:
            self._yappi.stop()

    def report(self) -> None:
        if self._yappi is None:
            stats = pstats.Stats(self._cprofile)
            stats.sort_stats("tottime").print_stats(40)
            stats.sort_stats("cumulative").print_stats(60)
            return
        funcs = self._yappi.get_func_stats()
        for key in ("tsub", "ttot"):
            print(f"-- yappi, CPU clock, all threads, by {key}")
            funcs.sort(key, "desc")
            for stat in list(funcs)[:60]:
                where = f"{stat.module.split('site-packages/')[-1]}:{stat.lineno}"
                print(f"{stat.ncall:>8} {stat.tsub:8.3f} {stat.ttot:8.3f}  {stat.name} {where}")
        for thread in self._yappi.get_thread_stats():
            print(f"thread {thread.name} {thread.id}: {thread.ttot:.3f} s")
