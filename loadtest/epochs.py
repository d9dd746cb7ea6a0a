"""Scenario `epochs`: a training job's reads. Many small objects, every one read once per
epoch in a new shuffled order by K concurrent readers, through each path:

- direct: the origin itself, behind the WAN;
- gateway: epoch 1 cold (every read a miss), then warm;
- local: the same bytes as files on local disk, read by the same client (the limit);
- nginx static: the same files over HTTP (what any HTTP server can do here), if nginx exists;
- nginx proxy_cache: a C cache in front of the same origin through the same WAN (epoch 1 its
  cold misses: what a miss can cost on this machine; then its hits);
- with --preload, gateway+preload: a fresh gateway where `gateway load` starts at t=0, as
  epoch 1 starts: the epoch against the same epoch direct, the load against the WAN's rate;
- with --restart, gateway restarted: the gateway stopped and started again on its cache after
  the other rows (its epoch 1: the hits of a node that must learn its versions again).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from loadtest.common import CPU_COLUMNS, Options, Run, finish, measure, row_of
from loadtest.data import gateway_targets, origin_targets, seed_objects
from loadtest.fscost import drop_from_page_cache
from loadtest.httpclient import CLIENT, Job
from loadtest.procs import CpuMeter
from loadtest.report import Report, Row
from loadtest.servers import (
    ACCESS_KEY,
    BIN,
    BUCKET,
    SECRET_KEY,
    Gateway,
    add_mount,
    base_env,
    start_gateway,
    start_nginx,
)
from loadtest.sizes import fmt_size, parse_size
from loadtest.wan import rate_bps

IMMUTABLE = f"{BUCKET}-immutable"  # the data set again, mounted with metadata_ttl=-1

SUMMARY = (
    "small objects read once per epoch in shuffled order: direct, gateway cold/warm, local files"
)
COLUMNS = [
    "path", "epoch", "seconds", "objects/s", "MB/s", "p50 ms", "p99 ms",
    "server CPU", "machine CPU %", *CPU_COLUMNS, "origin reqs", "origin conns", "thread claims",
    "rechecks", "edge %", "store p50 ms", "own p50 ms", "errors", "x-cache",
]  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--objects", type=int, default=20000, help="objects in the data set (20000)")
    p.add_argument("--object-size", type=parse_size, default=parse_size("100KiB"))
    p.add_argument("--readers", type=int, default=16, help="concurrent readers K (16)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument(
        "--no-client",
        dest="client",
        action="store_false",
        help="leave out the rows of the gateway's client library (short-circuit and HTTP)",
    )
    p.add_argument(
        "--preload", action="store_true",
        help="also: gateway load at t=0, as epoch 1 starts, on a fresh gateway",
    )  # fmt: skip
    p.add_argument("--preload-concurrency", type=int, default=32, help="the load's (32)")
    p.add_argument("--only-preload", action="store_true", help="direct and gateway+preload only")
    p.add_argument(
        "--no-client-http", dest="client_http", action="store_false",
        help="leave out the client library's HTTP rows (botocore, ~1 ms of client CPU an object)",
    )  # fmt: skip
    p.add_argument(
        "--client-nofile", type=int, default=0,
        help="the client rows' processes' descriptor limit (ulimit -n; raising it needs root)",
    )  # fmt: skip
    p.add_argument(
        "--pause", type=float, default=0.0,
        help="seconds to wait before each epoch after the first (more than the metadata TTL: "
        "the epoch starts with every version and lease lapsed, as after a pause in training)",
    )  # fmt: skip
    p.add_argument(
        "--interleave", action="store_true",
        help="the client's two HTTP rows (the TTL's and TTL -1's) last, epoch by epoch in turn, "
        "so that each pair of epochs meets the same load (their ratio per epoch is reported)",
    )  # fmt: skip
    p.add_argument(
        "--restart", action="store_true",
        help="also: the gateway restarted on its cache, last (its epoch 1 against its warm ones)",
    )  # fmt: skip
    p.add_argument(
        "--evict", action="store_true",
        help="before each epoch after the first, drop what the row's server keeps (the gateway's"
        " block files, nginx's files and proxy cache) from the page cache: a data set larger"
        " than memory, read from the disk in every epoch (local: the files)",
    )  # fmt: skip
    p.add_argument(
        "--only-client", action="store_true",
        help="the client library's rows, with the gateway's (which warm its cache) and local",
    )  # fmt: skip


def _split(log: Path, offset: int, gets: int) -> tuple[float | str, float | str, int]:
    """The median GET's store time and the gateway's own (its access-log line's `ms` less its
    `store_ms`: the time its store reads took to their first byte) over the row's `gets` GETs,
    logged from byte `offset` on (the log is written in batches: read until all are there, or
    5 s), and where they end: where a miss's time goes, the store's or the gateway's."""
    store: list[float] = []
    own: list[float] = []
    deadline = time.monotonic() + 5.0
    while True:
        with log.open("rb") as f:
            f.seek(offset)
            for line in f:
                if not line.endswith(b"\n"):
                    break  # being written: read with the rest
                offset += len(line)
                if b'"GetObject"' not in line:
                    continue
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                waited = float(entry.get("store_ms") or 0.0)
                if waited:
                    store.append(waited)
                own.append(float(entry["ms"]) - waited)
        if len(own) >= gets or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return (
        round(statistics.median(store), 2) if store else "-",
        round(statistics.median(own), 2) if own else "-",
        offset,
    )


