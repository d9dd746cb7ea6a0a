"""Scenario `hits`: the product's hot path. Throughput and p50/p99 latency of cache hits per
object size, at 1 and 64 connections, against nginx serving the same bytes from disk
(sendfile) and nginx proxy_cache in front of the same origin, all warmed first. Load: wrk.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass

from loadtest.common import Options, Run, finish
from loadtest.data import gateway_targets, origin_targets, seed_objects
from loadtest.httpclient import Job, LoadClient
from loadtest.report import Report
from loadtest.servers import BUCKET, start_gateway, start_nginx
from loadtest.sizes import fmt_size, parse_size
from loadtest.wrk import WrkResult, run_wrk

SUMMARY = "cache-hit req/s and p50/p99 by object size and connections, against nginx (wrk)"
COLUMNS = [
    "size", "conns", "server", "req/s", "MB/s", "p50 ms", "p99 ms",
    "server CPU", "machine CPU %", "errors",
]  # fmt: skip


def _sizes(text: str) -> list[int]:
    return [parse_size(s) for s in text.split(",") if s.strip()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", type=_sizes, default=_sizes("4KiB,64KiB,1MiB"))
    p.add_argument("--large", action="store_true", help="also 64 MiB objects")
    p.add_argument("--connections", default="1,64", help="connection counts (1,64)")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run (5)")
    p.add_argument("--repeats", type=int, default=3, help="runs per figure; median kept (3)")
    p.add_argument("--objects", type=int, default=64, help="objects per size (64; 4 at 64 MiB)")


@dataclass(frozen=True)
class _Target:
    name: str
    base_url: str
    pid: int
    targets: dict[int, list[str]]  # size -> request targets


def _warm(client: LoadClient, target: _Target, size: int, expect: str) -> str:
    """Read every object twice; the second pass must be all hits, or the figures lie."""
    jobs = [Job(t) for t in target.targets[size]]
    client.run(target.base_url, jobs, 8, 600)
    tally = client.run(target.base_url, jobs, 8, 600)
    seen = dict(tally.x_cache)
    if tally.errors or seen.get(expect, 0) != len(jobs):
        raise RuntimeError(f"{target.name} {fmt_size(size)} not warm: {seen}, {tally.errors} err")
    return f"{target.name} {fmt_size(size)}: {seen}"


def run(options: Options, args: argparse.Namespace) -> None:
    sizes = list(args.sizes) + ([64 << 20] if args.large else [])
    conns = [int(c) for c in args.connections.split(",")]
    report = Report(scenario="hits", columns=COLUMNS)
    report.settings = {
        "sizes": sizes,
        "connections": conns,
        "duration_s": args.duration,
        "repeats": args.repeats,
        "objects_per_size": args.objects,
        "nginx_workers": options.nginx_workers,
        "gateway_args": list(options.gateway_args),
    }
    report.load_generator = (
        f"wrk 4.x (-t1 for 1 connection, -t2 otherwise), {args.duration:g} s per run, "
        f"median of {args.repeats}, a Lua script rotating over presigned SigV4 URLs"
    )
    with Run("hits", options) as r:
        origin, shape = r.origin()
        files = r.workdir / "files"
        keys: dict[int, list[str]] = {}
        for size in sizes:
            n = args.objects if size < 64 << 20 else min(args.objects, 4)
            keys[size] = [f"hits/{fmt_size(size)}/{i:04d}.bin" for i in range(n)]
            r.log(f"seeding {n} x {fmt_size(size)}")
            seed_objects(origin.seed_url, keys[size], size, files, r.log)
        shape()
        report.wan = origin.description
        r.log(f"WAN: {origin.description}")
        gateway = start_gateway(
            r.cleanup, r.workdir, origin.url, options.metadata_ttl, list(options.gateway_args)
        )
        nginx = start_nginx(r.cleanup, r.workdir, files, origin.url, options.nginx_workers)
        servers = [
            _Target(
                "gateway",
                gateway.url,
                gateway.pid,
                {s: gateway_targets(gateway.url, keys[s]) for s in sizes},
            ),
            _Target(
                "nginx static",
                nginx.static_url,
                nginx.pid,
                {s: [f"/{BUCKET}/{k}" for k in keys[s]] for s in sizes},
            ),
            _Target(
                "nginx proxy_cache",
                nginx.proxy_url,
                nginx.pid,
                {s: origin_targets(origin.url, keys[s]) for s in sizes},
            ),
        ]
        client = r.client()
        for size in sizes:
            r.log(_warm(client, servers[0], size, "hit"))
            r.log(_warm(client, servers[2], size, "HIT"))
        for size in sizes:
            for c in conns:
                runs: dict[str, list[WrkResult]] = {s.name: [] for s in servers}
                for _ in range(args.repeats):
                    # Interleaved, so that drift over the run hits every server alike.
                    for s in servers:
                        targets_file = r.workdir / "targets.txt"
                        res = run_wrk(
                            s.base_url, s.targets[size], targets_file, c, args.duration, s.pid
                        )
                        runs[s.name].append(res)
                for s in servers:
                    row = _row(size, c, s.name, runs[s.name])
                    report.add(**row)
                    r.log(
                        f"{fmt_size(size)} c={c} {s.name}: {row['req/s']:.0f} req/s, "
                        f"{row['MB/s']:.0f} MB/s, p99 {row['p99 ms']:.2f} ms, "
                        f"server CPU {row['server CPU']}"
                    )
        report.ratios = _ratios(report)
        report.notes.append(
            "server CPU: cores used by the server (gateway process; nginx master + worker); "
            "wrk runs on the same 2 cores"
        )
        finish(r, report)


def _row(size: int, conns: int, server: str, runs: list[WrkResult]) -> dict[str, object]:
    mid = sorted(runs, key=lambda x: x.rps)[len(runs) // 2]  # the median run, whole
    return {
        "size": fmt_size(size),
        "conns": conns,
        "server": server,
        "req/s": mid.rps,
        "MB/s": mid.mbps,
        "p50 ms": statistics.median(x.p50_ms for x in runs),
        "p99 ms": statistics.median(x.p99_ms for x in runs),
        "server CPU": mid.cpu.server_cores,
        "machine CPU %": mid.cpu.machine_pct,
        "errors": sum(x.errors for x in runs),
        "all req/s": [round(x.rps) for x in runs],
        # wrk's mean latency against Little's law (connections / throughput): a check on its
        # latency histogram, which both come from.
        "mean ms": statistics.median(x.mean_ms for x in runs),
        "little ms": conns / mid.rps * 1000,
    }


def _ratios(report: Report) -> dict[str, float]:
    by = {(row["size"], row["conns"], row["server"]): row["req/s"] for row in report.rows}
    ratios = {}
    for size, conns, server in by:
        if server == "gateway":
            for base in ("nginx static", "nginx proxy_cache"):
                ratios[f"{size} c={conns}: gateway / {base}"] = (
                    by[(size, conns, "gateway")] / by[(size, conns, base)]
                )
    return ratios
