"""Scenario `list`: listing a prefix of N keys (ListObjectsV2, 1000 keys a page) from the origin
directly, through the gateway's pass-through listing, and through the catalog (a second mount
of the same prefix with catalog=on, synced with `gateway sync` first, timed). Pages follow one
another (each needs the previous page's continuation token), so this measures per-page
latency, not parallel throughput.

Then HEAD throughput: `--heads` keys HEADed directly at the origin and through the catalog
(its mount at metadata_ttl 0, so that every HEAD asks the catalog, none the node's memory).
And with `--catalog-keys` (e.g. 1000000), a third mount whose catalog is filled straight in
the gateway's database with that many keys (seeding moto with a million keys and listing them
from it take hours): its listing shows whether the time per page stays flat at that size.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import http.client
import random
import re
import statistics
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from loadtest.common import CPU_COLUMNS, Options, Run, finish
from loadtest.data import gateway_client, origin_client, seed_objects
from loadtest.procs import CpuMeter
from loadtest.report import Report, Row
from loadtest.servers import (
    BIN,
    BUCKET,
    ORIGIN_BUCKET,
    ORIGIN_KEY,
    ORIGIN_PREFIX,
    ORIGIN_SECRET,
    Gateway,
    base_env,
    start_gateway,
)

# rclone (the default origin) lists a folder whole for every page: ~7.7 us of its CPU per key
# of the folder, ~0.8 s a page at 100,000 keys; SeaweedFS's page costs a page.
ORIGIN = "seaweedfs"
CATALOG = "loadtest-catalog"  # the same prefix, mounted with catalog=on
BIG = "loadtest-big"  # a catalog filled in the database, --catalog-keys keys

SUMMARY = "ListObjectsV2 over a prefix of many keys, through the gateway and directly"
COLUMNS = [
    "path", "listing", "seconds", "keys/s", "pages", "p50 ms/page", "p99 ms/page",
    "server CPU", "machine CPU %", *CPU_COLUMNS, "errors",
]  # fmt: skip
_TOKEN = re.compile(rb"<NextContinuationToken>([^<]*)</NextContinuationToken>")
_KEY = re.compile(rb"<Key>")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--keys", type=int, default=100000, help="keys under the prefix (100000)")
    p.add_argument("--page-size", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=3, help="full listings per path (3)")
    p.add_argument("--heads", type=int, default=1000, help="HEADs per path (1000; 0: none)")
    p.add_argument(
        "--catalog-keys", type=int, default=0,
        help="keys of a catalog filled in the database and listed (e.g. 1000000; 0: none)",
    )  # fmt: skip


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
        _mount(gateway, CATALOG, origin.url, "metadata_ttl=0", "catalog=on")
        t0 = time.monotonic()
        out = _cli(gateway, "sync", f"{CATALOG}/list/", "--quiet")
        crawl = time.monotonic() - t0
        r.log(f"{out.strip()} in {crawl:.1f} s")
        report.notes.append(f"gateway sync of {args.keys} keys: {crawl:.1f} s")
        gclient = gateway_client(gateway.url)
        _wait_for_catalog(gclient, CATALOG, "list/")
        paths = [
            ("direct", origin.url, origin_client(origin.url), ORIGIN_BUCKET,
             f"{ORIGIN_PREFIX}/list/", origin.pid),
            ("gateway", gateway.url, gclient, BUCKET, "list/", gateway.pid),
            ("catalog", gateway.url, gclient, CATALOG, "list/", gateway.pid),
        ]  # fmt: skip
        if args.catalog_keys:
            r.log(f"filling a catalog of {args.catalog_keys} keys in the database")
            _fill_big_catalog(gateway, origin.url, args.catalog_keys, r.log)
            _wait_for_catalog(gclient, BIG, "big/")
            paths.append(("catalog-big", gateway.url, gclient, BIG, "big/", gateway.pid))
        for i in range(1, args.repeats + 1):
            for name, base, client, bucket, prefix, pid in paths:
                meter = CpuMeter(pid, origin.watch(pid if name != "direct" else None))
                t0 = time.monotonic()
                deadline = t0 + options.phase_timeout
                keys, pages, errors = list_all(
                    base, client, bucket, prefix, args.page_size, deadline
                )
                seconds = time.monotonic() - t0
                cpu = meter.stop()
                if keys != (args.catalog_keys if name == "catalog-big" else args.keys):
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
                        **cpu.per_request(len(pages)),
                        "keys": keys,
                    },
                )
                r.log(f"{name} listing {i}: {keys} keys in {seconds:.2f} s ({row['pages']} pages)")
        head_rates: dict[str, float] = {}
        if args.heads:
            chosen = random.Random(7).sample(names, min(args.heads, len(names)))
            r.log(f"HEAD of {len(chosen)} keys: the catalog learns them fully (one pass)")
            _heads(gateway.url, gclient, CATALOG, chosen, 0)
            heads = [
                ("direct", origin.url, origin_client(origin.url), ORIGIN_BUCKET,
                 [f"{ORIGIN_PREFIX}/{k}" for k in chosen]),
                ("catalog", gateway.url, gclient, CATALOG, chosen),
            ]  # fmt: skip
            for name, base, client, bucket, keys_ in heads:
                seconds, ms = _heads(base, client, bucket, keys_, options.phase_timeout)
                rate, p50 = len(ms) / seconds, statistics.median(ms)
                head_rates[name] = rate
                report.notes.append(f"HEAD {name}: {len(ms)} in {seconds:.2f} s, {rate:.0f}/s, "
                                    f"p50 {p50:.2f} ms")  # fmt: skip
                r.log(report.notes[-1])
        report.ratios = _ratios(report.rows)
        if head_rates:
            report.ratios["HEAD/s catalog / direct"] = head_rates["catalog"] / head_rates["direct"]
        finish(r, report)


def _cli(gateway: Gateway, *args: str) -> str:
    cmd = [str(BIN / "gateway"), *args, "--data-dir", str(gateway.data_dir)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=base_env(), timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"gateway {args[0]} failed: {out.stderr or out.stdout}")
    return out.stdout


def _mount(gateway: Gateway, bucket: str, origin_url: str, *options: str) -> None:
    """Another mount of the origin's prefix on the running gateway."""
    opts = [f"endpoint_url={origin_url}", f"access_key={ORIGIN_KEY}"]
    opts += [f"secret_key={ORIGIN_SECRET}", *options]
    args = [a for o in opts for a in ("-o", o)]
    _cli(gateway, "mount", "add", bucket, f"s3://{ORIGIN_BUCKET}/{ORIGIN_PREFIX}", *args)


