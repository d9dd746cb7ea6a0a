"""Scenario `sequential`: one large object read whole, start to end, by one client: a model
checkpoint or a shard loaded at start-up.

- direct: a GET of the object from the origin itself, through the same WAN (twice);
- gateway: cold (empty cache: the first block comes with the metadata, the next ones by
  ranged GETs, `--readahead-blocks` of them ahead of the reader), then warm (`--warm-reads`
  reads, median); once per `--readahead` value, each on a fresh gateway;
- gateway with `--workers` worker processes: the same, and `--readers-at-once` clients
  reading the object together, cold then warm (the workers share one page store);
- nginx static: the same file from local disk (sendfile): the client's own ceiling.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time

from loadtest.common import CPU_COLUMNS, Options, Run, finish, measure, prime, row_of
from loadtest.data import gateway_targets, origin_targets
from loadtest.httpclient import Job, LoadClient
from loadtest.report import Report, Row
from loadtest.servers import BUCKET, Gateway, start_gateway, start_nginx
from loadtest.sizes import fmt_size, parse_size
from loadtest.wan import Origin

PRIMER = "sequential/primer.bin"
SUMMARY = "a large object read whole: gateway cold and warm against the origin direct"
COLUMNS = [
    "path", "pass", "seconds", "MB/s", "first byte ms", "server CPU", "machine CPU %",
    *CPU_COLUMNS, "origin reqs", "origin MB", "origin B / served B", "fills", "prefetches",
    "errors", "x-cache",
]  # fmt: skip


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--object-size", type=parse_size, default=parse_size("1GiB"), help="(1GiB)")
    p.add_argument(
        "--readahead",
        type=_ints,
        default=_ints("4,0"),
        help="one gateway per --readahead-blocks value; the first is labelled `gateway` (4,0)",
    )
    p.add_argument(
        "--workers", type=_ints, default=_ints("2"), help="gateways with N worker processes (2)"
    )
    p.add_argument(
        "--readers-at-once",
        type=int,
        default=2,
        help="on one more --workers gateway, this many clients read the object together (2; "
        "0: not)",
    )
    p.add_argument("--warm-reads", type=int, default=3, help="warm reads, median kept (3)")
    p.add_argument("--direct-reads", type=int, default=2, help="reads from the origin (2)")


class _Phases:
    """Measured whole reads of one object, each a row with the origin's part in it."""

    def __init__(
        self, run: Run, report: Report, client: LoadClient, origin: Origin, timeout: float
    ) -> None:
        self.run, self.report, self.client = run, report, client
        self.origin, self.timeout = origin, timeout
        self.several_workers = False  # the gateway being read has more than one worker

    def read(
        self,
        path: str,
        label: str,
        base: str,
        target: str,
        pid: int,
        gw: Gateway | None = None,
        readers: int = 1,
    ) -> Row:
        before, conns = self.origin.bytes_sent(), self.origin.requests()
        if gw is not None and self.several_workers:
            time.sleep(1.5)  # what the workers did before (priming) published first
        counters = _metrics(gw) if gw else {}
        jobs = [Job(target)] * readers
        watch = self.origin.watch(pid if path.startswith("gateway") else None)
        tally, cpu = measure(self.client, base, jobs, readers, self.timeout, pid, watch)
        row = row_of(tally, cpu, path=path)
        row["pass"] = label
        del row["req/s"], row["p50 ms"], row["p99 ms"]
        row["first byte ms"] = tally.percentile_ms(50, first_byte=True)
        row["served MB"] = tally.bytes / 1e6
        row["origin MB"] = (self.origin.bytes_sent() - before) / 1e6
        row["origin B / served B"] = row["origin MB"] / max(row["served MB"], 1e-9)
        if conns is not None:
            row["origin reqs"] = (self.origin.requests() or 0) - conns
        if gw is not None:
            if self.several_workers:
                time.sleep(1.5)  # every worker's cache figures published (once a second)
            row.update({m: v - counters[m] for m, v in _metrics(gw).items()})
        self.run.log(
            f"{path} {label}: {row['seconds']:.2f} s, {row['MB/s']:.0f} MB/s, first byte "
            f"{row['first byte ms']:.0f} ms, origin {row['origin MB']:.0f} MB, "
            f"server CPU {cpu.server_cores}"
        )
        return row

    def warm(self, path: str, base: str, target: str, pid: int, reads: int, n: int = 1) -> Row:
        """`reads` warm reads; the median one is the row, with every MB/s beside it."""
        rows = [self.read(path, "warm", base, target, pid, readers=n) for _ in range(reads)]
        mid = sorted(rows, key=lambda x: x["MB/s"])[len(rows) // 2]
        mid["all MB/s"] = [round(x["MB/s"]) for x in rows]
        return self.report.add(**mid)


def _variants(args: argparse.Namespace) -> list[tuple[str, list[str], int, int]]:
    """The gateways to read through: (name, `gateway serve` arguments, readers, workers)."""
    variants = []
    for i, ahead in enumerate(args.readahead):
        name = "gateway" if i == 0 else f"gateway, readahead {ahead}"
        variants.append((name, ["--readahead-blocks", str(ahead)], 1, 1))
    for w in args.workers:
        variants.append((f"gateway, {w} workers", ["--workers", str(w)], 1, w))
    if args.workers and args.readers_at_once > 1:
        w, n = args.workers[0], args.readers_at_once
        variants.append((f"gateway, {w} workers, {n} readers", ["--workers", str(w)], n, w))
    return variants


def _metrics(gw: Gateway) -> dict[str, float]:
    return {m: gw.metric(f"gateway_cache_{m}_total") for m in ("fills", "prefetches")}


def run(options: Options, args: argparse.Namespace) -> None:
    size = args.object_size
    report = Report(scenario="sequential", columns=COLUMNS)
    report.settings = {
        "object_size": size,
        "readahead": args.readahead,
        "workers": args.workers,
        "readers_at_once": args.readers_at_once,
        "warm_reads": args.warm_reads,
        "gateway_args": list(options.gateway_args),
    }
    report.load_generator = (
        "loadtest.httpclient: one asyncio/uvloop raw HTTP/1.1 reader per client process, "
        "presigned SigV4 URL, the body read in 1 MiB pieces and dropped"
    )
    key = f"sequential/{fmt_size(size)}.bin"
    with Run("sequential", options) as r:
        origin, files = r.origin_with_large(key, size, PRIMER, report)
        phases = _Phases(r, report, r.client(), origin, options.phase_timeout)
        direct = origin_targets(origin.url, [key])[0]
        for i in range(1, args.direct_reads + 1):
            report.add(**phases.read("direct", f"read {i}", origin.url, direct, origin.pid))

        firsts: list[int] = []
        for i, (name, extra, n, workers) in enumerate(_variants(args)):
            gw = start_gateway(
                r.cleanup,
                r.workdir,
                origin.url,
                options.metadata_ttl,
                [*options.gateway_args, *extra],
                f"gateway{i}",
            )
            target, primer = gateway_targets(gw.url, [key, PRIMER])
            first = prime(phases.client, gw.url, primer)
            r.log(f"{name}: primed, first byte of its first miss {first:.0f} ms")
            firsts.append(round(first))
            # /metrics answer for every worker; theirs are published once a second.
            phases.several_workers = workers > 1
            report.add(**phases.read(name, "cold", gw.url, target, gw.pid, gw, readers=n))
            phases.warm(name, gw.url, target, gw.pid, args.warm_reads, n)
            gw.stop()  # its CPU and memory go back to the next variant
        if shutil.which("nginx"):
            nginx = start_nginx(r.cleanup, r.workdir, files, origin.url, options.nginx_workers)
            phases.warm("nginx static", nginx.static_url, f"/{BUCKET}/{key}", nginx.pid, 3)
        report.ratios = _ratios(report.rows)
        report.notes.append(
            "every gateway was primed by 8 reads of a 4 KiB object at once before its cold "
            f"read (its first miss makes the store client); first byte of that: {firsts} ms"
        )
        report.notes.append(
            "MB/s: bytes served / wall time of the whole read (with N readers: all N objects' "
            "bytes); first byte: until the response's head arrived (median); warm: median of "
            f"{args.warm_reads} reads"
        )
        report.notes.append(
            "origin reqs: requests sent to the origin (their heads, counted by the WAN proxy); "
            "fills / prefetches: blocks the gateway fetched and kept / fills started by "
            "read-ahead (from its /metrics, all workers together)"
        )
        finish(r, report)


def _ratios(rows: list[Row]) -> dict[str, float]:
    direct = statistics.median(row["MB/s"] for row in rows if row["path"] == "direct")
    by = {(row["path"], row["pass"]): row["MB/s"] for row in rows}
    ratios = {}
    for (path, label), value in by.items():
        if path.startswith("gateway"):
            ratios[f"{path} {label} / direct (MB/s)"] = value / direct
    for (path, label), value in by.items():
        if path.startswith("gateway, readahead") and label == "cold":
            ratios[f"{path} cold / gateway cold (MB/s)"] = value / by[("gateway", "cold")]
    if ("nginx static", "warm") in by:
        ratios["gateway warm / nginx static (MB/s)"] = (
            by[("gateway", "warm")] / by[("nginx static", "warm")]
        )
    return ratios
