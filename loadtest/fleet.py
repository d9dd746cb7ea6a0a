"""Scenario `fleet`: what running as a fleet costs per request. Fleets of 1, 2 and 3 nodes on one
PostgreSQL database: cache-hit throughput with wrk spread over every node, the cost of one
forwarding hop (objects read through their owner, then through a peer that forwards to it),
and epochs of small objects, cold and warm, read through all nodes.

Every node, wrk and the load client share this machine's cores: aggregate throughput cannot
scale here. The figures are the fleet's cost per request, not how a real fleet scales.
Needs wrk, psql and a PostgreSQL server on loopback (`--postgres`; a database is made for the
run and dropped after). ~5 minutes with the defaults (4m24 and 4m52 on a busy 2-core machine;
most of it the 42 wrk runs of 5 s: 18 of throughput, 24 of the hop at 2 nodes). Load: wrk
with loadtest/rotate.lua (thread i on node i % N) and loadtest.httpclient. Also runnable alone:
`python -m loadtest.fleet --help`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loadtest.common import Options, Run, prime
from loadtest.data import gateway_targets, seed_objects
from loadtest.httpclient import CLIENT, Job, LoadClient, Tally
from loadtest.procs import CpuMeter, cpu_seconds, free_port, machine_busy_seconds, wait_http
from loadtest.procs import run as run_cmd
from loadtest.report import Report, Row, format_table
from loadtest.servers import (
    ACCESS_KEY,
    BIN,
    BUCKET,
    ORIGIN_BUCKET,
    ORIGIN_KEY,
    ORIGIN_PREFIX,
    ORIGIN_SECRET,
    SECRET_KEY,
    base_env,
)
from loadtest.sizes import fmt_size, parse_size
from loadtest.wan import Origin
from loadtest.wrk import WrkCounts, write_targets, wrk

IDLE_SECONDS = 3.0  # the nodes' idle CPU, measured before the routed epochs
SUMMARY = "fleets of 1-3 nodes: hit req/s spread over nodes, cost of a forwarding hop, epochs"
_CPU = ["CPU per node", "server CPU", "CPU us/req", "machine CPU %"]
_LAT = ["p50 ms", "p99 ms"]
COLUMNS = {
    "throughput": ["size", "nodes", "conns", "req/s", "MB/s", *_LAT, *_CPU, "errors", "vs 1 node"],
    "hop": ["size", "path", "conns", "req/s", "MB/s", *_LAT, *_CPU, "errors"],
    "epochs": ["nodes", "epoch", "objects/s", "MB/s", *_LAT, *_CPU, "busy us/req",
               "origin us/req", "WAN proxy us/req", "origin reqs", "errors", "x-cache"],
}  # fmt: skip


def _sizes(text: str) -> list[int]:
    return [parse_size(s) for s in text.split(",") if s.strip()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=3, help="largest fleet; fleets 1..N (3)")
    p.add_argument("--sizes", type=_sizes, default=_sizes("4KiB,1MiB"), help="(4KiB,1MiB)")
    p.add_argument("--objects", type=int, default=64, help="objects per size (64)")
    p.add_argument(
        "--connections", type=int, default=48, help="wrk connections in all, over the nodes (48)"
    )
    p.add_argument("--hop-connections", default="1,16", help="for the hop rows (1,16)")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run (5)")
    p.add_argument("--repeats", type=int, default=3, help="runs per figure; median kept (3)")
    p.add_argument(
        "--epoch-objects", type=int, default=500, help="objects per fleet's epochs (500; 0: none)"
    )
    p.add_argument("--epoch-object-size", type=parse_size, default=parse_size("100KiB"))
    p.add_argument("--readers", type=int, default=16, help="epoch readers in all (16)")
    p.add_argument(
        "--no-client", dest="client", action="store_false",
        help="skip the warm epochs of fleets of 2+ nodes read by each key's owner and by the "
        "gateway's client library routing each read to the owner",
    )  # fmt: skip
    p.add_argument(
        "--postgres",
        default="postgresql://postgres@127.0.0.1:5432",
        help="PostgreSQL server (no database): a database is made for the run and dropped",
    )


# -- the fleet -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Node:
    name: str
    url: str
    pid: int

    @property
    def hostport(self) -> str:
        return self.url.removeprefix("http://")


class _Fleet:
    """Nodes on one fresh database, started one at a time; all stopped at cleanup."""

    def __init__(self, r: Run, postgres: str, origin_url: str, metadata_ttl: str) -> None:
        from cryptography.fernet import Fernet

        self.run = r
        self.nodes: list[_Node] = []
        self.database = f"loadtest_fleet_{os.getpid()}"
        self._postgres = postgres.rstrip("/")
        _drop_stale_databases(self._postgres)
        self._sql(f'CREATE DATABASE "{self.database}"')
        r.cleanup.push(f"drop database {self.database}", self._drop)
        admin = r.workdir / "admin"
        admin.mkdir()
        self.env = {
            **base_env(),
            "GATEWAY_DATABASE_URL": f"{self._postgres}/{self.database}",
            "GATEWAY_ENCRYPTION_KEY": Fernet.generate_key().decode(),
            "GATEWAY_FLEET_SECRET": os.urandom(16).hex(),
            "GATEWAY_DATA_DIR": str(admin),  # of the admin commands; each node has its own
        }
        self._gateway(
            "mount", "add", BUCKET, f"s3://{ORIGIN_BUCKET}/{ORIGIN_PREFIX}",
            "-o", f"endpoint_url={origin_url}", "-o", f"access_key={ORIGIN_KEY}",
            "-o", f"secret_key={ORIGIN_SECRET}", "-o", f"metadata_ttl={metadata_ttl}",
        )  # fmt: skip

    def _sql(self, statement: str) -> None:
        database = f"{self._postgres}/postgres"
        run_cmd(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", database, "-c", statement])

    def _drop(self) -> None:
        self._sql(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')

    def _gateway(self, *args: str) -> str:
        cmd = [str(BIN / "gateway"), *args]
        out = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"gateway {args[0]} failed: {out.stderr or out.stdout}")
        return out.stdout

    def add_node(self, extra_args: list[str]) -> _Node:
        """Start one more node and wait until the database lists every node as live."""
        name = f"node{len(self.nodes) + 1}"
        data_dir = self.run.workdir / name
        data_dir.mkdir()
        port = free_port()
        internal = free_port()
        while internal == port:
            internal = free_port()
        cmd = [
            str(BIN / "gateway"), "serve", "--host", "127.0.0.1", "--port", str(port),
            "--internal-port", str(internal), "--node-id", name, "--data-dir", str(data_dir),
            "--admin-access-key", ACCESS_KEY, "--admin-secret-key", SECRET_KEY, *extra_args,
        ]  # fmt: skip
        env = {**self.env, "GATEWAY_DATA_DIR": str(data_dir)}
        proc = self.run.cleanup.spawn(name, cmd, self.run.workdir / f"{name}.log", env)
        node = _Node(name, f"http://127.0.0.1:{port}", proc.pid)
        wait_http(node.url + "/healthz", proc, timeout=60)
        self.nodes.append(node)
        self._wait_live()
        return node

    def _wait_live(self, timeout: float = 30.0) -> None:
        want = {n.name for n in self.nodes}
        deadline = time.monotonic() + timeout
        while True:
            rows = json.loads(self._gateway("status", "--json"))
            live = {row["id"] for row in rows if row["live"]}
            if want <= live:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"nodes not live after {timeout:g} s: {rows}")
            time.sleep(0.2)


def _drop_stale_databases(postgres: str) -> None:
    """Databases of earlier runs that died before their cleanup (their PID is gone)."""
    query = "SELECT datname FROM pg_database WHERE datname LIKE 'loadtest_fleet_%'"
    out = run_cmd(["psql", "-X", "-At", f"{postgres}/postgres", "-c", query])
    for name in out.stdout.split():
        pid = name.rsplit("_", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            drop = f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'
            run_cmd(["psql", "-X", "-q", f"{postgres}/postgres", "-c", drop])


# -- measuring -----------------------------------------------------------------------------


class _Meter:
    """CPU of each node (cores) and of the machine (%) over one measurement."""

    def __init__(self, nodes: list[_Node]) -> None:
        self._pids = [n.pid for n in nodes]
        self._t0 = time.monotonic()
        self._cpu0 = [cpu_seconds(p) for p in self._pids]
        self._busy0 = machine_busy_seconds()[0]

    def stop(self) -> tuple[list[float], float]:
        wall = max(time.monotonic() - self._t0, 1e-9)
        cores = [(cpu_seconds(p) - c) / wall for p, c in zip(self._pids, self._cpu0, strict=True)]
        busy = machine_busy_seconds()[0] - self._busy0
        return cores, min(100.0, 100 * busy / (wall * (os.cpu_count() or 1)))


@dataclass(frozen=True, slots=True)
class _Result(WrkCounts):
    """A run over the fleet, with the CPU of every metered node meanwhile."""

    cores: list[float]  # per metered node
    machine_pct: float


def _cpu_cells(cores: list[float], machine_pct: float, rps: float) -> Row:
    return {
        "CPU per node": "+".join(f"{c:.2f}" for c in cores),
        "server CPU": sum(cores),
        "CPU us/req": sum(cores) / rps * 1e6 if rps else float("nan"),
        "machine CPU %": round(machine_pct, 1),
    }


def _wrk(
    workdir: Path,
    to: list[_Node],
    targets: list[list[str]],
    connections: int,
    seconds: float,
    metered: list[_Node],
) -> _Result:
    """One bounded wrk run (rotate.lua) over the nodes `to` (targets[i] presigned for to[i]):
    thread i on node i % N, one thread per node (two for one node, as in `hits`); with the CPU
    of every node in `metered` meanwhile. wrk merges the threads' latencies: p50/p99 are of
    the whole fleet."""
    files = [workdir / f"fleet-targets.{i}" for i in range(len(to))]
    for path, lines in zip(files, targets, strict=True):
        write_targets(path, lines)
    meter = _Meter(metered)
    w = wrk(to[0].url, files, connections, seconds, hosts=[n.hostport for n in to])
    cores, machine = meter.stop()
    return _Result(**asdict(w), cores=cores, machine_pct=machine)


def _median_row(runs: list[_Result], **labels: object) -> Row:
    mid = sorted(runs, key=lambda x: x.rps)[len(runs) // 2]  # the median run, whole
    return {
        **labels,
        "req/s": mid.rps,
        "MB/s": mid.bytes / mid.seconds / 1e6,
        "p50 ms": statistics.median(x.p50_ms for x in runs),
        "p99 ms": statistics.median(x.p99_ms for x in runs),
        **_cpu_cells(mid.cores, mid.machine_pct, mid.rps),
        "errors": sum(x.errors for x in runs),
        "all req/s": [round(x.rps) for x in runs],
    }


def _x_cache(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as resp:
        resp.read()
        return str(resp.headers.get("x-cache", "-"))


def _warm(nodes: list[_Node], targets: dict[str, list[str]], keys: list[str]) -> dict[str, str]:
    """Read every key through every node, twice; the second time exactly one node must serve
    it itself (hit) and the others forward. Returns key -> owning node's name."""
    jobs = [(n, i) for n in nodes for i in range(len(keys))]
    tries = 5
    for _ in range(tries):
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda j: _x_cache(j[0].url + targets[j[0].name][j[1]]), jobs))
            seen = list(pool.map(lambda j: _x_cache(j[0].url + targets[j[0].name][j[1]]), jobs))
        owners: dict[str, list[str]] = {k: [] for k in keys}
        bad = []
        for (node, i), how in zip(jobs, seen, strict=True):
            if how == "hit":
                owners[keys[i]].append(node.name)
            elif how != "forward" or len(nodes) == 1:
                bad.append(f"{keys[i]} via {node.name}: {how}")
        bad += [f"{k}: served by {v or 'no node'}" for k, v in owners.items() if len(v) != 1]
        if not bad:
            return {k: v[0] for k, v in owners.items()}
        time.sleep(2)  # a node may not have seen the newest member yet: one heartbeat
    raise RuntimeError(f"fleet not warm after {tries} tries: {bad[:5]} ({len(bad)} in all)")


