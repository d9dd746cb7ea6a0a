"""A load client for request lists run exactly once: P processes x K/P asyncio readers each.

wrk runs for a duration; an epoch must read every object once, in a given order, and a data
loader must read local files the same way. So this client takes a list of jobs (presigned
request targets, optional Range, or local file paths), hands them to its readers in order,
and reports wall time, bytes, statuses, `x-cache` values and latencies. Each process speaks
HTTP/1.1 over raw asyncio streams on uvloop (keep-alive, reconnecting when the server
closes), which costs a fraction of what httpx or botocore would per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

_READ = 1024 * 1024
# The stream's buffer limit. With uvloop, a 1 MiB limit held a large body to ~150-250 MB/s
# from nginx on loopback (curl: ~1,500); 64 KiB (asyncio's default) gives ~1,400.
_BUFFER_LIMIT = 64 * 1024
REQUEST_TIMEOUT = 120.0


@dataclass(frozen=True, slots=True)
class Job:
    target: str  # request target (path?query), or a local file path when there is no URL
    range: str | None = None  # a Range header value, e.g. "bytes=0-1048575"


@dataclass
class Tally:
    """What one process (or, merged, all of them) saw."""

    started: float = float("inf")  # wall clock (time.time), comparable across processes
    ended: float = 0.0
    requests: int = 0
    bytes: int = 0
    errors: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    x_cache: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)  # seconds
    first_bytes: list[float] = field(default_factory=list)  # seconds to the response's head
    unfinished: int = 0  # jobs not started before the deadline

    def merge(self, other: Tally) -> None:
        self.started = min(self.started, other.started)
        self.ended = max(self.ended, other.ended)
        self.requests += other.requests
        self.bytes += other.bytes
        self.errors += other.errors
        self.statuses.update(other.statuses)
        self.x_cache.update(other.x_cache)
        self.latencies.extend(other.latencies)
        self.first_bytes.extend(other.first_bytes)
        self.unfinished += other.unfinished

    @property
    def seconds(self) -> float:
        return max(self.ended - self.started, 1e-9)

    def percentile_ms(self, q: float, first_byte: bool = False) -> float:
        values = self.first_bytes if first_byte else self.latencies
        if len(values) < 2:
            return 1000 * (values[0] if values else 0.0)
        quantiles = statistics.quantiles(values, n=1000, method="inclusive")
        return 1000 * quantiles[min(int(q * 10) - 1, 998)]


class _Conn:
    """One keep-alive HTTP/1.1 connection; reopened after the server closes it (moto does)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.hostport = f"{host}:{port}".encode()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def get(self, target: str, range_: str | None) -> tuple[int, int, str, float]:
        for attempt in (0, 1):
            fresh = self.writer is None
            try:
                return await self._get(target, range_)
            except (OSError, asyncio.IncompleteReadError):
                self.close()
                # A kept-alive connection may have been closed by the server while idle:
                # one retry on a fresh connection; a fresh one that fails is a real error.
                if fresh or attempt:
                    raise
        raise AssertionError("unreachable")

    async def _get(self, target: str, range_: str | None) -> tuple[int, int, str, float]:
        """(status, body bytes, x-cache, seconds until the response's head had arrived)"""
        t0 = time.perf_counter()
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(
                self.host, self.port, limit=_BUFFER_LIMIT
            )
        assert self.reader is not None
        extra = b"Range: %s\r\n" % range_.encode() if range_ else b""
        self.writer.write(b"GET %s HTTP/1.1\r\nHost: %s\r\n%s\r\n" % (
            target.encode(), self.hostport, extra))  # fmt: skip
        head = await self.reader.readuntil(b"\r\n\r\n")
        first_byte = time.perf_counter() - t0
        status = int(head[9:12])
        headers: dict[bytes, bytes] = {}
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        if b"content-length" in headers:
            nbytes = await self._skip(int(headers[b"content-length"]))
        elif headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            nbytes = await self._skip_chunked()
        else:
            nbytes = len(await self.reader.read())  # body ends at the close
            self.close()
        if headers.get(b"connection", b"").lower() == b"close":
            self.close()
        return status, nbytes, headers.get(b"x-cache", b"-").decode(), first_byte

    async def _skip(self, length: int) -> int:
        assert self.reader is not None
        left = length
        while left:
            chunk = await self.reader.read(min(left, _READ))
            if not chunk:
                raise asyncio.IncompleteReadError(b"", left)
            left -= len(chunk)
        return length

    async def _skip_chunked(self) -> int:
        assert self.reader is not None
        total = 0
        while True:
            size = int((await self.reader.readline()).split(b";")[0], 16)
            if size == 0:
                while (await self.reader.readline()) not in (b"\r\n", b""):
                    pass
                return total
            total += await self._skip(size)
            await self.reader.readexactly(2)


async def _http_reader(
    base: tuple[str, int], jobs: list[Job], cursor: list[int], tally: Tally, deadline: float
) -> None:
    conn = _Conn(*base)
    try:
        while cursor[0] < len(jobs) and time.time() < deadline:
            job = jobs[cursor[0]]
            cursor[0] += 1
            t0 = time.perf_counter()
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT):
                    status, nbytes, x_cache, first_byte = await conn.get(job.target, job.range)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError):
                conn.close()
                tally.errors += 1
                continue
            tally.latencies.append(time.perf_counter() - t0)
            tally.first_bytes.append(first_byte)
            tally.requests += 1
            tally.bytes += nbytes
            tally.statuses[status] += 1
            tally.x_cache[x_cache] += 1
            if status >= 300:
                tally.errors += 1
    finally:
        conn.close()


