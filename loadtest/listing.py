"""Scenario `list`: listing a prefix of N keys (ListObjectsV2, 1000 keys a page) through the
gateway and from the origin directly. Pages follow one another (each needs the previous
page's continuation token), so this measures per-page latency, not parallel throughput.
"""

from __future__ import annotations

import argparse
import html
import http.client
import re
import statistics
import time
from typing import Any
from urllib.parse import urlsplit

from loadtest.common import Options, Run, finish
from loadtest.data import gateway_client, origin_client, seed_objects
from loadtest.procs import CpuMeter
from loadtest.report import Report, Row
from loadtest.servers import BUCKET, ORIGIN_BUCKET, ORIGIN_PREFIX, start_gateway

SUMMARY = "ListObjectsV2 over a prefix of many keys, through the gateway and directly"
COLUMNS = [
    "path", "listing", "seconds", "keys/s", "pages", "p50 ms/page", "p99 ms/page",
    "server CPU", "machine CPU %", "errors",
]  # fmt: skip
_TOKEN = re.compile(rb"<NextContinuationToken>([^<]*)</NextContinuationToken>")
_KEY = re.compile(rb"<Key>")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--keys", type=int, default=100000, help="keys under the prefix (100000)")
    p.add_argument("--page-size", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=3, help="full listings per path (3)")


def list_all(
    base_url: str, client: Any, bucket: str, prefix: str, page_size: int, deadline: float
) -> tuple[int, list[float], int]:
    """List `prefix` to the end; returns (keys, per-page seconds, errors)."""
    parts = urlsplit(base_url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=120)
    keys, pages, errors = 0, [], 0
    token: str | None = None
    try:
        while time.monotonic() < deadline:
            params: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": page_size}
            if token:
                params["ContinuationToken"] = token
            # Signing takes ~0.1 ms, a page of 1000 keys tens of ms: presigning each page
            # as it comes costs the measurement nothing that matters.
            url = urlsplit(client.generate_presigned_url("list_objects_v2", Params=params))
            t0 = time.perf_counter()
            conn.request("GET", f"{url.path}?{url.query}")
            resp = conn.getresponse()
            body = resp.read()
            pages.append(time.perf_counter() - t0)
            if resp.status != 200:
                errors += 1
                break
            keys += len(_KEY.findall(body))
            m = _TOKEN.search(body)
            if not m:
                break
            token = html.unescape(m.group(1).decode())
    finally:
        conn.close()
    return keys, pages, errors


def run(options: Options, args: argparse.Namespace) -> None:
    report = Report(scenario="list", columns=COLUMNS)
    report.settings = {"keys": args.keys, "page_size": args.page_size, "repeats": args.repeats}
    report.load_generator = (
        "one sequential client (http.client, keep-alive), each page presigned (SigV4) "
        "with the previous page's continuation token"
    )
    with Run("list", options) as r:
        origin, shape = r.origin()
        names = [f"list/k{i:08d}" for i in range(args.keys)]
        r.log(f"seeding {args.keys} empty objects")
        seed_objects(origin.seed_url, names, 0, None, r.log)
        shape()
        report.wan = origin.description
        r.log(f"WAN: {origin.description}")
        gateway = start_gateway(
            r.cleanup, r.workdir, origin.url, options.metadata_ttl, list(options.gateway_args)
        )
        paths = [
            ("direct", origin.url, origin_client(origin.url), ORIGIN_BUCKET,
             f"{ORIGIN_PREFIX}/list/", origin.pid),
            ("gateway", gateway.url, gateway_client(gateway.url), BUCKET, "list/", gateway.pid),
        ]  # fmt: skip
        for i in range(1, args.repeats + 1):
            for name, base, client, bucket, prefix, pid in paths:
                meter = CpuMeter(pid)
                t0 = time.monotonic()
                deadline = t0 + options.phase_timeout
                keys, pages, errors = list_all(
                    base, client, bucket, prefix, args.page_size, deadline
                )
                seconds = time.monotonic() - t0
                cpu = meter.stop()
                if keys != args.keys:
                    errors += 1
                ms = sorted(1000 * p for p in pages)
                row = report.add(
                    path=name,
                    listing=i,
                    seconds=seconds,
                    pages=len(pages),
                    errors=errors,
                    **{
                        "keys/s": keys / seconds,
                        "p50 ms/page": statistics.median(ms),
                        "p99 ms/page": ms[min(len(ms) - 1, int(0.99 * len(ms)))],
                        "server CPU": cpu.server_cores,
                        "machine CPU %": cpu.machine_pct,
                        "keys": keys,
                    },
                )
                r.log(f"{name} listing {i}: {keys} keys in {seconds:.2f} s ({row['pages']} pages)")
        report.ratios = _ratios(report.rows)
        finish(r, report)


def _ratios(rows: list[Row]) -> dict[str, float]:
    def med(path: str) -> float:
        return float(statistics.median(row["seconds"] for row in rows if row["path"] == path))

    return {"gateway / direct (time per listing)": med("gateway") / med("direct")}