# -- the scenario --------------------------------------------------------------------------


def run(options: Options, args: argparse.Namespace) -> None:
    missing = [tool for tool in ("wrk", "psql") if shutil.which(tool) is None]
    if missing:
        raise SystemExit(
            f"{' and '.join(missing)} not found: apt-get install -y wrk postgresql-client"
        )
    report = Report(
        scenario="fleet", columns=list(dict.fromkeys(c for cs in COLUMNS.values() for c in cs))
    )
    hop_conns = [int(c) for c in args.hop_connections.split(",") if c.strip()]
    report.settings = {
        "nodes": args.nodes,
        "sizes": args.sizes,
        "objects_per_size": args.objects,
        "connections": args.connections,
        "hop_connections": hop_conns,
        "duration_s": args.duration,
        "repeats": args.repeats,
        "epoch_objects": args.epoch_objects,
        "epoch_object_size": args.epoch_object_size,
        "readers": args.readers,
        "metadata_ttl": options.metadata_ttl,
        "gateway_args": list(options.gateway_args),
    }
    report.load_generator = (
        f"wrk 4.x with rotate.lua, one thread per node (two for one node; thread i on node "
        f"i % N), {args.duration:g} s per run, median of {args.repeats}, each thread rotating "
        "over its node's presigned SigV4 URLs with that node's Host; "
        "epochs: loadtest.httpclient, one process per node (two for one node)"
    )
    hit_keys = {
        size: [f"fleet/{fmt_size(size)}/{i:04d}.bin" for i in range(args.objects)]
        for size in args.sizes
    }
    epoch_keys = {
        n: [f"fleet-epochs/n{n}/{i:06d}.bin" for i in range(args.epoch_objects)]
        for n in range(1, args.nodes + 1)
    }
    with Run("fleet", options) as r:
        origin, shape = r.origin()
        for size, keys in hit_keys.items():
            r.log(f"seeding {len(keys)} x {fmt_size(size)}")
            seed_objects(origin.seed_url, keys, size, None, r.log)
        if args.epoch_objects:
            every = [k for keys in epoch_keys.values() for k in keys]
            r.log(f"seeding {len(every)} x {fmt_size(args.epoch_object_size)} for the epochs")
            seed_objects(origin.seed_url, every, args.epoch_object_size, None, r.log)
        primers = [f"fleet/prime/node{n}.bin" for n in range(1, args.nodes + 1)]
        seed_objects(origin.seed_url, primers, 4096, None, r.log)
        shape()
        report.wan = origin.description
        r.log(f"WAN: {origin.description}")
        fleet = _Fleet(r, args.postgres, origin.url, options.metadata_ttl)
        r.log(f"database {fleet.database} on {args.postgres}")
        clients = [LoadClient(1) for _ in range(max(2, args.nodes))]
        for c in clients:
            r.cleanup.push("stop load client processes", c.close)
        for n in range(1, args.nodes + 1):
            node = fleet.add_node(list(options.gateway_args))
            # A new node makes its store client on its first store request (~0.5 s): not the
            # cold epoch's cost. Its own key, so that it asks the store (no metadata known).
            first = prime(clients[0], node.url, gateway_targets(node.url, [primers[n - 1]])[0])
            r.log(f"{node.name} up at {node.url}; {n} node(s) live; primed ({first:.0f} ms)")
            if args.epoch_objects:
                _epochs(
                    r, report, fleet.nodes, clients, epoch_keys[n], origin, args,
                    options.phase_timeout,
                )  # fmt: skip
            _throughput(r, report, fleet.nodes, hit_keys, args)
            if n == 2:
                _hop(r, report, fleet.nodes, hit_keys, hop_conns, args)
        report.ratios = _ratios(report.rows)
        report.notes += [
            f"one machine, {os.cpu_count()} cores, shared by every node, wrk and the load client: "
            "aggregate throughput cannot scale with nodes here; the rows show what the fleet "
            "costs per request (a hop, placement), not how a real fleet scales",
            "CPU per node: cores used by each node's process (1.0 = one core); server CPU: their "
            "sum; CPU us/req: that sum per request; hop rows meter both nodes (owner+peer)",
            "origin: moto behind the WAN; the throughput and hop rows are warmed first (every "
            "key checked: one node answers hit, the others forward) and never reach it",
            "fleets grow 1 -> 2 -> 3 in one run (a node is added, none restarted), so drift "
            "over the run falls on the larger fleets",
            f"load average {os.getloadavg()[0]:.2f} at the end (other work skews every figure)",
        ]
        _finish(r, report)