def _epoch_row(path: str, epoch: int, row: Row) -> Row:
    row["path"], row["epoch"] = path, epoch
    row["objects/s"] = row.pop("req/s")
    return row


def run(options: Options, args: argparse.Namespace) -> None:
    report = Report(scenario="epochs", columns=COLUMNS)
    report.settings = {
        "objects": args.objects,
        "object_size": args.object_size,
        "readers": args.readers,
        "epochs": args.epochs,
        "processes": options.processes,
        "metadata_ttl": options.metadata_ttl,
        "gateway_args": list(options.gateway_args),
        "client_nofile": args.client_nofile,
        "pause": args.pause,
        "evict": args.evict,
        "preload_concurrency": args.preload_concurrency,
    }
    report.load_generator = (
        f"loadtest.httpclient: {options.processes} processes x asyncio/uvloop raw HTTP/1.1, "
        f"{args.readers} readers in all, presigned SigV4 URLs made before the load"
    )
    with Run("epochs", options) as r:
        origin, shape = r.origin()
        keys = [f"epochs/{i:07d}.bin" for i in range(args.objects)]
        files = r.workdir / "files"
        r.log(f"seeding {args.objects} x {fmt_size(args.object_size)} into the origin")
        seed_objects(origin.seed_url, keys, args.object_size, files, r.log)
        shape()
        report.wan = origin.description
        r.log(f"WAN: {origin.description}")
        gateway = start_gateway(
            r.cleanup, r.workdir, origin.url, options.metadata_ttl, list(options.gateway_args)
        )
        nginx = None
        if shutil.which("nginx"):
            nginx = start_nginx(r.cleanup, r.workdir, files, origin.url, options.nginx_workers)
        paths: list[tuple[str, str | None, list[str], int | None]] = [
            ("direct", origin.url, origin_targets(origin.url, keys), origin.pid),
            ("gateway", gateway.url, gateway_targets(gateway.url, keys), gateway.pid),
            ("local", None, [str(files / BUCKET / k) for k in keys], None),
        ]
        preloaded = None
        if args.preload:
            _load_alone(r, report, origin, options)
            preloaded = start_gateway(
                r.cleanup, r.workdir, origin.url, options.metadata_ttl,
                list(options.gateway_args), name="gateway-preload",
            )  # fmt: skip
            paths.append(("gateway+preload", preloaded.url,
                          gateway_targets(preloaded.url, keys), preloaded.pid))  # fmt: skip
        if args.only_preload:
            paths = [p for p in paths if p[0] in ("direct", "gateway+preload")]
            nginx = None
        if args.only_client:
            paths = [p for p in paths if p[0] in ("gateway", "local")]
            nginx = None
        if nginx is not None:
            paths.append(
                ("nginx static", nginx.static_url, [f"/{BUCKET}/{k}" for k in keys], nginx.pid)
            )
            # A C cache in front of the same origin through the same WAN: its epoch 1 is what
            # a miss can cost on this machine (issue 39's reference), its next ones its hits.
            paths.append(
                ("nginx proxy_cache", nginx.proxy_url, origin_targets(origin.url, keys), nginx.pid)
            )
        if args.client and not args.only_preload:
            # The gateway's client library against the same node, after the gateway's own
            # epochs (its cache is warm): reads of the node's block files handed over its
            # socket, and ranged GETs (routed to the owner; one node here).
            creds: dict[str, Any] = {
                "endpoint_url": gateway.url,
                "key": ACCESS_KEY,
                "secret": SECRET_KEY,
                "dataset": f"{BUCKET}/epochs",
            }
            if args.client_nofile:
                creds["nofile"] = args.client_nofile
            socket_path = str(gateway.data_dir / "gateway.sock")
            paths_of = [f"{BUCKET}/{k}" for k in keys]
            variants = [
                ("client short-circuit", {**creds, "local_socket": socket_path}, paths_of),
                ("client http", creds, paths_of),
            ]
            if options.metadata_ttl != "-1":
                # The same data set mounted again with metadata_ttl=-1 (what docs/client.md
                # says a training mount should set), read the same way: its epoch 1 fills
                # its own cache, the next are warm; side by side with the TTL above.
                add_mount(gateway.data_dir, IMMUTABLE, origin.url, "-1")
                variants.append((
                    "client short-circuit ttl -1",
                    {**creds, "local_socket": socket_path, "dataset": f"{IMMUTABLE}/epochs"},
                    [f"{IMMUTABLE}/{k}" for k in keys],
                ))  # fmt: skip
                variants.append((
                    "client http ttl -1",
                    {**creds, "dataset": f"{IMMUTABLE}/epochs"},
                    [f"{IMMUTABLE}/{k}" for k in keys],
                ))  # fmt: skip
            for name, opts, where in variants:
                if name.startswith("client http") and not args.client_http:
                    continue
                paths.append((name, CLIENT + json.dumps(opts), where, gateway.pid))
        if args.restart and not args.only_preload:
            # Last: no row after it measures the node by its first process id.
            signed = next(p[2] for p in paths if p[0] == "gateway")
            paths.append(("gateway restarted", gateway.url, signed, gateway.pid))
        nodes = {g.pid: g for g in (gateway, preloaded) if g is not None}
        client = r.client()
        load: dict[str, Any] = {}
        logged: dict[Path, int] = {}  # how far each gateway's log was read
        turns = [(path, epoch) for path in paths for epoch in range(1, args.epochs + 1)]
        if args.interleave:
            pair = [p for p in paths if p[0] in ("client http", "client http ttl -1")]
            turns = [(p, e) for p, e in turns if p not in pair]
            turns += [(p, e) for e in range(1, args.epochs + 1) for p in pair]
        for (name, base_url, targets, pid), epoch in turns:
            if epoch > 1 and args.pause > 0:
                time.sleep(args.pause)  # versions and leases lapse, as the option says
            if name == "gateway+preload" and epoch == 1:
                assert preloaded is not None
                loader = _start_load(preloaded.data_dir, args.preload_concurrency, load)
            if name == "gateway restarted":
                if epoch == 1:
                    gateway.stop()
                    port = int(gateway.url.rsplit(":", 1)[1])
                    gateway = start_gateway(
                        r.cleanup, r.workdir, origin.url, options.metadata_ttl,
                        list(options.gateway_args), port=port,
                    )  # fmt: skip
                    nodes[gateway.pid] = gateway
                pid = gateway.pid
            if args.evict and epoch > 1:
                node_of = nodes.get(pid) if pid is not None else None
                for folder in _kept_by(name, node_of, files, r.workdir):
                    dropped, size = drop_from_page_cache(folder)
                    r.log(f"{name}: {dropped} files, {size >> 20} MiB, off the page cache")
            order = list(range(len(keys)))
            random.Random(epoch).shuffle(order)  # the same order for every path
            jobs = [Job(targets[i]) for i in order]
            reqs, conns = origin.requests(), origin.connections()
            node = nodes.get(pid) if pid is not None and name.startswith("gateway") else None
            claims = _node_counts(node)
            through_gateway = name.startswith(("gateway", "client", "nginx proxy"))
            watch = origin.watch(pid if through_gateway else None)
            # A node's log is named as the node (start_gateway), not as the row.
            log = r.workdir / f"{node.data_dir.name}.log" if node is not None else None
            tally, cpu = measure(
                client, base_url, jobs, args.readers, options.phase_timeout, pid, watch
            )
            row = report.add(**_epoch_row(name, epoch, row_of(tally, cpu)))
            if name == "gateway+preload" and epoch == 1:
                loader.join()
                _load_row(report, load, origin.description, options.wan.rate)
            if reqs is not None:
                row["origin reqs"] = (origin.requests() or 0) - reqs
            if conns is not None:
                row["origin conns"] = (origin.connections() or 0) - conns
            if claims is not None:
                after = _node_counts(node, settle=True) or claims
                row["thread claims"] = after[0] - claims[0]
                row["rechecks"] = after[1] - claims[1]
                row["edge %"] = round(100 * (after[2] - claims[2]) / max(len(jobs), 1), 1)
            if log is not None:
                store, own, logged[log] = _split(log, logged.get(log, 0), len(jobs))
                row["store p50 ms"], row["own p50 ms"] = store, own
            r.log(
                f"{name} epoch {epoch}: {row['seconds']:.1f} s, {row['objects/s']:.0f} obj/s, "
                f"{row['MB/s']:.0f} MB/s, server CPU {cpu.server_cores}"
            )
        report.ratios = {**_ratios(report.rows), **report.ratios}
        report.notes.append(
            "server CPU: cores used by the server process (gateway, the origin for direct, nginx); "
            "local has no server (the client reads files; see machine CPU)"
        )
        report.notes.append(
            "gateway/origin/WAN proxy us/req: CPU microseconds per object of the row's gateway "
            "processes, of the origin's S3 server and of loadtest.wan_proxy, over the row"
        )
        report.notes.append(
            "origin reqs: requests sent to the origin (their heads, counted by the WAN proxy);"
            " origin conns: TCP connections made to it (each costs a round trip of the WAN)"
        )
        report.notes.append(
            "thread claims: a gateway row's fills claimed on a cache-io thread, not at once on"
            " the event loop (no spare listed: the janitor's pool ran dry; its /metrics)"
        )
        report.notes.append(
            "rechecks: a gateway row's zero-copy sends whose block was read and checked first"
            " (not checked by the node within zero_copy_recheck seconds; its /metrics)"
        )
        report.notes.append(
            "edge %: a gateway row's objects answered from the HTTP parser's callback (s3/fast.py,"
            " no ASGI cycle); the rest went the full path (a miss, or a block not in the page"
            " cache or memory)"
        )
        report.notes.append(
            "store p50 ms: a gateway row's median GET's store time to the first byte (its access"
            " log's store_ms, the GETs that read a store); own p50 ms: the median of ms less"
            " store_ms, every GET: the gateway's own part"
        )
        finish(r, report)


