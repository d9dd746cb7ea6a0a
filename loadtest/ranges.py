"""Scenario `ranges`: random ranged reads (1 MiB) over one large object, the way columnar
readers and s3torchconnector read, cold then warm, against the same ranges read directly from
the origin; with the bytes the origin sent per byte served to the client.

Two gateways run side by side: one with its defaults (an object over `cache_max_object`,
64 MiB, is never cached: every range goes to the origin) and one whose `cache_max_object`
admits the object (the first ranged miss fills the whole object in the background).
"""

from __future__ import annotations

import argparse
import random
import time

from loadtest.common import Options, Run, finish, measure, row_of
from loadtest.data import gateway_targets, origin_targets, seed_file, write_random_file
from loadtest.httpclient import Job
from loadtest.report import Report, Row
from loadtest.servers import Gateway, start_gateway
from loadtest.sizes import fmt_size, parse_size

SUMMARY = "random 1 MiB ranges of a large object, cold and warm, and origin bytes per byte served"
COLUMNS = [
    "path", "pass", "seconds", "ranges/s", "MB/s", "p50 ms", "p99 ms", "server CPU",
    "origin MB", "origin B / served B", "errors", "x-cache",
]  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--object-size", type=parse_size, default=parse_size("256MiB"))
    p.add_argument("--range-size", type=parse_size, default=parse_size("1MiB"))
    p.add_argument("--ranges", type=int, default=128, help="ranges per pass (128)")
    p.add_argument("--readers", type=int, default=16, help="concurrent readers (16)")
    p.add_argument(
        "--no-fill-gateway",
        action="store_true",
        help="skip the second gateway (the one whose cache_max_object admits the object)",
    )


def _jobs(target: str, size: int, span: int, count: int, seed: int) -> list[Job]:
    rng = random.Random(seed)
    starts = [rng.randrange(0, size - span + 1) for _ in range(count)]
    return [Job(target, f"bytes={s}-{s + span - 1}") for s in starts]


def _wait_filled(gateway: Gateway, size: int, timeout: float) -> float:
    """Seconds until the gateway's disk cache holds the whole object (bounded by `timeout`)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if gateway.metric("gateway_cache_bytes") >= size:
            return time.monotonic() - t0
        time.sleep(0.2)
    return float("nan")


def run(options: Options, args: argparse.Namespace) -> None:
    report = Report(scenario="ranges", columns=COLUMNS)
    size, span = args.object_size, args.range_size
    report.settings = {
        "object_size": size,
        "range_size": span,
        "ranges_per_pass": args.ranges,
        "readers": args.readers,
        "gateway_args": list(options.gateway_args),
    }
    report.load_generator = (
        f"loadtest.httpclient: {options.processes} processes x asyncio/uvloop raw HTTP/1.1, "
        f"{args.readers} readers, presigned SigV4 URL with a Range header per request"
    )
    key = f"ranges/{fmt_size(size)}.bin"
    with Run("ranges", options) as r:
        origin, shape = r.origin()
        local = r.workdir / "object.bin"
        r.log(f"seeding one {fmt_size(size)} object")
        write_random_file(local, size)
        seed_file(origin.seed_url, key, local)
        local.unlink()
        shape()
        report.wan = origin.description
        r.log(f"WAN: {origin.description}")
        gateways = [("gateway (defaults)", start_gateway(
            r.cleanup, r.workdir, origin.url, options.metadata_ttl, list(options.gateway_args)
        ))]  # fmt: skip
        if not args.no_fill_gateway:
            extra = [*options.gateway_args, "--cache-max-object", str(size)]
            extra += ["--cache-capacity", str(max(size * 2, 10 << 30))]
            name = f"gateway (cache_max_object={fmt_size(size)})"
            gateways.append(
                (name, start_gateway(r.cleanup, r.workdir, origin.url, "-1", extra, "gateway2"))
            )
        client = r.client()
        passes = {"cold": 1, "warm": 2}  # a new random set of ranges for the warm pass

        def phase(path: str, label: str, base: str, target: str, pid: int | None) -> Row:
            jobs = _jobs(target, size, span, args.ranges, passes[label])
            before = origin.bytes_sent()
            tally, cpu = measure(client, base, jobs, args.readers, options.phase_timeout, pid)
            row = row_of(tally, cpu, path=path)
            row["pass"] = label
            row["ranges/s"] = row.pop("req/s")
            row["served MB"] = tally.bytes / 1e6
            row["origin MB"] = (origin.bytes_sent() - before) / 1e6
            row["origin B / served B"] = row["origin MB"] / max(row["served MB"], 1e-9)
            r.log(
                f"{path} {label}: {row['seconds']:.1f} s, {row['MB/s']:.0f} MB/s, "
                f"origin {row['origin MB']:.0f} MB for {tally.bytes / 1e6:.0f} MB served"
            )
            return report.add(**row)

        direct = origin_targets(origin.url, [key])[0]
        for label in passes:
            phase("direct", label, origin.url, direct, origin.pid)
        for name, gw in gateways:
            target = gateway_targets(gw.url, [key])[0]
            before = origin.bytes_sent()
            cold = phase(name, "cold", gw.url, target, gw.pid)
            if gw.data_dir.name == "gateway2":
                filled = _wait_filled(gw, size, options.phase_timeout)
                # The background fill goes on after the cold pass: charge it to that pass.
                cold["origin MB"] = (origin.bytes_sent() - before) / 1e6
                cold["origin B / served B"] = cold["origin MB"] / max(cold["served MB"], 1e-9)
                report.notes.append(f"{name}: whole object in the cache {filled:.1f} s after cold")
                r.log(f"{name}: filled {filled:.1f} s after the cold pass")
            phase(name, "warm", gw.url, target, gw.pid)
        report.ratios = _ratios(report.rows)
        report.notes.append(
            "origin bytes: HTTP bytes (headers + bodies) the origin sent, counted where it "
            "leaves the WAN; 1 MiB ranges start at random, unaligned offsets"
        )
        finish(r, report)


def _ratios(rows: list[Row]) -> dict[str, float]:
    by = {(row["path"], row["pass"]): row["MB/s"] for row in rows}
    ratios = {}
    for (path, label), value in by.items():
        if path != "direct":
            ratios[f"{path} {label} / direct (MB/s)"] = value / by[("direct", label)]
    return ratios