def _throughput(
    r: Run, report: Report, nodes: list[_Node], keys: dict[int, list[str]], args: argparse.Namespace
) -> None:
    for size, size_keys in keys.items():
        targets = {n.name: gateway_targets(n.url, size_keys) for n in nodes}
        owners = _warm(nodes, targets, size_keys)
        spread = {n.name: sum(v == n.name for v in owners.values()) for n in nodes}
        r.log(f"{fmt_size(size)} warm over {len(nodes)} node(s); keys owned: {spread}")
        lines = [targets[n.name] for n in nodes]
        runs = [
            _wrk(r.workdir, nodes, lines, args.connections, args.duration, nodes)
            for _ in range(args.repeats)
        ]
        row = _median_row(runs, part="throughput", size=fmt_size(size), nodes=len(nodes),
                          conns=args.connections, owned=spread)  # fmt: skip
        base = next((x for x in report.rows if x["part"] == "throughput" and x["nodes"] == 1
                     and x["size"] == row["size"]), row)  # fmt: skip
        row["vs 1 node"] = row["req/s"] / base["req/s"]
        report.add(**row)
        r.log(f"{row['size']} x {len(nodes)} node(s): {row['req/s']:.0f} req/s, "
              f"p99 {row['p99 ms']:.2f} ms, CPU {row['CPU per node']}")  # fmt: skip


