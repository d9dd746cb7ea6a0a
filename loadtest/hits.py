"""Scenario `hits`: the product's hot path. Throughput and p50/p99 latency of cache hits per
object size, and of random ranges of one large object, at 1 and 64 connections, against
nginx serving the same bytes from disk (sendfile) and nginx proxy_cache in front of the same
origin, all warmed first. Load: wrk.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass

from loadtest.common import Options, Run, finish
from loadtest.data import (
    gateway_targets,
    origin_targets,
    random_ranges,
    seed_large,
    seed_objects,
)
from loadtest.httpclient import Job, LoadClient
from loadtest.report import Report
from loadtest.servers import BUCKET, start_gateway, start_nginx
from loadtest.sizes import fmt_size, parse_size
from loadtest.wrk import WrkResult, run_wrk

SUMMARY = "cache-hit req/s and p50/p99 by object size and for ranges, against nginx (wrk)"
COLUMNS = [
    "size", "conns", "server", "req/s", "MB/s", "p50 ms", "p99 ms",
    "server CPU", "CPU us/req", "machine CPU %", "origin us/req", "WAN proxy us/req", "errors",
]  # fmt: skip
LARGE = 16 << 20  # objects this big are read by --large-connections
SERVERS = ("gateway", "nginx static", "nginx proxy_cache")


def _sizes(text: str) -> list[int]:
    return [parse_size(s) for s in text.split(",") if s.strip()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sizes",
        type=_sizes,
        default=_sizes("4KiB,64KiB,1MiB,64MiB"),
        help="(4KiB,64KiB,1MiB,64MiB)",
    )
    p.add_argument("--connections", default="1,64", help="connection counts (1,64)")
    p.add_argument(
        "--large-connections",
        default="1,8",
        help="connection counts for objects of 16 MiB and more (1,8): 64 connections on 64 MiB "
        "objects finish no request in a 4 s run",
    )
    p.add_argument("--duration", type=float, default=4.0, help="seconds per wrk run (4)")
    p.add_argument("--repeats", type=int, default=3, help="runs per figure; median kept (3)")
    p.add_argument("--objects", type=int, default=64, help="objects per size (64; 4 at 64 MiB)")
    p.add_argument(
        "--range-object",
        type=parse_size,
        default=parse_size("1GiB"),
        help="size of the object read by random ranges (1GiB; 0: no range rows)",
    )
    p.add_argument("--range-size", type=parse_size, default=parse_size("1MiB"), help="(1MiB)")
    p.add_argument("--ranges", type=int, default=1024, help="distinct random ranges (1024)")


@dataclass(frozen=True)
class _Group:
    """One row group: whole objects of one size, or ranges of the large object."""

    label: str
    size: int  # of each object
    keys: list[str]
    ranges: list[str] | None = None  # Range header values, cycled over `keys[0]`

    def jobs(self, targets: list[str]) -> list[Job]:
        if self.ranges is None:
            return [Job(t) for t in targets]
        return [Job(targets[0], r) for r in self.ranges]

    def wrk_lines(self, targets: list[str]) -> list[str]:
        if self.ranges is None:
            return targets
        return [f"{targets[0]}\t{r}" for r in self.ranges]


@dataclass(frozen=True)
class _Target:
    name: str
    base_url: str
    pid: int
    targets: dict[str, list[str]]  # group label -> request targets of its keys


def _warm(client: LoadClient, target: _Target, group: _Group, expect: str) -> str:
    """Read every object (or range) twice; the second pass must be all hits, or the figures
    lie. The large object is first read whole, which fills every block of it."""
    targets = target.targets[group.label]
    if group.ranges is not None:
        whole = client.run(target.base_url, [Job(targets[0])], 1, 600)
        if whole.errors:
            raise RuntimeError(f"{target.name}: reading {group.label} whole failed")
    jobs = group.jobs(targets)
    client.run(target.base_url, jobs, 8, 600)
    tally = client.run(target.base_url, jobs, 8, 600)
    seen = dict(tally.x_cache)
    if tally.errors or seen.get(expect, 0) != len(jobs):
        raise RuntimeError(f"{target.name} {group.label} not warm: {seen}, {tally.errors} err")
    return f"{target.name} {group.label}: {seen}"


def _groups(args: argparse.Namespace, sizes: list[int]) -> list[_Group]:
    groups = []
    for size in sizes:
        n = args.objects if size < 64 << 20 else min(args.objects, 4)
        keys = [f"hits/{fmt_size(size)}/{i:04d}.bin" for i in range(n)]
        groups.append(_Group(fmt_size(size), size, keys))
    if args.range_object:
        big, span = args.range_object, args.range_size
        ranges = random_ranges(big, span, args.ranges, seed=3)
        label = f"{fmt_size(span)} of {fmt_size(big)}"
        groups.append(_Group(label, big, [f"hits/ranges/{fmt_size(big)}.bin"], ranges))
    return groups


def run(options: Options, args: argparse.Namespace) -> None:
    sizes = list(args.sizes)
    conns = [int(c) for c in args.connections.split(",")]
    large_conns = [int(c) for c in args.large_connections.split(",")]
    report = Report(scenario="hits", columns=COLUMNS)
    report.settings = {
        "sizes": sizes,
        "connections": conns,
        "large_connections": large_conns,
        "duration_s": args.duration,
        "repeats": args.repeats,
        "objects_per_size": args.objects,
        "range_object": args.range_object,
        "range_size": args.range_size,
        "ranges": args.ranges,
        "nginx_workers": options.nginx_workers,
        "gateway_args": list(options.gateway_args),
    }
    report.load_generator = (
        f"wrk 4.x (-t1 for 1 connection, -t2 otherwise), {args.duration:g} s per run, "
        f"median of {args.repeats}, a Lua script rotating over presigned SigV4 URLs "
        "(with a Range header for the range rows)"
    )
    groups = _groups(args, sizes)
    with Run("hits", options) as r:
        origin, shape = r.origin()
        files = r.workdir / "files"
        for group in groups:
            r.log(f"seeding {len(group.keys)} object(s) for {group.label}")
            if group.ranges is None:
                seed_objects(origin.seed_url, group.keys, group.size, files, r.log)
            else:
                seed_large(origin.seed_url, group.keys[0], group.size, files, r.log)
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
                {g.label: gateway_targets(gateway.url, g.keys) for g in groups},
            ),
            _Target(
                "nginx static",
                nginx.static_url,
                nginx.pid,
                {g.label: [f"/{BUCKET}/{k}" for k in g.keys] for g in groups},
            ),
            _Target(
                "nginx proxy_cache",
                nginx.proxy_url,
                nginx.pid,
                {g.label: origin_targets(origin.url, g.keys) for g in groups},
            ),
        ]
        # Every row is of hits: the origin's and the WAN proxy's CPU shows they did no work.
        watch = {k: v for k, v in origin.watch().items() if k != "gateway"}
        client = r.client()
        for group in groups:
            r.log(_warm(client, servers[0], group, "hit"))
            r.log(_warm(client, servers[2], group, "HIT"))
        targets_file = r.workdir / "targets.txt"
        for group in groups:
            large = group.ranges is None and group.size >= LARGE
            for c in large_conns if large else conns:
                runs: dict[str, list[WrkResult]] = {s.name: [] for s in servers}
                for _ in range(args.repeats):
                    # Interleaved, so that drift over the run hits every server alike.
                    for s in servers:
                        lines = group.wrk_lines(s.targets[group.label])
                        res = run_wrk(
                            s.base_url, lines, targets_file, c, args.duration, s.pid, watch
                        )
                        runs[s.name].append(res)
                for s in servers:
                    row = report.add(**_row(group.label, c, s.name, runs[s.name]))
                    r.log(
                        f"{group.label} c={c} {s.name}: {row['req/s']:.0f} req/s, "
                        f"{row['MB/s']:.0f} MB/s, p99 {row['p99 ms']:.2f} ms, "
                        f"server CPU {row['server CPU']}"
                    )
        report.ratios = _ratios(report)
        report.notes.append(
            "server CPU: cores used by the server (gateway process; nginx master + worker); "
            "CPU us/req: server CPU time per request; wrk runs on the same 2 cores"
        )
        if args.range_object:
            report.notes.append(
                f"ranges: {args.ranges} random, unaligned {fmt_size(args.range_size)} ranges of "
                f"one {fmt_size(args.range_object)} object, cycled; warmed by one whole read "
                "(the gateway then holds every block; proxy_cache the whole object)"
            )
        finish(r, report)


def _row(label: str, conns: int, server: str, runs: list[WrkResult]) -> dict[str, object]:
    mid = sorted(runs, key=lambda x: x.rps)[len(runs) // 2]  # the median run, whole
    return {
        "size": label,
        "conns": conns,
        "server": server,
        "req/s": mid.rps,
        "MB/s": mid.mbps,
        "p50 ms": statistics.median(x.p50_ms for x in runs),
        "p99 ms": statistics.median(x.p99_ms for x in runs),
        "server CPU": mid.cpu.server_cores,
        "CPU us/req": mid.cpu.server_cores / mid.rps * 1e6 if mid.rps else float("nan"),
        "machine CPU %": mid.cpu.machine_pct,
        **mid.cpu.per_request(mid.requests),
        "errors": sum(x.errors for x in runs),
        "all req/s": [round(x.rps) for x in runs],
        # wrk's mean latency against Little's law (connections / throughput): a check on its
        # latency histogram, which both come from.
        "mean ms": statistics.median(x.mean_ms for x in runs),
        "little ms": conns / max(mid.rps, 1e-9) * 1000,
    }


def _ratios(report: Report) -> dict[str, float]:
    """Gateway / baseline throughput: answers a second for objects under 1 MiB, whose answers
    differ in their heads' size (nginx proxy_cache passes on the origin's header fields, ~700
    bytes more than the gateway's at 4 KiB: 14 % of the bytes, which an MB/s ratio counted
    against the gateway); MB/s from 1 MiB on, still right where a run ends with responses
    half sent (and a head is a few per mille of the bytes)."""
    rows = {(row["size"], row["conns"], row["server"]): row for row in report.rows}
    ratios = {}
    for size, conns, server in rows:
        if server != "gateway":
            continue
        mine = rows[(size, conns, server)]
        unit = "MB/s" if parse_size(str(size).split()[0]) >= 1 << 20 else "req/s"
        for base in SERVERS[1:]:
            theirs = rows.get((size, conns, base))
            if theirs and theirs[unit]:
                ratios[f"{size} c={conns}: gateway / {base}"] = mine[unit] / theirs[unit]
    return ratios
