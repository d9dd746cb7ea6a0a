"""What every scenario shares: its options, a work folder, the cleanup, the origin, and how
one measured phase of the load client becomes a table row."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from loadtest import fscost
from loadtest.data import seed_large, seed_objects
from loadtest.fsimage import Scratch
from loadtest.httpclient import Job, LoadClient, Tally
from loadtest.procs import Cleanup, CpuMeter, CpuUse
from loadtest.report import RESULTS, Report, Row
from loadtest.sizes import fmt_size
from loadtest.wan import Origin, WanSettings, start_origin

MiB = 1024 * 1024
# CPU microseconds per request (per object in epochs, per page in list) of the row's gateway
# processes, of the origin's and of the WAN proxy, each from /proc/<pid>/stat over the row:
# what bounds a row is the one near a core's worth at the row's rate.
CPU_COLUMNS = ["gateway us/req", "origin us/req", "WAN proxy us/req"]


# --fs image: room for the largest scenario's files (the origin's copy, the caches', nginx's),
# and inodes for a million small objects; the image is sparse, mkfs writes a few MB.
_IMAGE_NEED = 24 << 30
_IMAGE_INODES = 4_000_000


@dataclass(frozen=True)
class Options:
    wan: WanSettings
    processes: int = 2
    gateway_args: tuple[str, ...] = ()
    metadata_ttl: str = "-1"
    phase_timeout: float = 600.0
    results_dir: Path = RESULTS
    workdir: Path | None = None
    keep_workdir: bool = False
    nginx_workers: int = 1
    fs: str = "folder"  # or "image": the work folder on a journaled ext4 made for the run


@dataclass
class Run:
    """One scenario's lifetime: everything it starts is undone on exit, error or Ctrl-C."""

    name: str
    options: Options
    cleanup: Cleanup = field(default_factory=Cleanup)
    t0: float = field(default_factory=time.monotonic)
    workdir: Path = Path()

    def __enter__(self) -> Run:
        base = self.options.workdir
        if base is not None:
            base.mkdir(parents=True, exist_ok=True)
        if self.options.fs == "image":
            # Its own file system: sparse, so its size costs nothing until written.
            scratch = Scratch(
                base, f"loadtest-{self.name}-fs-", _IMAGE_NEED, _IMAGE_INODES, mode="image"
            )
            self.cleanup.push("remove the scratch file system", scratch.remove)
            self.workdir = Path(scratch.make().root)
            self.log(f"work folder {self.workdir}: {scratch.note}")
        else:
            self.workdir = Path(tempfile.mkdtemp(prefix=f"loadtest-{self.name}-", dir=base))
            if not self.options.keep_workdir:
                self.cleanup.push(f"remove {self.workdir}", lambda: shutil.rmtree(self.workdir))
            self.log(f"work folder {self.workdir}")
        self.log(fscost.describe(fscost.create_cost(self.workdir)))
        pageout = fscost.idle_pageout()
        if pageout is not None:
            self.log(pageout)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None and self.options.keep_workdir:
            self.log(f"logs kept in {self.workdir}")
        self.cleanup.run()

    def log(self, message: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {message}", flush=True)

    def origin(self) -> tuple[Origin, Callable[[], None]]:
        origin, shape = start_origin(self.cleanup, self.workdir, self.options.wan)
        self.log(f"origin ({origin.kind}) at {origin.url}, seeding through {origin.seed_url}")
        return origin, shape

    def origin_with_large(
        self, key: str, size: int, primer: str, report: Report
    ) -> tuple[Origin, Path]:
        """The origin holding one large object (and the same bytes in a local folder, which
        is returned) and a 4 KiB `primer`, seeded before the WAN is shaped."""
        origin, shape = self.origin()
        files = self.workdir / "files"
        self.log(f"seeding one {fmt_size(size)} object")
        seed_large(origin.seed_url, key, size, files, self.log)
        seed_objects(origin.seed_url, [primer], 4096)
        shape()
        report.wan = origin.description
        self.log(f"WAN: {origin.description}")
        return origin, files

    def client(self) -> LoadClient:
        client = LoadClient(self.options.processes)
        self.cleanup.push("stop load client processes", client.close)
        return client


def measure(
    client: LoadClient,
    base_url: str | None,
    jobs: list[Job],
    readers: int,
    timeout: float,
    server_pid: int | None,
    watch: Mapping[str, int | None] | None = None,
) -> tuple[Tally, CpuUse]:
    """One phase of the load client, with the CPU of the server and of the processes in
    `watch` (Origin.watch: the gateway, the origin, the WAN proxy) over it."""
    meters: list[CpuMeter] = []
    tally = client.run(
        base_url, jobs, readers, timeout, lambda: meters.append(CpuMeter(server_pid, watch))
    )
    return tally, meters[0].stop()


def prime(client: LoadClient, base_url: str, target: str, readers: int = 8) -> float:
    """Read one small object `readers` times at once, on as many connections, before a cold
    measurement: a fresh gateway makes its store client on its first miss (each worker
    process on its own), and that start-up cost is not the object's. Returns the slowest
    first byte, in ms."""
    tally = client.run(base_url, [Job(target)] * readers, readers, 120)
    if tally.errors:
        raise RuntimeError(f"priming {base_url} failed: {dict(tally.statuses)}")
    return max(tally.first_bytes) * 1000


def row_of(tally: Tally, cpu: CpuUse, **labels: object) -> Row:
    """The figures every phase reports, next to the server's CPU meanwhile and the CPU per
    request of each watched process (the gateway, the origin, the WAN proxy)."""
    hits = ",".join(f"{k}:{v}" for k, v in sorted(tally.x_cache.items()) if k != "-")
    return {
        **labels,
        "seconds": round(tally.seconds, 3),
        "req/s": tally.requests / tally.seconds,
        "MB/s": tally.bytes / tally.seconds / 1e6,
        "p50 ms": tally.percentile_ms(50),
        "p99 ms": tally.percentile_ms(99),
        "server CPU": cpu.server_cores,
        "machine CPU %": cpu.machine_pct,
        **cpu.per_request(tally.requests),
        "errors": tally.errors + tally.unfinished,
        "x-cache": hits or "-",
    }


def finish(run: Run, report: Report) -> None:
    from loadtest.report import print_report, save

    print_report(report)
    json_path, png_path = save(report, run.options.results_dir)
    print(f"results: {json_path}" + (f"  chart: {png_path}" if png_path else ""))