def _hop(
    r: Run,
    report: Report,
    nodes: list[_Node],
    keys: dict[int, list[str]],
    conns: list[int],
    args: argparse.Namespace,
) -> None:
    """Objects owned by the first node, read through it and through the second (which forwards
    every request to it); interleaved, so that drift falls on both alike."""
    owner, peer = nodes[0], nodes[1]
    for size, size_keys in keys.items():
        targets = {n.name: gateway_targets(n.url, size_keys) for n in nodes}
        owners = _warm(nodes, targets, size_keys)
        mine = [i for i, k in enumerate(size_keys) if owners[k] == owner.name]
        paths = {
            "owner": (owner, [targets[owner.name][i] for i in mine]),
            "via peer": (peer, [targets[peer.name][i] for i in mine]),
        }
        r.log(f"hop, {fmt_size(size)}: {len(mine)} keys owned by {owner.name}")
        for c in conns:
            runs: dict[str, list[_Result]] = {p: [] for p in paths}
            for _ in range(args.repeats):
                for path, (to, lines) in paths.items():
                    runs[path].append(_wrk(r.workdir, [to], [lines], c, args.duration, nodes))
            for path in paths:
                row = report.add(**_median_row(runs[path], part="hop", size=fmt_size(size),
                                               path=path, conns=c, keys=len(mine)))  # fmt: skip
                r.log(f"hop {row['size']} c={c} {path}: {row['req/s']:.0f} req/s, "
                      f"p50 {row['p50 ms']:.2f} ms, {row['CPU us/req']:.0f} us/req")  # fmt: skip


