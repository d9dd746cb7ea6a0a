"""Scenario `epochs`: a training job's reads. Many small objects, every one read once per
epoch in a new shuffled order by K concurrent readers, through each path:

- direct: the origin itself, behind the WAN;
- gateway: epoch 1 cold (every read a miss), then warm;
- local: the same bytes as files on local disk, read by the same client (the limit);
- nginx static: the same files over HTTP (what any HTTP server can do here), if nginx exists.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics

from loadtest.common import Options, Run, finish, measure, row_of
from loadtest.data import gateway_targets, origin_targets, seed_objects
from loadtest.httpclient import Job
from loadtest.report import Report, Row
from loadtest.servers import BUCKET, start_gateway, start_nginx
from loadtest.sizes import fmt_size, parse_size

SUMMARY = (
    "small objects read once per epoch in shuffled order: direct, gateway cold/warm, local files"
)
COLUMNS = [
    "path", "epoch", "seconds", "objects/s", "MB/s", "p50 ms", "p99 ms",
    "server CPU", "machine CPU %", "origin reqs", "errors", "x-cache",
]  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--objects", type=int, default=20000, help="objects in the data set (20000)")
    p.add_argument("--object-size", type=parse_size, default=parse_size("100KiB"))
    p.add_argument("--readers", type=int, default=16, help="concurrent readers K (16)")
    p.add_argument("--epochs", type=int, default=3)


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
        if nginx is not None:
            paths.append(
                ("nginx static", nginx.static_url, [f"/{BUCKET}/{k}" for k in keys], nginx.pid)
            )
        client = r.client()
        for name, base_url, targets, pid in paths:
            for epoch in range(1, args.epochs + 1):
                order = list(range(len(keys)))
                random.Random(epoch).shuffle(order)  # the same order for every path
                jobs = [Job(targets[i]) for i in order]
                conns = origin.connections()
                tally, cpu = measure(
                    client, base_url, jobs, args.readers, options.phase_timeout, pid
                )
                row = report.add(**_epoch_row(name, epoch, row_of(tally, cpu)))
                if conns is not None:
                    row["origin reqs"] = (origin.connections() or 0) - conns
                r.log(
                    f"{name} epoch {epoch}: {row['seconds']:.1f} s, {row['objects/s']:.0f} obj/s, "
                    f"{row['MB/s']:.0f} MB/s, server CPU {cpu.server_cores}"
                )
        report.ratios = _ratios(report.rows)
        report.notes.append(
            "server CPU: cores used by the server process (gateway, moto for direct, nginx); "
            "local has no server (the client reads files; see machine CPU)"
        )
        report.notes.append(
            "origin reqs: connections the origin accepted (moto closes each after one answer)"
        )
        finish(r, report)


def _median(rows: list[Row], path: str, epochs: range | None = None) -> float:
    values = [
        row["objects/s"]
        for row in rows
        if row["path"] == path and (epochs is None or row["epoch"] in epochs)
    ]
    return statistics.median(values) if values else float("nan")


def _ratios(rows: list[Row]) -> dict[str, float]:
    warm = _median(rows, "gateway", range(2, 10**6))
    cold = _median(rows, "gateway", range(1, 2))
    ratios = {
        "gateway warm / local (objects/s)": warm / _median(rows, "local"),
        "gateway cold / direct (objects/s)": cold / _median(rows, "direct"),
        "gateway warm / direct (objects/s)": warm / _median(rows, "direct"),
    }
    if any(row["path"] == "nginx static" for row in rows):
        ratios["gateway warm / nginx static (objects/s)"] = warm / _median(rows, "nginx static")
    return ratios