def _kept_by(name: str, node: Gateway | None, files: Path, workdir: Path) -> list[Path]:
    """The folders whose files a row's server reads its objects from (--evict)."""
    if name.startswith(("gateway", "client")) and node is not None:
        return [node.data_dir / "cache" / "blocks"]
    if name == "nginx proxy_cache":
        return [workdir / "nginx" / "cache"]
    if name in ("nginx static", "local"):
        return [files]
    return []


def _node_counts(node: Gateway | None, settle: bool = False) -> tuple[int, int, int] | None:
    """The node's fills claimed on a thread so far, its zero-copy sends whose block was read
    and checked first and its requests answered at the edge (None: not a gateway); `settle`:
    after its workers' next publication of their figures (once a second)."""
    if node is None:
        return None
    if settle:
        time.sleep(1.2)
    found = node.metrics(
        "gateway_cache_thread_claims_total",
        "gateway_cache_rechecks_total",
        "gateway_edge_fast_answers_total",
    )
    return int(found[0]), int(found[1]), int(found[2])


def _start_load(data_dir: object, concurrency: int, out: dict[str, Any]) -> threading.Thread:
    """`gateway load` of the whole bucket, timed from its start to the job's end."""
    cmd = [str(BIN / "gateway"), "load", BUCKET, "--data-dir", str(data_dir), "--format",
           "json", "--concurrency", str(concurrency)]  # fmt: skip

    def run() -> None:
        t0 = time.monotonic()
        done = subprocess.run(cmd, capture_output=True, text=True, env=base_env(), timeout=3600)
        out["seconds"] = time.monotonic() - t0
        job = json.loads(done.stdout)
        out["bytes"], out["objects"] = job["loaded_bytes"], job["loaded_objects"]
        out["state"] = f"{job['state']} ({job['message']})"
        if job.get("started_at") and job.get("ended_at"):  # the job's own time, not the CLI's
            span = datetime.fromisoformat(job["ended_at"]) - datetime.fromisoformat(
                job["started_at"]
            )
            out["job_seconds"] = span.total_seconds()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _load_row(report: Report, load: dict[str, Any], wan: str, rate: str) -> None:
    seconds = load["seconds"]
    mb_s = load["bytes"] / seconds / 1e6
    if rate_bps(rate) > 0:
        report.ratios["gateway load / WAN bandwidth"] = mb_s * 8e6 / rate_bps(rate)
    report.notes.append(
        f"gateway load (at t=0, with epoch 1 reading): {load['objects']:.0f} objects, "
        f"{load['bytes'] / 1e6:.0f} MB in {seconds:.1f} s = {mb_s:.0f} MB/s, "
        f"state {load['state']}; WAN {wan}"
    )
    report.settings["preload_seconds"] = round(seconds, 2)
    report.settings["preload_MB/s"] = round(mb_s, 1)
    print(report.notes[-1], flush=True)


