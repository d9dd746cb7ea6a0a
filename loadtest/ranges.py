"""Scenario `ranges`: random ranged reads (1 MiB) over one large object, the way columnar
readers and s3torchconnector read, with the bytes the origin sent per byte served.

Three passes of `--ranges` random, unaligned ranges by `--readers` concurrent readers on every
path: `cold` (set A, on a gateway with an empty cache), `warm` (set A again: every block it
needs is cached) and `new` (a fresh set B: some of its blocks were filled by set A). Paths:
the origin directly (behind the WAN), the gateway (the object cached in blocks of 4 MiB; a
range fetches only the blocks it covers), a second gateway with `--block-sizes`' other sizes
(1 MiB: less read amplification, more requests), and nginx serving the same file with Range
requests (sendfile), if nginx is installed.
"""

from __future__ import annotations

import argparse
import shutil

from loadtest.common import CPU_COLUMNS, Options, Run, finish, measure, prime, row_of
from loadtest.data import (
    gateway_targets,
    origin_targets,
    random_ranges,
)
from loadtest.httpclient import Job
from loadtest.report import Report, Row
from loadtest.servers import BUCKET, Gateway, start_gateway, start_nginx
from loadtest.sizes import fmt_size, parse_size

SUMMARY = "random 1 MiB ranges of a large object, cold and warm, and origin bytes per byte served"
COLUMNS = [
    "path", "pass", "seconds", "ranges/s", "MB/s", "p50 ms", "p99 ms", "server CPU",
    *CPU_COLUMNS, "origin reqs", "origin MB", "origin B / served B", "fills", "prefetches",
    "errors", "x-cache",
]  # fmt: skip
PRIMER = "ranges/primer.bin"  # read before the cold pass: a fresh gateway's first miss
PASSES = {"cold": 1, "warm": 1, "new": 2}  # pass -> seed of its random ranges


def _sizes(text: str) -> list[int]:
    return [parse_size(s) for s in text.split(",") if s.strip()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--object-size", type=parse_size, default=parse_size("1GiB"), help="(1GiB)")
    p.add_argument("--range-size", type=parse_size, default=parse_size("1MiB"), help="(1MiB)")
    p.add_argument("--ranges", type=int, default=256, help="ranges per pass (256)")
    p.add_argument("--readers", type=int, default=16, help="concurrent readers (16)")
    p.add_argument(
        "--block-sizes",
        type=_sizes,
        default=_sizes("4MiB,1MiB"),
        help="one gateway (empty cache) per block size; the first one is labelled `gateway` "
        "(4MiB,1MiB)",
    )


def _metrics(gw: Gateway) -> dict[str, float]:
    return {m: gw.metric(f"gateway_cache_{m}_total") for m in ("fills", "prefetches")}


def run(options: Options, args: argparse.Namespace) -> None:
    report = Report(scenario="ranges", columns=COLUMNS)
    size, span = args.object_size, args.range_size
    report.settings = {
        "object_size": size,
        "range_size": span,
        "ranges_per_pass": args.ranges,
        "readers": args.readers,
        "block_sizes": args.block_sizes,
        "gateway_args": list(options.gateway_args),
    }
    report.load_generator = (
        f"loadtest.httpclient: {options.processes} processes x asyncio/uvloop raw HTTP/1.1, "
        f"{args.readers} readers, presigned SigV4 URL with a Range header per request"
    )
    key = f"ranges/{fmt_size(size)}.bin"
    with Run("ranges", options) as r:
        origin, files = r.origin_with_large(key, size, PRIMER, report)
        client = r.client()

        def phase(
            path: str, label: str, base: str, target: str, pid: int | None, gw: Gateway | None
        ) -> Row:
            ranges = random_ranges(size, span, args.ranges, PASSES[label])
            jobs = [Job(target, rng) for rng in ranges]
            before, conns = origin.bytes_sent(), origin.requests()
            counters = _metrics(gw) if gw else {}
            watch = origin.watch(pid if gw is not None else None)
            tally, cpu = measure(
                client, base, jobs, args.readers, options.phase_timeout, pid, watch
            )
            row = row_of(tally, cpu, path=path)
            row["pass"] = label
            row["ranges/s"] = row.pop("req/s")
            row["served MB"] = tally.bytes / 1e6
            row["origin MB"] = (origin.bytes_sent() - before) / 1e6
            row["origin B / served B"] = row["origin MB"] / max(row["served MB"], 1e-9)
            if conns is not None:
                row["origin reqs"] = (origin.requests() or 0) - conns
            if gw is not None:
                row.update({m: v - counters[m] for m, v in _metrics(gw).items()})
            r.log(
                f"{path} {label}: {row['seconds']:.1f} s, {row['MB/s']:.0f} MB/s, "
                f"origin {row['origin MB']:.0f} MB for {row['served MB']:.0f} MB served"
            )
            return report.add(**row)

        def passes(path: str, base: str, target: str, pid: int, gw: Gateway | None = None) -> None:
            for label in PASSES:
                phase(path, label, base, target, pid, gw)

        passes("direct", origin.url, origin_targets(origin.url, [key])[0], origin.pid)
        for i, block in enumerate(args.block_sizes):
            name = "gateway" if i == 0 else f"gateway, {fmt_size(block)} blocks"
            extra = [*options.gateway_args, "--cache-block-size", str(block)]
            gw = start_gateway(
                r.cleanup, r.workdir, origin.url, options.metadata_ttl, extra, f"gateway{i}"
            )
            target, primer = gateway_targets(gw.url, [key, PRIMER])
            first = prime(client, gw.url, primer)
            r.log(f"{name}: primed, first byte of its first miss {first:.0f} ms")
            passes(name, gw.url, target, gw.pid, gw)
            gw.stop()  # its CPU and page cache go back to the next path
        if shutil.which("nginx"):
            nginx = start_nginx(r.cleanup, r.workdir, files, origin.url, options.nginx_workers)
            passes("nginx static", nginx.static_url, f"/{BUCKET}/{key}", nginx.pid)
        report.ratios = _ratios(report.rows)
        report.notes.append(
            "passes: cold = set A of random ranges (the gateway's cache empty), warm = set A "
            "again, new = another random set B; direct and nginx have no cache, their passes "
            "are the same reads; each gateway read a 4 KiB object 8 times before its cold pass "
            "(its first miss makes the store client)"
        )
        report.notes.append(
            "origin bytes: HTTP bytes (headers + bodies) the origin sent, counted where it "
            "leaves the WAN; origin reqs: requests sent to it (their heads, counted by the WAN "
            "proxy); fills, prefetches: the gateway's block fills kept and read-ahead fills "
            "started"
        )
        finish(r, report)


def _ratios(rows: list[Row]) -> dict[str, float]:
    by = {(row["path"], row["pass"]): row["MB/s"] for row in rows}
    ratios = {}
    for (path, label), value in by.items():
        if path.startswith("gateway"):
            ratios[f"{path} {label} / direct {label} (MB/s)"] = value / by[("direct", label)]
            if label == "warm" and ("nginx static", label) in by:
                ratios[f"{path} warm / nginx static (MB/s)"] = value / by[("nginx static", label)]
    return ratios