def _read_files(jobs: list[Job], tally: Tally, deadline: float) -> None:
    # Blocking reads, one after another: with the files in the page cache this is CPU-bound,
    # and a thread hop per file (what K readers would need) would only slow it down.
    for i, job in enumerate(jobs):
        if time.time() >= deadline:
            tally.unfinished += len(jobs) - i
            return
        t0 = time.perf_counter()
        with open(job.target, "rb") as f:
            n = len(f.read())
        tally.latencies.append(time.perf_counter() - t0)
        tally.requests += 1
        tally.bytes += n
        tally.statuses[200] += 1


CLIENT = "gw-client:"  # a base "URL" naming the gateway's client library, options as JSON


_CLIENTS: dict[str, Any] = {}  # this worker process's datasets, kept across epochs
CLIENT_BATCH = 64  # objects read as one batch (a DataLoader worker's batch)


def _read_client(options: str, jobs: list[Job], tally: Tally, deadline: float) -> None:
    """Reads through gateway.client, as a DataLoader worker with persistent workers reads
    its share: one GatewayDataset (of the prefix `dataset` in the options, listed once) for
    the process's life, its leases held across epochs; a batch of CLIENT_BATCH objects is
    leased in one request (`prefetch`, as `__getitems__` does), then each object read and
    dropped, as the local files are (a batch of 64 x 100 KiB held at once costs ~100 us an
    object in the allocator's page faults, files or not: measured in process); short-circuit
    reads when `local_socket` is given, ranged GETs routed to the owners otherwise. Latency:
    each object's read, its batch's lease request counted in its first object's."""
    import json

    from gateway.client import GatewayDataset

    found = _CLIENTS.get(options)
    if found is None:
        opts = json.loads(options)
        nofile = opts.pop("nofile", None)
        if nofile:  # the descriptor limit of a host set up for it (ulimit -n)
            import resource

            _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, max(nofile, hard)))
            except (ValueError, OSError):  # raising the hard limit needs the privilege
                resource.setrlimit(resource.RLIMIT_NOFILE, (min(nofile, hard), hard))
        dataset = GatewayDataset(opts.pop("dataset"), **opts)
        index = {path: i for i, path in enumerate(dataset.paths)}
        found = _CLIENTS[options] = (dataset, index)
    dataset, index = found
    for i in range(0, len(jobs), CLIENT_BATCH):
        if time.time() >= deadline:
            tally.unfinished += len(jobs) - i
            return
        batch = [index[job.target] for job in jobs[i : i + CLIENT_BATCH]]
        t0 = time.perf_counter()
        dataset.prefetch(batch)
        for j in batch:
            try:
                n = len(dataset[j])
            except OSError:
                tally.errors += 1
                continue
            t1 = time.perf_counter()
            tally.latencies.append(t1 - t0)
            t0 = t1
            tally.requests += 1
            tally.bytes += n
            tally.statuses[200] += 1


def _run_share(
    base_url: str | None, jobs: list[Job], readers: int, start_at: float, deadline: float
) -> Tally:
    """One process's share of a phase (runs in a worker process)."""
    tally = Tally()
    time.sleep(max(0.0, start_at - time.time()))  # all processes start together
    tally.started = time.time()
    if base_url is None:
        _read_files(jobs, tally, deadline)
    elif base_url.startswith(CLIENT):
        _read_client(base_url[len(CLIENT) :], jobs, tally, deadline)
    else:
        parts = urlsplit(base_url)
        base = (parts.hostname or "127.0.0.1", parts.port or 80)
        cursor = [0]  # shared by this process's readers: jobs are taken in list order

        async def main() -> None:
            await asyncio.gather(
                *(_http_reader(base, jobs, cursor, tally, deadline) for _ in range(readers))
            )

        with contextlib.suppress(ImportError):
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        asyncio.run(main())
        tally.unfinished += len(jobs) - min(cursor[0], len(jobs))
    tally.ended = time.time()
    return tally


class LoadClient:
    """A pool of client processes kept for a whole scenario (spawned once, then reused)."""

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self._pool = multiprocessing.get_context("spawn").Pool(processes)
        # Start every worker now, so no phase pays for interpreter start-up.
        self._pool.map(time.sleep, [0.0] * processes * 2)

    def close(self) -> None:
        # terminate, not close: on Ctrl-C a phase may still be running, and must not finish.
        self._pool.terminate()
        self._pool.join()

    def run(
        self,
        base_url: str | None,
        jobs: list[Job],
        readers: int,
        timeout: float,
        on_start: Callable[[], None] | None = None,
    ) -> Tally:
        """Run `jobs` with `readers` concurrent readers in all; returns the merged tally.

        `on_start` is called when the workers start, so that CPU meters span the load only.
        """
        procs = max(1, min(self.processes, readers, len(jobs)))
        start_at = time.time() + 0.3
        deadline = start_at + timeout
        shares = [jobs[i::procs] for i in range(procs)]
        per_proc = [readers // procs + (1 if i < readers % procs else 0) for i in range(procs)]
        pending = [
            self._pool.apply_async(_run_share, (base_url, share, n, start_at, deadline))
            for share, n in zip(shares, per_proc, strict=True)
        ]
        if on_start is not None:
            time.sleep(max(0.0, start_at - time.time()))
            on_start()
        total = Tally()
        for p in pending:
            total.merge(p.get(timeout=timeout + REQUEST_TIMEOUT + 30))
        return total