def _load_alone(r: Run, report: Report, origin: Any, options: Options) -> None:
    """`gateway load` of the whole bucket on a fresh node that no client reads: what the load
    can move on its own (issue 39: >= 0.7x the WAN), and the node's CPU an object loaded. The
    node is stopped after it, so that it takes nothing from the rows that follow."""
    node = start_gateway(
        r.cleanup, r.workdir, origin.url, options.metadata_ttl, list(options.gateway_args),
        name="gateway-load-alone",
    )  # fmt: skip
    done: dict[str, Any] = {}
    meter = CpuMeter(node.pid, origin.watch(node.pid))
    _start_load(node.data_dir, report.settings["preload_concurrency"], done).join()
    cpu = meter.stop()
    node.stop()
    objects, seconds = max(1, int(done["objects"])), done["seconds"]
    mb_s = done["bytes"] / seconds / 1e6
    if rate_bps(options.wan.rate) > 0:
        report.ratios["gateway load alone / WAN bandwidth"] = (
            mb_s * 8e6 / rate_bps(options.wan.rate)
        )
    per = {k: round(v) if isinstance(v, float) else v for k, v in cpu.per_request(objects).items()}
    report.settings["load_alone_objects/s"] = round(objects / seconds)
    job_seconds = done.get("job_seconds") or seconds
    report.settings["load_alone_job_objects/s"] = round(objects / job_seconds)
    report.settings["load_alone_node_us"] = per["gateway us/req"]
    report.notes.append(
        f"gateway load alone (a fresh node, no client): {objects} objects, "
        f"{done['bytes'] / 1e6:.0f} MB in {seconds:.1f} s = {objects / seconds:.0f} objects/s, "
        f"{mb_s:.0f} MB/s (from the job's start, its listing, to its end: {job_seconds:.1f} s, "
        f"{objects / job_seconds:.0f} objects/s; the rest the CLI's start and the node's poll);"
        f" CPU µs an object loaded: node {per['gateway us/req']} "
        f"({cpu.server_cores} cores), origin {per['origin us/req']}, WAN proxy "
        f"{per['WAN proxy us/req']}; state {done['state']}"
    )
    print(report.notes[-1], flush=True)