def _epochs(
    r: Run,
    report: Report,
    nodes: list[_Node],
    clients: list[LoadClient],
    keys: list[str],
    origin: Origin,
    args: argparse.Namespace,
    timeout: float,
) -> None:
    """Every key read once per epoch, in a new shuffled order, by readers spread over the nodes
    (one client process per node, two for a single node): cold (epoch 1), then warm."""
    targets = [gateway_targets(n.url, keys) for n in nodes]
    procs = max(2, len(nodes))
    readers = [args.readers // procs + (i < args.readers % procs) for i in range(procs)]
    urls = [nodes[i % len(nodes)].url for i in range(procs)]
    for epoch in (1, 2):
        order = _order(len(keys), epoch)
        shares = [[Job(targets[i % len(nodes)][k]) for k in order[i::procs]] for i in range(procs)]
        _epoch(r, report, nodes, clients, origin, timeout,
               (urls, shares, readers), "cold" if epoch == 1 else "warm")  # fmt: skip
    if not args.client:
        return
    # The same warm epoch twice more: each key read through its owner (no hop: the baseline
    # a routed read should cost), and through the gateway's client library, which finds the
    # owner itself from the fleet's placement (gateway.client; ranged GETs over HTTP).
    owners = (
        _warm(nodes, {n.name: targets[i] for i, n in enumerate(nodes)}, keys)
        if len(nodes) > 1
        else dict.fromkeys(keys, nodes[0].name)
    )
    # What the nodes burn idle (heartbeats, refreshes, the janitor): at the client's few
    # hundred requests a second it is a large share of CPU per request, at thousands a small
    # one; "busy us/req" leaves it out, so that rows at different rates compare.
    idle = _Meter(nodes)
    time.sleep(IDLE_SECONDS)
    idle_cores = sum(idle.stop()[0])
    order = _order(len(keys), 2)
    by_owner = [[Job(targets[i][k]) for k in order if owners[keys[k]] == n.name]
                for i, n in enumerate(nodes)]  # fmt: skip
    share_of = [max(1, round(args.readers * len(jobs) / len(keys))) for jobs in by_owner]
    if len(nodes) > 1:  # (one node: the warm epoch above)
        plan = ([n.url for n in nodes], by_owner, share_of)
        _epoch(r, report, nodes, clients, origin, timeout, plan, "warm, to owner", idle_cores)
    prefix = keys[0].rsplit("/", 1)[0] + "/"
    library = CLIENT + json.dumps(
        {
            "endpoint_url": nodes[0].url,
            "key": ACCESS_KEY,
            "secret": SECRET_KEY,
            "dataset": f"{BUCKET}/{prefix}",
        }
    )
    paths = [Job(f"{BUCKET}/{keys[k]}") for k in order]
    shares = [paths[i::procs] for i in range(procs)]
    # Twice: the first pass also lists the dataset and fetches the placement, once per client
    # process (a DataLoader worker's start); the second is an epoch of a running job.
    for label in ("warm, client 1st pass", "warm, client routed"):
        _epoch(r, report, nodes, clients, origin, timeout,
               ([library] * procs, shares, readers), label, idle_cores)  # fmt: skip


def _order(n: int, epoch: int) -> list[int]:
    order = list(range(n))
    random.Random(epoch).shuffle(order)  # the same order for every path of an epoch
    return order


def _epoch(
    r: Run,
    report: Report,
    nodes: list[_Node],
    clients: list[LoadClient],
    origin: Origin,
    timeout: float,
    plan: tuple[list[str], list[list[Job]], list[int]],
    label: str,
    idle_cores: float | None = None,
) -> None:
    """One epoch: client process i reads share i of the jobs from base URL i with its readers
    (plan: base URLs, shares, readers), all at once; a row of the epochs table."""
    conns = origin.requests()
    # The nodes are metered by _spread; the origin and the WAN proxy here, per object.
    behind = CpuMeter(None, {k: v for k, v in origin.watch().items() if k != "gateway"})
    tally, meter = _spread(clients, nodes, *plan, timeout)
    cores, machine = meter.stop()
    behind_cells = behind.stop().per_request(tally.requests)
    rps = tally.requests / tally.seconds
    row = report.add(
        part="epochs",
        nodes=len(nodes),
        epoch=label,
        seconds=round(tally.seconds, 3),
        **{"objects/s": rps, "MB/s": tally.bytes / tally.seconds / 1e6},
        **{"p50 ms": tally.percentile_ms(50), "p99 ms": tally.percentile_ms(99)},
        **_cpu_cells(cores, machine, rps),
        **behind_cells,
        errors=tally.errors + tally.unfinished,
        **{"x-cache": ",".join(f"{k}:{v}" for k, v in sorted(tally.x_cache.items()))},
    )
    if conns is not None:
        row["origin reqs"] = (origin.requests() or 0) - conns
    if idle_cores is not None:
        row["busy us/req"] = (sum(cores) - idle_cores) / rps * 1e6
    r.log(f"epochs x {len(nodes)} node(s), {label}: {rps:.0f} obj/s, CPU {row['CPU per node']}, "
          f"{row['CPU us/req']:.0f} us/req, {row['x-cache']}")  # fmt: skip


def _spread(
    clients: list[LoadClient],
    nodes: list[_Node],
    urls: list[str],
    shares: list[list[Job]],
    readers: list[int],
    timeout: float,
) -> tuple[Tally, _Meter]:
    """Share i of the jobs read from base URL i by client process i, all at once; the meter
    (every node's CPU) starts when the first process does."""
    meters: list[_Meter] = []

    def one(i: int) -> Tally:
        start = (lambda: meters.append(_Meter(nodes))) if i == 0 else None
        return clients[i].run(urls[i], shares[i], readers[i], timeout, start)

    tally = Tally()
    with ThreadPoolExecutor(len(shares)) as pool:
        for part in pool.map(one, range(len(shares))):
            tally.merge(part)
    return tally, meters[0]


def _ratios(rows: list[Row]) -> dict[str, float]:
    ratios: dict[str, float] = {}
    for row in rows:
        if row["part"] == "throughput" and row["nodes"] > 1:
            ratios[f"{row['size']}: {row['nodes']} nodes / 1 node (req/s)"] = row["vs 1 node"]
    hops = {(x["size"], x["conns"], x["path"]): x for x in rows if x["part"] == "hop"}
    for (size, c, path), owner in hops.items():
        via = hops.get((size, c, "via peer"))
        if path != "owner" or via is None:
            continue
        ratios[f"{size} c={c}: via peer / owner (req/s)"] = via["req/s"] / owner["req/s"]
        ratios[f"{size} c={c}: via peer / owner (p50)"] = via["p50 ms"] / owner["p50 ms"]
        ratios[f"{size} c={c}: via peer / owner (CPU us/req)"] = (
            via["CPU us/req"] / owner["CPU us/req"]
        )
    epochs = {(x["nodes"], x["epoch"]): x for x in rows if x["part"] == "epochs"}
    for (n, epoch), row in epochs.items():
        if n > 1 and (1, epoch) in epochs:
            ratios[f"epochs {epoch}: {n} nodes / 1 node (objects/s)"] = (
                row["objects/s"] / epochs[(1, epoch)]["objects/s"]
            )
        owner = epochs.get((n, "warm, to owner"), {})
        if owner and epoch in ("warm", "warm, client routed"):
            name = "through any node" if epoch == "warm" else "client routed"
            ratios[f"epochs warm x {n}: {name} / to owner (CPU us/req)"] = (
                row["CPU us/req"] / owner["CPU us/req"]
            )
        if owner and epoch == "warm, client routed":
            ratios[f"epochs warm x {n}: client routed / to owner (busy us/req)"] = (
                row["busy us/req"] / owner["busy us/req"]
            )
        alone = epochs.get((1, "warm, client routed"), {})
        if n > 1 and alone and epoch == "warm, client routed":
            # The same client, the same requests: on one node none can take a hop.
            ratios[f"epochs warm x {n}: client routed / client on 1 node (busy us/req)"] = (
                row["busy us/req"] / alone["busy us/req"]
            )
    return ratios


# -- output --------------------------------------------------------------------------------


def _finish(r: Run, report: Report) -> None:
    print()
    print(f"== fleet (commit {report.commit}, {report.cores} cores, load average "
          f"{report.loadavg_at_start} at the start) ==")  # fmt: skip
    print(f"WAN: {report.wan}")
    print(f"load generator: {report.load_generator}")
    for part, columns in COLUMNS.items():
        rows = [x for x in report.rows if x["part"] == part]
        if rows:
            print(f"\n{part}")
            print(format_table(columns, rows))
    if report.ratios:
        print()
        width = max(len(k) for k in report.ratios)
        for name, value in report.ratios.items():
            print(f"  {name.ljust(width)}  {value:.2f}x")
    for note in report.notes:
        print(f"note: {note}")
    results = r.options.results_dir
    results.mkdir(parents=True, exist_ok=True)
    stem = results / f"fleet-{report.started}"
    data = asdict(report)
    stem.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
    chart = ""
    try:
        draw(data, stem.with_suffix(".png"))
        chart = f"  chart: {stem.with_suffix('.png')}"
    except ImportError as exc:
        print(f"no chart ({exc}): pip install -e '.[loadtest]'")
    print(f"results: {stem.with_suffix('.json')}{chart}")


def draw(data: dict[str, Any], out: Path) -> None:
    """The run's PNG: aggregate req/s by fleet size, the hop, and the epochs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = data["rows"]
    parts = [p for p in COLUMNS if any(x["part"] == p for x in rows)]
    fig, axes = plt.subplots(1, len(parts), figsize=(5 * len(parts), 4.2), squeeze=False)
    for ax, part in zip(axes[0], parts, strict=True):
        mine = [x for x in rows if x["part"] == part]
        if part == "throughput":
            groups = list(dict.fromkeys(x["size"] for x in mine))
            series = {f"{n} node(s)": [next(x["req/s"] for x in mine if x["nodes"] == n
                                            and x["size"] == g) for g in groups]
                      for n in dict.fromkeys(x["nodes"] for x in mine)}  # fmt: skip
            ax.set_title("hits spread over the fleet: req/s", fontsize=9)
        elif part == "hop":
            groups = list(dict.fromkeys(f"{x['size']} c={x['conns']}" for x in mine))
            series = {p: [next(x["req/s"] for x in mine if x["path"] == p
                               and f"{x['size']} c={x['conns']}" == g) for g in groups]
                      for p in ("owner", "via peer")}  # fmt: skip
            ax.set_title("one forwarding hop: req/s through owner vs peer", fontsize=9)
        else:
            groups = list(dict.fromkeys(x["epoch"] for x in mine))
            series = {f"{n} node(s)": [next((x["objects/s"] for x in mine if x["nodes"] == n
                                             and x["epoch"] == g), 0) for g in groups]
                      for n in dict.fromkeys(x["nodes"] for x in mine)}  # fmt: skip
            ax.set_title("epochs of small objects: objects/s", fontsize=9)
        width = 0.8 / max(len(series), 1)
        for i, (label, values) in enumerate(series.items()):
            xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
            ax.bar(xs, values, width, label=label)
        ax.set_xticks(range(len(groups)), groups, fontsize=8)
        ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"fleet on one {data['cores']}-core machine, commit {data['commit']} "
                 "(shared cores: cost per request, not scaling)", fontsize=8)  # fmt: skip
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """`python -m loadtest.fleet`: this scenario alone, with the common flags."""
    from loadtest import __main__ as cli

    parser = argparse.ArgumentParser(prog="python -m loadtest.fleet", description=SUMMARY)
    add_arguments(parser)
    cli._common(parser)
    args = parser.parse_args(argv)
    options = cli._options(args)
    cli._watchdog(args.max_minutes)
    run(options, args)
    return 0


if __name__ == "__main__":
    from loadtest.__main__ import exit_with

    exit_with(main)