def _wait_for_catalog(client: Any, bucket: str, prefix: str, timeout: float = 60.0) -> None:
    """Until the node answers the mount's listing from its catalog: its continuation tokens
    are the catalog's own."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
            if got.get("NextContinuationToken", "").startswith("c1."):
                return
        except Exception:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise RuntimeError(f"{bucket}/{prefix} not served from the catalog")
        time.sleep(0.2)


def _heads(
    base_url: str, client: Any, bucket: str, keys: list[str], timeout: float
) -> tuple[float, list[float]]:
    """HEAD each key in turn over one connection; (seconds, per-request ms)."""
    parts = urlsplit(base_url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=60)
    urls = [
        urlsplit(client.generate_presigned_url("head_object", Params={"Bucket": bucket, "Key": k}))
        for k in keys
    ]
    ms: list[float] = []
    t0 = time.monotonic()
    try:
        for url in urls:
            t = time.perf_counter()
            conn.request("HEAD", f"{url.path}?{url.query}")
            resp = conn.getresponse()
            resp.read()
            ms.append(1000 * (time.perf_counter() - t))
            if resp.status != 200:
                raise RuntimeError(f"HEAD {url.path}: {resp.status}")
            if timeout and time.monotonic() - t0 > timeout:
                break
    finally:
        conn.close()
    return time.monotonic() - t0, ms


def _fill_big_catalog(gateway: Gateway, origin_url: str, count: int, log: Any) -> None:
    """A mount whose catalog holds `count` keys under big/, written straight into the
    gateway's database (the keys need not exist at the origin: listings never ask it)."""
    _mount(gateway, BIG, origin_url, "catalog=on")
    asyncio.run(_insert_rows(gateway.data_dir / "gateway.db", count, log))


async def _insert_rows(database: Path, count: int, log: Any) -> None:
    import sqlalchemy as sa

    from gateway.meta.catalog import catalog_syncs
    from gateway.meta.engine import create_engine
    from gateway.meta.tables import mounts
    from gateway.meta.versions import object_versions, version_row
    from gateway.stores import ObjectInfo

    engine = create_engine(f"sqlite:///{database}")
    now = datetime.now(UTC)
    try:
        async with engine.begin() as conn:
            query = sa.select(mounts.c.id).where(mounts.c.bucket == BIG)
            mount_id = (await conn.execute(query)).scalar_one()
        batch: list[dict[str, Any]] = []
        for i in range(count):
            info = ObjectInfo(f"big/k{i:08d}", 0, '"d41d8cd98f00b204e9800998ecf8427e"', now)
            batch.append(version_row(mount_id, info, False, now))
            if len(batch) == 10_000 or i == count - 1:
                async with engine.begin() as conn:
                    await conn.execute(sa.insert(object_versions), batch)
                batch = []
                if (i + 1) % 200_000 == 0:
                    log(f"  {i + 1} rows")
        async with engine.begin() as conn:
            row = {"mount_id": mount_id, "prefix": "big/", "synced_at": now}
            await conn.execute(sa.insert(catalog_syncs).values(**row))
    finally:
        await engine.dispose()


def _ratios(rows: list[Row]) -> dict[str, float]:
    def med(path: str) -> float:
        return float(statistics.median(row["seconds"] for row in rows if row["path"] == path))

    ratios = {
        "gateway / direct (time per listing)": med("gateway") / med("direct"),
        "direct / catalog (speed-up of a listing)": med("direct") / med("catalog"),
        "gateway / catalog (speed-up over the pass-through)": med("gateway") / med("catalog"),
    }
    if any(row["path"] == "catalog-big" for row in rows):

        def page(path: str) -> float:
            return float(
                statistics.median(row["p50 ms/page"] for row in rows if row["path"] == path)
            )

        ratios["ms/page at --catalog-keys / at --keys (flat: ~1)"] = page("catalog-big") / page(
            "catalog"
        )
    return ratios