def _median(rows: list[Row], path: str, epochs: range | None = None) -> float:
    values = [
        row["objects/s"]
        for row in rows
        if row["path"] == path and (epochs is None or row["epoch"] in epochs)
    ]
    return statistics.median(values) if values else float("nan")


def _seconds(rows: list[Row], path: str, epoch: int) -> float:
    found = [row["seconds"] for row in rows if row["path"] == path and row["epoch"] == epoch]
    return float(found[0]) if found else float("nan")


def _ratios(rows: list[Row]) -> dict[str, float]:
    warm = _median(rows, "gateway", range(2, 10**6))
    cold = _median(rows, "gateway", range(1, 2))
    ratios = {
        "gateway warm / local (objects/s)": warm / _median(rows, "local"),
        "gateway cold / direct (objects/s)": cold / _median(rows, "direct"),
        "gateway warm / direct (objects/s)": warm / _median(rows, "direct"),
    }
    # Paths left out (--only-preload, --only-client, one epoch) give no ratio, not nan.
    ratios = {k: v for k, v in ratios.items() if v == v}
    if any(row["path"] == "client short-circuit" for row in rows):
        local = _median(rows, "local")
        ratios["client short-circuit warm / local (objects/s)"] = (
            _median(rows, "client short-circuit", range(2, 10**6)) / local
        )
        if any(row["path"] == "client http" for row in rows):  # not with --no-client-http
            ratios["client http warm / local (objects/s)"] = (
                _median(rows, "client http", range(2, 10**6)) / local
            )
    if any(row["path"] == "client short-circuit ttl -1" for row in rows):
        ratios["client short-circuit ttl -1 warm / local (objects/s)"] = _median(
            rows, "client short-circuit ttl -1", range(2, 10**6)
        ) / _median(rows, "local")
    if any(row["path"] == "client http ttl -1" for row in rows):
        ratios["client http warm / client http ttl -1 warm (objects/s)"] = _median(
            rows, "client http", range(2, 10**6)
        ) / _median(rows, "client http ttl -1", range(2, 10**6))
        for epoch in range(2, 1 + max(row["epoch"] for row in rows)):
            ratios[f"client http / client http ttl -1, epoch {epoch} (objects/s)"] = _median(
                rows, "client http", range(epoch, epoch + 1)
            ) / _median(rows, "client http ttl -1", range(epoch, epoch + 1))
    if any(row["path"] == "gateway restarted" for row in rows):
        ratios["gateway restarted epoch 1 / gateway warm (objects/s)"] = (
            _median(rows, "gateway restarted", range(1, 2)) / warm
        )
    if any(row["path"] == "gateway+preload" for row in rows):
        ratios["gateway+preload epoch 1 / direct epoch 1 (seconds)"] = _seconds(
            rows, "gateway+preload", 1
        ) / _seconds(rows, "direct", 1)
    if any(row["path"] == "nginx static" for row in rows):
        ratios["gateway warm / nginx static (objects/s)"] = warm / _median(rows, "nginx static")
    if any(row["path"] == "nginx proxy_cache" for row in rows):
        ratios["gateway cold / nginx proxy_cache cold (objects/s)"] = cold / _median(
            rows, "nginx proxy_cache", range(1, 2)
        )
        ratios["gateway warm / nginx proxy_cache warm (objects/s)"] = warm / _median(
            rows, "nginx proxy_cache", range(2, 10**6)
        )
    return ratios
