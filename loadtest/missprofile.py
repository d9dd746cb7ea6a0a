"""What a cold miss costs the gateway: CPU per cold GET, gateway function calls and package
crossings of one cold GET, and the top functions by own CPU.

    python -m loadtest.missprofile [--objects 2000] [--size 100KiB] [--origin rclone|moto]
        [--readers 4] [--ttl -1] [--profile-objects 300] [--traced 20] [--top 25] [--json F]
        [--load [--load-concurrency 32]]

An S3 origin on loopback (`rclone serve s3` over a folder, which keeps connections open as a
real store does; or loadtest.moto_origin, which closes every one) holds `--objects` objects of
`--size`; a gateway node (`gateway serve --workers 1`, SQLite, the access log on) mounts them
as `loadtest epochs` does (S3, static credentials, `metadata_ttl` `--ttl`). Every object is
then read once, cold, by `--readers` keep-alive HTTP connections (presigned GETs, each body
read to its end).

- **CPU per cold GET**: the node process's utime + stime (/proc/<pid>/stat, every thread)
  from before the first GET to 1 s after the last (the fills and the version rows'
  batches are done by then), divided by the objects; also net of the node's idle CPU (its
  janitor, refreshes and polls), measured over 3 s before the GETs; and the event loop's
  thread's share (the main thread's /proc/<pid>/task/<pid>/stat) and each other thread's
  (cache-io, SQLite's: Python names no OS thread, so they are listed by their CPU).
- **Top functions**: cProfile of the node's event loop thread over `--profile-objects` more
  cold GETs (started and stopped by SIGUSR1/SIGUSR2; threads other than the loop's are not
  in it), sorted by own time.
- **Calls and crossings**: a second node, run under a profile hook on every thread
  (sys.setprofile and threading.setprofile, counting only while switched on by a signal;
  its periodic re-read of mounts and keys set to every 600 s so that it falls in no window),
  reads 20 cold objects to warm up; then the hook counts over 8 s of idle, over one cold
  GET and 0.5 s after it (the fill's commit and the version rows' batch), 7 times, and over
  `--traced` cold GETs in a row (and 0.5 s after). A *gateway call* is the start of a new
  frame of a function defined under gateway/ (a "call" event whose frame is at its RESUME 0:
  a coroutine or generator resumed is not a new call; a coroutine counts when it starts
  running, not when it is created). Its *part* is the first path component under gateway/
  (`gateway/service/reads.py` is `service`, `gateway/stores/s3/transport.py` is `stores`,
  `gateway/edge.py` is `edge`). A *crossing* is a gateway call whose calling frame (f_back;
  for a coroutine, the one awaiting it) is a gateway function of another part; a gateway call
  from outside the gateway (the event loop, a library calling back) is an *entry*, counted
  apart. Each function's idle rate times the window's length is taken off its count (never
  below zero): per GET = (window - idle) / GETs. "One GET" is the median of the 7 windows.
  The hooked node is slower; its CPU is not measured.

With `--fs image`, the origin's files and the node's cache go on a journaled ext4 made for
the run (loadtest/fsimage.py; root): the inode probe then stays ~27 µs, where this VM's
journal-less root costs ~1 ms a new file for a while after a run's thousands of deletions.

With `--perf`, the measured GETs are also sampled by `perf record` (every thread of the
node, call chains) and the node's CPU per GET is split by thread name and by part: futex
(the GIL's and other locks' hand-overs between threads, with their context switches),
network, files, the kernel's other work, the interpreter, other libraries
(loadtest/perfsplit.py). The sampling runs during the measured GETs: its cost is in the
CPU figures (not measured apart; compare runs made with --perf to each other).

With `--load`, the measured and the profiled objects are not read by clients but loaded by
`gateway load` (a preload job over their prefix, `--load-concurrency` blocks in flight): the
node's CPU per object loaded, the event loop's share and the top functions, measured as for
GETs from the job's start to its end (the `gateway load` process itself is not counted);
no calls are traced. A loaded object against a client's cold GET shows what the job adds.

Each run prints its figures and writes them as JSON (`--json`, default
loadtest/results/missprofile-<time>.json). docs/architecture.md, "Counting the miss path",
says how to read them.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dis
import http.client
import json
import os
import pstats
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any

from loadtest import fscost, perfsplit

_REPO = Path(__file__).resolve().parent.parent
_BIN = Path(sys.executable).parent
_ACCESS_KEY, _SECRET = "LTMISSPROFILE0000001", "loadtest-missprofile-secret-0123456789ab"
_ORIGIN_KEY, _ORIGIN_SECRET = "missprofileorigin", "missprofile-origin-secret-0123"
_BUCKET, _ORIGIN_BUCKET, _PREFIX = "miss", "missprofile-origin", "data"
_WARM = 20  # cold GETs before anything is measured: connections, lazy imports, first fills
_IDLE_SECONDS = 3.0
_SETTLE = 1.0  # after the last GET: the fills' commits and the version rows' batch (0.25 s)
_TRACE_SETTLE = 0.5  # the same, in a traced window: less idle work to take off
_TRACE_IDLE = 8.0
_SINGLES = 7  # traced windows of one cold GET each; the median is reported


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_node"]:
        _node(argv[1], Path(argv[2]), argv[3:])
        return
    p = argparse.ArgumentParser(prog="python -m loadtest.missprofile", description=__doc__)
    p.add_argument("--objects", type=int, default=2000, help="cold GETs measured (2000)")
    p.add_argument("--size", default="100KiB", help="object size (100KiB)")
    p.add_argument("--origin", choices=("rclone", "moto"), default="rclone")
    p.add_argument("--readers", type=int, default=4, help="keep-alive connections (4)")
    p.add_argument("--ttl", default="-1", help="the mount's metadata_ttl (-1)")
    p.add_argument("--profile-objects", type=int, default=300, help="cold GETs profiled (300)")
    p.add_argument("--traced", type=int, default=20, help="cold GETs in the traced row (20)")
    p.add_argument("--top", type=int, default=25, help="functions listed (25)")
    p.add_argument("--json", type=Path, default=None, help="where to write the figures")
    p.add_argument(
        "--keep", action="store_true", help="keep the work folder (logs; not with --fs image)"
    )
    p.add_argument("--load", action="store_true", help="objects loaded by `gateway load`")
    p.add_argument("--load-concurrency", type=int, default=32, help="the load's (32)")
    p.add_argument(
        "--capacity", default=None, help="the node's --cache-capacity (e.g. 20MiB: past it)"
    )
    p.add_argument(
        "--fs", choices=("folder", "image"), default="folder",
        help="where the node's cache and the origin's files go: a folder under /tmp (folder), "
        "or a journaled ext4 image made for the run (image, loadtest/fsimage.py; root)",
    )  # fmt: skip
    p.add_argument(
        "--perf", action="store_true",
        help="perf record of the node over the measured GETs: its CPU by thread and part "
        "(loadtest/perfsplit.py: GIL and lock hand-offs, network, files, the interpreter)",
    )  # fmt: skip
    p.add_argument(
        "--strace", type=int, default=0,
        help="cold GETs read under strace after the CPU run: the files each makes (0: none)",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.perf and not perfsplit.available():
        p.error("--perf needs perf (linux-perf)")
    from loadtest.procs import Cleanup
    from loadtest.sizes import parse_size

    size = parse_size(args.size)
    cleanup = Cleanup()
    if args.fs == "image":
        from loadtest.fsimage import Scratch

        files = _WARM + args.objects + args.profile_objects + args.strace
        # The origin's copy and the cache's, with room; a few names a file.
        need, inodes = 3 * files * size + (1 << 30), 8 * files + 65536
        scratch = Scratch(None, "missprofile-fs-", need, inodes, mode="image")
        cleanup.push("remove the scratch file system", scratch.remove)
        work = Path(scratch.make().root)
        print(f"files on {scratch.note}")
    else:
        work = Path(tempfile.mkdtemp(prefix="missprofile-"))
        if not args.keep:
            cleanup.push(f"remove {work}", lambda: subprocess.run(["rm", "-rf", str(work)]))
    try:
        report = _run(cleanup, work, args, size)
    finally:
        cleanup.run()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.json or _REPO / "loadtest" / "results" / f"missprofile-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"\nfigures written to {out}")


# -- the run ----------------------------------------------------------------------------------


def _run(cleanup: Any, work: Path, args: argparse.Namespace, size: int) -> dict[str, Any]:
    # Three prefixes: the warm-up, the measured and the profiled objects (each loaded whole
    # by one `gateway load` in --load mode).
    keys = [f"w/{i:07d}.bin" for i in range(_WARM)]
    keys += [f"m/{i:07d}.bin" for i in range(args.objects)]
    keys += [f"p/{i:07d}.bin" for i in range(args.profile_objects)]
    keys += [f"s/{i:07d}.bin" for i in range(args.strace)]
    total = len(keys)
    origin = _start_origin(cleanup, work, args.origin, keys, size)
    print(f"origin: {args.origin} at {origin}, {total} objects of {size} bytes")
    report: dict[str, Any] = {
        "commit": _commit(), "objects": args.objects, "size": size, "origin": args.origin,
        "readers": args.readers, "ttl": args.ttl,
        "load_concurrency": args.load_concurrency if args.load else None,
    }  # fmt: skip
    what = "object loaded" if args.load else "cold GET"

    sized = ("--cache-capacity", args.capacity) if args.capacity else ()
    report["capacity"] = args.capacity
    node = _Node(cleanup, work, "cpu", "profile", origin, args.ttl, sized)
    urls = node.presign(keys)
    ends = _WARM + args.objects + args.profile_objects
    warm, measured, profiled, straced = (
        urls[:_WARM],
        urls[_WARM : _WARM + args.objects],
        urls[_WARM + args.objects : ends],
        urls[ends:],
    )
    _get_all(node.port, warm, args.readers)
    inode_us = fscost.create_cost(work)
    report["inode_probe_us"] = round(inode_us, 1)
    print(fscost.describe(inode_us))
    pageout = fscost.idle_pageout()
    report["idle_pageout"] = pageout
    if pageout is not None:
        print(pageout)
    idle0 = _cpu(node.pid)
    time.sleep(_IDLE_SECONDS)
    idle_rate = (_cpu(node.pid) - idle0) / _IDLE_SECONDS
    threads0 = _threads(node.pid)
    sampler = perfsplit.record(node.pid, work / "perf.data") if args.perf else None
    t0, cpu0, loop0 = time.monotonic(), _cpu(node.pid), _cpu(node.pid, node.pid)
    if args.load:
        node.load("m", args.objects, args.load_concurrency)
    else:
        _get_all(node.port, measured, args.readers)
    seconds = time.monotonic() - t0
    if sampler is not None:
        perfsplit.stop(sampler)
    time.sleep(_SETTLE)
    cpu = _cpu(node.pid) - cpu0
    loop = _cpu(node.pid, node.pid) - loop0  # the main thread runs the event loop
    net = cpu - idle_rate * (time.monotonic() - t0)
    threads = _threads(node.pid)
    spent = [used - threads0.get(tid, 0.0) for tid, used in threads.items() if tid != node.pid]
    others = sorted((round(s / args.objects * 1e6, 1) for s in spent), reverse=True)
    names = _names(node.pid)
    by_name: dict[str, float] = {}
    for tid, used in threads.items():
        if tid != node.pid:
            name = names.get(tid, "?")
            by_name[name] = by_name.get(name, 0.0) + (used - threads0.get(tid, 0.0))
    named = {n: round(s / args.objects * 1e6, 1) for n, s in by_name.items()}
    report["cpu"] = {
        "seconds": round(seconds, 3),
        "gets_per_s": round(args.objects / seconds, 1),
        "us_per_get": round(cpu / args.objects * 1e6, 1),
        "us_per_get_net_of_idle": round(net / args.objects * 1e6, 1),
        "event_loop_us_per_get": round(loop / args.objects * 1e6, 1),
        "other_threads_us_per_get": [x for x in others if x > 0],
        "threads_us_per_get_by_name": named,  # the OS names the gateway's threads give
        "idle_cores": round(idle_rate, 4),
    }
    print(
        f"\nCPU per {what}: {report['cpu']['us_per_get']:.0f} us "
        f"({report['cpu']['us_per_get_net_of_idle']:.0f} us net of the node's idle "
        f"{idle_rate * 100:.1f} % of a core), of it the event loop's thread "
        f"{loop / args.objects * 1e6:.0f} us; {args.objects} objects in {seconds:.1f} s, "
        + (
            f"{args.load_concurrency} blocks in flight"
            if args.load
            else f"{args.readers} connections"
        )
        + "; the other threads, each: "
        f"{', '.join(f'{x:g}' for x in others if x > 0)} us; by name (all of a name): "
        + ", ".join(f"{n} {x:g}" for n, x in sorted(named.items(), key=lambda i: -i[1]) if x > 0)
    )
    try:
        by = perfsplit.split(work / "perf.data") if sampler is not None else None
    except (OSError, subprocess.CalledProcessError) as exc:  # perf may not trace it here
        print(f"\nno perf figures: {exc}")
        by = None
    if by:
        shared = perfsplit.shares(by)
        report["perf"] = {
            name: {k: round(v, 4) for k, v in row.items()} for name, row in shared.items()
        }
        print(f"\nthe node's CPU a {what} by thread and part (perf, loadtest/perfsplit.py):")
        print(perfsplit.table(shared, cpu / args.objects * 1e6))
    if profiled:
        node.switch(signal.SIGUSR1)
        if args.load:
            node.load("p", len(profiled), args.load_concurrency)
        else:
            _get_all(node.port, profiled, args.readers)
        time.sleep(0.5)
        node.switch(signal.SIGUSR2)
        report["top"] = _top(node.control / "profile.pstats", len(profiled), args.top)
    if straced and not args.load:
        report["files"] = _straced(node, work, straced, args.readers)
    node.stop()
    if args.load:
        return report

    # Its periodic re-read of mounts, users and policies (~600 calls every 2 s) would fall
    # in a window now and then: once every 10 minutes here.
    quiet = ("--refresh-interval", "600")
    traced = _Node(cleanup, work, "trace", "trace", origin, args.ttl, quiet)
    turls = traced.presign(keys)
    _get_all(traced.port, turls[:_WARM], 1)
    idle = traced.trace(lambda: time.sleep(_TRACE_IDLE))
    singles = []
    for url in turls[_WARM : _WARM + _SINGLES]:
        window = traced.trace(lambda u=url: (_get_all(traced.port, [u], 1), _pause()))
        singles.append(_per_get(window, idle, 1))
    singles.sort(key=lambda s: s["calls"])
    row = turls[_WARM + _SINGLES : _WARM + _SINGLES + args.traced]
    many = traced.trace(lambda: (_get_all(traced.port, row, 1), _pause()))
    traced.stop()
    report["calls"] = {
        "one": singles[len(singles) // 2],
        "singles": [s["calls"] for s in singles],
        "row": _per_get(many, idle, len(row)),
        "idle_calls_per_s": round(sum(idle["calls"].values()) / idle["seconds"], 1),
    }
    _print_calls(report["calls"], len(row))
    return report


def _pause() -> None:
    time.sleep(_TRACE_SETTLE)


# What makes an inode (a new file, directory or symlink) and what makes a name for one.
_MAKES_INODE = ("mkdir", "mkdirat", "symlink", "symlinkat")
_MAKES_NAME = ("link", "linkat", "rename", "renameat", "renameat2")


def _straced(node: _Node, work: Path, urls: list[str], readers: int) -> dict[str, Any]:
    """Cold GETs under `strace -f` of the node (every thread): the inodes and names they make,
    per GET. An open with O_CREAT that returned a descriptor counts as a new inode (the
    page store's creates are all O_EXCL)."""
    out = work / "strace.txt"
    calls = ",".join(("open", "openat", *_MAKES_INODE, *_MAKES_NAME))
    tracer = subprocess.Popen(
        ["strace", "-f", "-qq", "-e", f"trace={calls}", "-o", str(out), "-p", str(node.pid)],
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(1.0)  # attached to every thread
        _get_all(node.port, urls, readers)
        time.sleep(_SETTLE)  # the commits, the key records' batch, a janitor pass
    finally:
        tracer.terminate()
        tracer.wait(timeout=30)
    made: Counter[str] = Counter()
    for line in out.read_text(errors="replace").splitlines():
        call = line.split(None, 1)[-1].split("(", 1)[0]
        result = line.rsplit("=", 1)[-1].strip().split(" ", 1)[0]
        if not result.lstrip("-").isdigit() or int(result) < 0:
            continue
        if call in ("open", "openat"):
            if "O_CREAT" in line:
                made["O_CREAT " + _where(line)] += 1
        elif call in _MAKES_INODE or call in _MAKES_NAME:
            made[f"{call} {_where(line)}"] += 1
    # The janitor's work on spare files (made ahead, evicted ones emptied) is off the miss
    # path, on its own thread: counted apart.
    miss = Counter({c: n for c, n in made.items() if not c.endswith(" spare")})
    inodes = sum(n for c, n in miss.items() if c.startswith(("O_CREAT", *_MAKES_INODE)))
    names = sum(n for c, n in miss.items() if c.split()[0] in _MAKES_NAME)
    gets = len(urls)
    figures = {
        "gets": gets,
        "inodes_per_get": round(inodes / gets, 2),
        "names_per_get": round(names / gets, 2),
        "calls": dict(made),
    }
    print(
        f"\nfiles made by {gets} cold GETs (strace -f of the node, every thread): "
        f"{figures['inodes_per_get']} new inodes a GET (O_CREAT opens, mkdirs, symlinks), "
        f"{figures['names_per_get']} new names (links, renames); {dict(made)}"
    )
    return figures


def _where(line: str) -> str:
    """Which of the node's folders a traced call makes its file or name in: that of the last
    path it names (a rename's or link's destination; an open's or mkdir's one path)."""
    paths = re.findall(r'"([^"]*)"', line)
    last = paths[-1] if paths else ""
    for part in ("spare", "inflight", "blocks", "keys", "journal", "retired"):
        if f"/{part}/" in last or last.endswith(f"/{part}"):
            return part
    return "other"


def _commit() -> str:
    out = subprocess.run(
        ["git", "-C", str(_REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return out.stdout.strip()


def _threads(pid: int) -> dict[int, float]:
    """CPU seconds of each live thread of the process, by thread id."""
    found = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):  # ended meanwhile
            found[int(task)] = _cpu(pid, int(task))
    return found


def _names(pid: int) -> dict[int, str]:
    """The OS name of each live thread of the process (gateway/threadnames.py names the
    cache's), by thread id."""
    found = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            found[int(task)] = Path(f"/proc/{pid}/task/{task}/comm").read_text().strip()
    return found


def _cpu(pid: int, task: int | None = None) -> float:
    """CPU seconds of the process (or of one of its threads, `task`)."""
    where = f"/proc/{pid}/stat" if task is None else f"/proc/{pid}/task/{task}/stat"
    fields = Path(where).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


# -- the origin -------------------------------------------------------------------------------


def _start_origin(cleanup: Any, work: Path, kind: str, keys: list[str], size: int) -> str:
    from loadtest.data import payload, random_block
    from loadtest.procs import free_port, wait_http

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "AWS_EC2_METADATA_DISABLED": "true"}
    env.pop("AWS_CA_BUNDLE", None)
    if kind == "rclone":
        # Files written where rclone serves them are its objects: no PUT per object.
        folder = work / "rclone" / _ORIGIN_BUCKET / _PREFIX
        block = random_block(size)
        for i, key in enumerate(keys):
            path = folder / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(payload(i, size, block))
        (work / "rclone.conf").touch()
        env["RCLONE_CONFIG"] = str(work / "rclone.conf")  # never the user's remotes
        cmd = [
            str(_BIN / "rclone"), "serve", "s3", "--addr", f"127.0.0.1:{port}",
            "--auth-key", f"{_ORIGIN_KEY},{_ORIGIN_SECRET}", str(work / "rclone"),
        ]  # fmt: skip
        proc = cleanup.spawn("rclone", cmd, work / "rclone.log", env)
        wait_http(url + "/", proc, timeout=60)
        return url
    cmd = [sys.executable, "-m", "loadtest.moto_origin", "-H", "127.0.0.1", "-p", str(port)]
    env["PYTHONPATH"] = str(_REPO)
    proc = cleanup.spawn("moto", cmd, work / "moto.log", env)
    wait_http(url + "/moto-api/", proc, timeout=60)
    _seed_moto(url, keys, size)
    return url


def _seed_moto(url: str, keys: list[str], size: int) -> None:
    """In moto's own process (loadtest.moto_origin's seeding endpoint)."""
    import urllib.request

    from loadtest.moto_origin import SEED_PATH

    _s3(url, _ORIGIN_KEY, _ORIGIN_SECRET).create_bucket(Bucket=_ORIGIN_BUCKET)
    spec = {"bucket": _ORIGIN_BUCKET, "keys": [f"{_PREFIX}/{k}" for k in keys], "size": size}
    request = urllib.request.Request(
        url + SEED_PATH, json.dumps(spec).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as resp:
        resp.read()


def _s3(url: str, key: str, secret: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3", endpoint_url=url, aws_access_key_id=key, aws_secret_access_key=secret,
        region_name="us-east-1",
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
    )  # fmt: skip


# -- the node ---------------------------------------------------------------------------------


class _Node:
    """`gateway serve --workers 1` under this module's `_node` wrapper (profile or trace)."""

    def __init__(
        self, cleanup: Any, work: Path, name: str, mode: str, origin: str, ttl: str,
        extra: tuple[str, ...] = (),
    ) -> None:  # fmt: skip
        from loadtest.procs import free_port, wait_http

        data = work / name
        self.control = work / f"{name}-control"
        self.control.mkdir(parents=True)
        # The caller's PYTHONPATH after the repo's: a sitecustomize that times the node's
        # phases reaches it.
        path = os.pathsep.join(filter(None, [str(_REPO), os.environ.get("PYTHONPATH", "")]))
        env = {**os.environ, "AWS_EC2_METADATA_DISABLED": "true", "PYTHONPATH": path}
        env.pop("AWS_CA_BUNDLE", None)
        mount = [
            str(_BIN / "gateway"), "mount", "add", _BUCKET, f"s3://{_ORIGIN_BUCKET}/{_PREFIX}",
            "-o", f"endpoint_url={origin}", "-o", f"access_key={_ORIGIN_KEY}",
            "-o", f"secret_key={_ORIGIN_SECRET}", "-o", f"metadata_ttl={ttl}",
            "--data-dir", str(data),
        ]  # fmt: skip
        subprocess.run(mount, check=True, capture_output=True, env=env, timeout=120)
        self.port = free_port()
        serve = [
            "serve", "--host", "127.0.0.1", "--port", str(self.port), "--data-dir", str(data),
            "--workers", "1", "--admin-access-key", _ACCESS_KEY, "--admin-secret-key", _SECRET,
            *extra,
        ]  # fmt: skip
        cmd = [sys.executable, "-m", "loadtest.missprofile", "_node", mode, str(self.control)]
        self.proc = cleanup.spawn(f"node {name}", [*cmd, *serve], work / f"{name}.log", env)
        self.pid = self.proc.pid
        wait_http(f"http://127.0.0.1:{self.port}/healthz", self.proc, timeout=120)
        self.data, self.env = data, env

    def presign(self, keys: list[str]) -> list[str]:
        client = _s3(f"http://127.0.0.1:{self.port}", _ACCESS_KEY, _SECRET)
        urls = [
            client.generate_presigned_url(
                "get_object", Params={"Bucket": _BUCKET, "Key": k}, ExpiresIn=6 * 3600
            )
            for k in keys
        ]
        return [urllib.parse.urlsplit(u)._replace(scheme="", netloc="").geturl() for u in urls]

    def load(self, prefix: str, objects: int, concurrency: int) -> None:
        """`gateway load` of the objects under `prefix`, to the job's end."""
        cmd = [
            str(_BIN / "gateway"), "load", f"{_BUCKET}/{prefix}/", "--data-dir", str(self.data),
            "--format", "json", "--concurrency", str(concurrency),
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=3600)
        job = json.loads(done.stdout) if done.stdout.strip() else {}
        if done.returncode != 0 or job.get("loaded_objects") != objects:
            raise RuntimeError(f"gateway load {prefix}: {done.returncode} {job} {done.stderr}")

    def switch(self, signum: int) -> None:
        """Switch the wrapper's profiler on (SIGUSR1) or off and write it out (SIGUSR2); wait
        until it says it has."""
        done = self.control / ("on" if signum == signal.SIGUSR1 else "off")
        done.unlink(missing_ok=True)
        os.kill(self.pid, signum)
        deadline = time.monotonic() + 30
        while not done.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the node did not switch its profiler ({done.name})")
            time.sleep(0.01)

    def trace(self, during: Any) -> dict[str, Any]:
        """The trace hook's counts over `during()`."""
        self.switch(signal.SIGUSR1)
        t0 = time.monotonic()
        during()
        seconds = time.monotonic() - t0
        self.switch(signal.SIGUSR2)
        found = json.loads((self.control / "trace.json").read_text())
        return {
            "seconds": seconds,
            "calls": Counter(found["calls"]),
            "crossings": Counter(found["crossings"]),
            "entries": Counter(found["entries"]),
        }

    def stop(self) -> None:
        from loadtest.procs import stop_process

        stop_process(self.proc)


# -- the client -------------------------------------------------------------------------------


def _get_all(port: int, targets: list[str], readers: int) -> None:
    """GET every target once over `readers` keep-alive connections, each body read whole."""
    chunks = [targets[i::readers] for i in range(readers)]

    def reader(mine: list[str]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            for target in mine:
                conn.request("GET", target)
                resp = conn.getresponse()
                body = resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"GET {target.split('?')[0]}: {resp.status} {body[:300]!r}")
        finally:
            conn.close()

    with ThreadPoolExecutor(readers) as pool:
        for done in [pool.submit(reader, mine) for mine in chunks if mine]:
            done.result()


# -- the figures ------------------------------------------------------------------------------


def _top(path: Path, gets: int, top: int) -> dict[str, Any]:
    stats = pstats.Stats(str(path))
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(tt for (_, _, tt, _, _) in raw.values())
    rows = sorted(raw.items(), key=lambda item: item[1][2], reverse=True)[:top]
    print(f"\ntop functions by own CPU, event loop thread, {gets} cold GETs (cProfile)")
    print(f"{'own us/GET':>10} {'share':>6} {'calls/GET':>9}  function")
    out = []
    for (file, line, name), (_, ncalls, tt, _, _) in rows:
        where = _short(file)
        row = {
            "function": f"{where}:{line}({name})",
            "own_us_per_get": round(tt / gets * 1e6, 1),
            "share": round(tt / total, 4) if total else 0.0,
            "calls_per_get": round(ncalls / gets, 2),
        }
        out.append(row)
        print(
            f"{row['own_us_per_get']:>10.1f} {row['share'] * 100:>5.1f}% "
            f"{row['calls_per_get']:>9.2f}  {row['function']}"
        )
    areas: Counter[str] = Counter()
    for (file, _, _), (_, _, tt, _, _) in raw.items():
        areas[_area(file)] += tt
    per_get = total / gets * 1e6
    print(f"own CPU by area (profiled thread, {per_get:.0f} us/GET with cProfile's own cost):")
    print(", ".join(f"{k} {v / total * 100:.1f}%" for k, v in areas.most_common(16)))
    return {"functions": out, "areas": {k: round(v / total, 4) for k, v in areas.most_common()}}


def _area(file: str) -> str:
    """gateway/<part>, or the library (its top-level package) a function is defined in."""
    if file.startswith(_GATEWAY):
        return "gateway/" + file[len(_GATEWAY) :].split(os.sep, 1)[0].removesuffix(".py")
    for marker in ("/site-packages/", "/lib/python3.11/"):
        if marker in file:
            return file.split(marker, 1)[1].split(os.sep, 1)[0].removesuffix(".py")
    return "builtins" if file == "~" else file


def _short(file: str) -> str:
    for marker in ("/site-packages/", "/lib/python3"):
        if marker in file:
            return file.split(marker, 1)[1]
    return os.path.relpath(file, _REPO) if file.startswith(str(_REPO)) else file


def _per_get(window: dict[str, Any], idle: dict[str, Any], gets: int) -> dict[str, Any]:
    scale = window["seconds"] / idle["seconds"]

    def net(name: str) -> Counter[str]:
        out: Counter[str] = Counter()
        for what, n in window[name].items():
            left = n - idle[name].get(what, 0) * scale
            if left > 0:
                out[what] = left
        return out

    calls, crossings, entries = net("calls"), net("crossings"), net("entries")
    by_part: Counter[str] = Counter()
    for fn, n in calls.items():
        by_part[fn.split(":", 1)[0]] += n
    return {
        "gets": gets,
        "calls": round(sum(calls.values()) / gets, 1),
        "crossings": round(sum(crossings.values()) / gets, 1),
        "entries": round(sum(entries.values()) / gets, 1),
        "calls_by_part": {k: round(v / gets, 1) for k, v in by_part.most_common()},
        "crossings_by_pair": {k: round(v / gets, 1) for k, v in crossings.most_common()},
        "functions": {k: round(v / gets, 2) for k, v in calls.most_common()},
    }


def _print_calls(calls: dict[str, Any], row: int) -> None:
    one, many = calls["one"], calls["row"]
    print(
        f"\ngateway calls per cold GET: one GET {one['calls']:.0f} (median of "
        f"{', '.join(f'{n:g}' for n in calls['singles'])}; crossings "
        f"{one['crossings']:.0f}, entries {one['entries']:.0f}); {row} in a row "
        f"{many['calls']:.1f} (crossings {many['crossings']:.1f}, entries "
        f"{many['entries']:.1f}); idle {calls['idle_calls_per_s']:.0f} calls/s taken off"
    )
    for title, table in (("calls by part", "calls_by_part"), ("crossings", "crossings_by_pair")):
        print(f"{title} (one GET):", ", ".join(f"{k} {v:g}" for k, v in one[table].items()))
    print("functions called (one GET):")
    for fn, n in one["functions"].items():
        print(f"  {n:6.2f}  {fn}")


# -- inside the node's process ----------------------------------------------------------------

_GATEWAY = str(_REPO / "gateway") + os.sep
_RESUME = dis.opmap["RESUME"]


class _Tracer:
    """The profile hook of trace mode: counts gateway calls, crossings and entries while on."""

    def __init__(self) -> None:
        self.on = False
        self.calls: Counter[str] = Counter()
        self.crossings: Counter[str] = Counter()
        self.entries: Counter[str] = Counter()
        self._parts: dict[str, str | None] = {}

    def part(self, filename: str) -> str | None:
        found = self._parts.get(filename, "")
        if found == "":
            found = None
            if filename.startswith(_GATEWAY):
                first = filename[len(_GATEWAY) :].split(os.sep, 1)[0]
                found = first.removesuffix(".py")
            self._parts[filename] = found
        return found

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.on or event != "call":
            return
        code = frame.f_code
        part = self.part(code.co_filename)
        if part is None:
            return
        at = frame.f_lasti
        raw = code.co_code
        if at < 0 or raw[at] != _RESUME or raw[at + 1] != 0:
            return  # a generator or coroutine resumed, not called
        name = f"{part}:{_short(code.co_filename)}:{code.co_firstlineno}({code.co_qualname})"
        self.calls[name] += 1
        back = frame.f_back
        caller = self.part(back.f_code.co_filename) if back is not None else None
        if caller is None:
            self.entries[part] += 1
        elif caller != part:
            self.crossings[f"{caller}->{part}"] += 1

    def dump(self, path: Path) -> None:
        found = {"calls": self.calls, "crossings": self.crossings, "entries": self.entries}
        path.write_text(json.dumps(found))
        self.calls, self.crossings, self.entries = Counter(), Counter(), Counter()


def _node(mode: str, control: Path, serve_args: list[str]) -> None:
    """Run `gateway serve` in this process with a profiler switched by SIGUSR1/SIGUSR2: in
    "profile" mode cProfile of the event loop's thread (the main one), written to
    profile.pstats; in "trace" mode the _Tracer on every thread, written to trace.json."""
    if mode == "trace":
        tracer = _Tracer()
        sys.setprofile(tracer.hook)
        threading.setprofile(tracer.hook)

        def on(signum: int, frame: FrameType | None) -> None:
            tracer.on = True
            (control / "on").touch()

        def off(signum: int, frame: FrameType | None) -> None:
            tracer.on = False
            tracer.dump(control / "trace.json")
            (control / "off").touch()

    else:
        # CPU time of the loop's thread, not the wall clock: a wait for SQLite's thread or
        # the GIL is not the waiter's own time.
        profiler = cProfile.Profile(time.thread_time)

        def on(signum: int, frame: FrameType | None) -> None:
            profiler.enable()
            (control / "on").touch()

        def off(signum: int, frame: FrameType | None) -> None:
            profiler.disable()
            profiler.dump_stats(str(control / "profile.pstats"))
            (control / "off").touch()

    signal.signal(signal.SIGUSR1, on)
    signal.signal(signal.SIGUSR2, off)
    from gateway.cli import main as gateway

    gateway(serve_args, prog_name="gateway")


if __name__ == "__main__":
    main()
