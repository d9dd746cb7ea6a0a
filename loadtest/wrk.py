"""wrk as the load generator for fixed URL sets: C, epoll, far cheaper per request than any
Python client, with a Lua script (rotate.lua) that rotates over presigned request targets, on
one server or spread over several (a fleet's nodes)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from loadtest.procs import CpuMeter, CpuUse

_SCRIPT = Path(__file__).with_name("rotate.lua")
HOSTS_ENV = "LT_WRK_HOSTS"  # rotate.lua: host:port of each node, comma-separated


@dataclass(frozen=True, slots=True)
class WrkCounts:
    """What one wrk run reports (rotate.lua's JSON line), all threads together."""

    requests: int
    bytes: int
    seconds: float
    errors: int
    p50_ms: float
    p99_ms: float
    mean_ms: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    @property
    def mbps(self) -> float:
        return self.bytes / self.seconds / 1e6


@dataclass(frozen=True, slots=True)
class WrkResult(WrkCounts):
    """A run on one server, with that server's CPU meanwhile."""

    cpu: CpuUse


def write_targets(path: Path, targets: Sequence[str]) -> None:
    """A targets file for rotate.lua: one request target a line, optionally a tab and a Range
    header value after it."""
    path.write_text("\n".join(targets) + "\n")


def wrk_threads(connections: int, hosts: int = 1) -> int:
    """One thread per node over several nodes (a thread connects to one node); on one server
    one thread for one connection, else two (two cores: one wrk thread per core at most)."""
    return hosts if hosts > 1 else 1 if connections < 2 else 2


def wrk(
    url: str,
    targets_files: Sequence[Path],
    connections: int,
    seconds: float,
    hosts: Sequence[str] = (),
    timeout: float = 30.0,
) -> WrkCounts:
    """One bounded wrk run with rotate.lua, `seconds` long; nothing is metered here.

    Without `hosts`: every thread on `url`, over targets_files[0]. With `hosts` (host:port of
    each node, targets_files[i] presigned for hosts[i]): thread i on node i % N, with that
    node's Host header, and connections rounded up to a multiple of the threads (wrk gives
    each thread connections // threads). A response slower than `timeout` seconds counts as
    an error (64 MiB objects at 64 connections take seconds)."""
    if hosts and len(targets_files) != len(hosts):
        raise ValueError(f"{len(hosts)} hosts but {len(targets_files)} targets files")
    threads = wrk_threads(connections, len(hosts))
    if hosts:
        connections = -(-connections // threads) * threads
    cmd = [
        "wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds:g}s", "--timeout", f"{timeout:g}s",
        "-s", str(_SCRIPT), url, "--", *(str(f) for f in targets_files),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != HOSTS_ENV}
    if hosts:
        env[HOSTS_ENV] = ",".join(hosts)
    out = subprocess.run(
        cmd, capture_output=True, text=True, env=env, timeout=seconds + timeout + 60
    )
    line = next((x for x in out.stdout.splitlines() if x.startswith("LOADTEST ")), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stderr or out.stdout}")
    r = json.loads(line.removeprefix("LOADTEST "))
    return WrkCounts(
        requests=r["requests"],
        bytes=r["bytes"],
        seconds=r["duration_us"] / 1e6,
        errors=r["connect"] + r["read"] + r["write"] + r["status"] + r["timeout"],
        p50_ms=r["p50_us"] / 1000,
        p99_ms=r["p99_us"] / 1000,
        mean_ms=r["mean_us"] / 1000,
    )


def run_wrk(
    base_url: str,
    targets: Sequence[str],
    targets_file: Path,
    connections: int,
    seconds: float,
    server_pid: int | None,
    watch: Mapping[str, int | None] | None = None,
    timeout: float = 30.0,
) -> WrkResult:
    """One bounded wrk run (`seconds` long) over `targets` (each a request target, or a target,
    a tab and a Range header value) on one server, with the server's CPU meanwhile (and that
    of the processes in `watch`, procs.CpuMeter's)."""
    write_targets(targets_file, targets)
    meter = CpuMeter(server_pid, watch)
    w = wrk(base_url, [targets_file], connections, seconds, timeout=timeout)
    cpu = meter.stop()
    return WrkResult(**asdict(w), cpu=cpu)
