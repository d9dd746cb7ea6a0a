"""wrk as the load generator for fixed URL sets: C, epoll, far cheaper per request than any
Python client, with a Lua script that rotates over presigned request targets."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtest.procs import CpuMeter, CpuUse

_SCRIPT = Path(__file__).with_name("rotate.lua")


@dataclass(frozen=True, slots=True)
class WrkResult:
    requests: int
    bytes: int
    seconds: float
    errors: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    cpu: CpuUse

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    @property
    def mbps(self) -> float:
        return self.bytes / self.seconds / 1e6


def run_wrk(
    base_url: str,
    targets: Sequence[str],
    targets_file: Path,
    connections: int,
    seconds: float,
    server_pid: int | None,
    timeout: float = 30.0,
) -> WrkResult:
    """One bounded wrk run (`seconds` long) over `targets` (each a request target, or a target,
    a tab and a Range header value), with the server's CPU meanwhile. A response slower than
    `timeout` seconds counts as an error (64 MiB objects at 64 connections take seconds)."""
    targets_file.write_text("\n".join(targets) + "\n")
    threads = 1 if connections < 2 else 2  # two cores: one wrk thread per core at most
    cmd = [
        "wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds:g}s", "--timeout", f"{timeout:g}s",
        "-s", str(_SCRIPT), base_url, "--", str(targets_file),
    ]  # fmt: skip
    meter = CpuMeter(server_pid)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + timeout + 60)
    cpu = meter.stop()
    line = next((x for x in out.stdout.splitlines() if x.startswith("LOADTEST ")), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stderr or out.stdout}")
    r = json.loads(line.removeprefix("LOADTEST "))
    errors = r["connect"] + r["read"] + r["write"] + r["status"] + r["timeout"]
    return WrkResult(
        requests=r["requests"],
        bytes=r["bytes"],
        seconds=r["duration_us"] / 1e6,
        errors=errors,
        p50_ms=r["p50_us"] / 1000,
        p99_ms=r["p99_us"] / 1000,
        mean_ms=r["mean_us"] / 1000,
        cpu=cpu,
    )
