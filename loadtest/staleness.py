"""How far behind an origin's overwrites the gateway's reads are: issue 40's contract, "no read
more than one TTL (+1 s) behind an overwrite at the origin", under an overwrite hammer.

    python -m loadtest.staleness [--seconds 60] [--keys 32] [--size 4KiB] [--writes 40]
        [--metadata-ttl 5] [--readers 2] [--json F]

`rclone serve s3` over a folder is the origin (it ignores If-Match, so the gateway cannot lean
on a conditional GET to notice a change); a gateway node at its default worker count mounts it
with `metadata_ttl` `--metadata-ttl` (the default TTL unless told). A writer overwrites the
`--keys` objects at the origin, directly (boto3 PUTs to rclone), `--writes` a second in turn;
each body names its key and a sequence number and is filled with bytes derived from both.
Meanwhile each path reads random keys through the gateway in `--readers` threads:

- **direct**: boto3 GetObject against the origin (the baseline: its lag is the origin's own,
  and the harness's; 0 when the origin is consistent and the clock rule right);
- **http**: boto3 GetObject against the node (what every S3 client does);
- **socket**: the gateway's client library (`gateway.client.GatewayFileSystem`) with the
  node's short-circuit socket: cached blocks read from the node's files under leases.

A read that started at time t and returned sequence s is *behind* by t - d, where d is when
the first overwrite after s had been acknowledged to the writer, if that happened before t
(else it is current). Reported per path: reads, reads behind at all, the largest and the 99th
percentile lag, **reads more than TTL + 1 s behind** (the goal: 0), and bodies that are not
exactly one written version (the goal: 0; a torn or mixed body would count here).
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import json
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest.data import ensure_bucket, gateway_client, origin_client
from loadtest.origins import start_rclone
from loadtest.procs import Cleanup, free_port
from loadtest.servers import (
    ACCESS_KEY,
    BUCKET,
    ORIGIN_BUCKET,
    ORIGIN_PREFIX,
    SECRET_KEY,
    start_gateway,
)
from loadtest.sizes import parse_size

_SEQ = 12  # digits of the sequence number in a body


def body(key: str, seq: int, size: int) -> bytes:
    """Version `seq` of `key`: its name and number, then bytes only that version has."""
    head = f"{key}:{seq:0{_SEQ}d}:".encode()
    fill = hashlib.sha256(head).digest()
    out = head + fill * ((size - len(head)) // len(fill) + 1)
    return out[:size]


def parse(key: str, data: bytes, size: int) -> int | None:
    """The sequence number of a body that is exactly one version of `key`, else None."""
    prefix = f"{key}:".encode()
    if not data.startswith(prefix):
        return None
    digits = data[len(prefix) : len(prefix) + _SEQ]
    if not digits.isdigit():
        return None
    seq = int(digits)
    return seq if data == body(key, seq, size) else None


@dataclass
class Writes:
    """Each key's versions: sequence numbers and when each was acknowledged (monotonic)."""

    seqs: dict[str, list[int]] = field(default_factory=dict)
    done: dict[str, list[float]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, key: str, seq: int, at: float) -> None:
        with self.lock:
            self.seqs.setdefault(key, []).append(seq)
            self.done.setdefault(key, []).append(at)

    def lag(self, key: str, seq: int, started: float) -> float:
        """How far behind a read that started at `started` and returned `seq` is (0: current)."""
        with self.lock:
            seqs, done = self.seqs[key], self.done[key]
            after = bisect.bisect_right(seqs, seq)  # the first overwrite of what was read
            if after == len(seqs) or done[after] >= started:
                return 0.0
            return started - done[after]


@dataclass
class PathResult:
    reads: int = 0
    behind: int = 0
    late: int = 0  # more than TTL + 1 s behind
    bad: int = 0  # not exactly one written version
    errors: int = 0
    lags: list[float] = field(default_factory=list)


def _writer(
    s3: Any, keys: list[str], size: int, rate: float, writes: Writes, stop: threading.Event,
    first_seq: int,
) -> int:  # fmt: skip
    seq = first_seq
    gap = 1.0 / rate
    due = time.monotonic()
    while not stop.is_set():
        for key in keys:
            if stop.is_set():
                break
            seq += 1
            s3.put_object(
                Bucket=ORIGIN_BUCKET, Key=f"{ORIGIN_PREFIX}/{key}", Body=body(key, seq, size)
            )
            writes.add(key, seq, time.monotonic())
            due += gap
            pause = due - time.monotonic()
            if pause > 0:
                stop.wait(pause)
            else:
                due = time.monotonic()  # behind: no burst to catch up
    return seq


def _reader(
    read: Callable[[str], bytes], keys: list[str], size: int, ttl: float, writes: Writes,
    stop: threading.Event, result: PathResult, lock: threading.Lock, seed: int,
) -> None:  # fmt: skip
    rng = random.Random(seed)
    while not stop.is_set():
        key = rng.choice(keys)
        started = time.monotonic()
        try:
            data = read(key)
        except Exception:
            with lock:
                result.errors += 1
            continue
        seq = parse(key, data, size)
        with lock:
            result.reads += 1
            if seq is None:
                result.bad += 1
                continue
            lag = writes.lag(key, seq, started)
            if lag > 0:
                result.behind += 1
                result.lags.append(lag)
                if lag > ttl + 1.0:
                    result.late += 1


def _http_reader(url: str) -> Callable[[str], bytes]:
    s3 = gateway_client(url)

    def read(key: str) -> bytes:
        return bytes(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())

    return read


def _direct_reader(url: str) -> Callable[[str], bytes]:
    s3 = origin_client(url)

    def read(key: str) -> bytes:
        return bytes(
            s3.get_object(Bucket=ORIGIN_BUCKET, Key=f"{ORIGIN_PREFIX}/{key}")["Body"].read()
        )

    return read


def _socket_reader(url: str, socket_path: str) -> Callable[[str], bytes]:
    from gateway.client import GatewayFileSystem

    fs = GatewayFileSystem(
        endpoint_url=url, key=ACCESS_KEY, secret=SECRET_KEY, local_socket=socket_path,
        skip_instance_cache=True,
    )  # fmt: skip

    def read(key: str) -> bytes:
        return bytes(fs.cat_file(f"{BUCKET}/{key}"))

    return read


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(args: argparse.Namespace) -> dict[str, Any]:
    size = parse_size(args.size)
    ttl = float(args.metadata_ttl)
    keys = [f"k{i:04d}" for i in range(args.keys)]
    cleanup = Cleanup()
    work = Path(tempfile.mkdtemp(prefix="loadtest-staleness-"))
    try:
        port = free_port()
        start_rclone(cleanup, work, [], "127.0.0.1", port)
        origin_url = f"http://127.0.0.1:{port}"
        s3 = origin_client(origin_url)
        ensure_bucket(s3)
        writes = Writes()
        for key in keys:  # version 0 of each, before the node reads any
            s3.put_object(
                Bucket=ORIGIN_BUCKET, Key=f"{ORIGIN_PREFIX}/{key}", Body=body(key, 0, size)
            )
            writes.add(key, 0, time.monotonic())
        gateway = start_gateway(cleanup, work, origin_url, args.metadata_ttl, [])
        socket_path = str(gateway.data_dir / "gateway.sock")
        paths: dict[str, Callable[[], Callable[[str], bytes]]] = {
            "direct": lambda: _direct_reader(origin_url),
            "http": lambda: _http_reader(gateway.url),
            "socket": lambda: _socket_reader(gateway.url, socket_path),
        }
        for make in paths.values():  # every key read once: the runs start warm
            read = make()
            for key in keys:
                assert parse(key, read(key), size) == 0
        stop = threading.Event()
        lock = threading.Lock()
        results = {name: PathResult() for name in paths}
        threads = [
            threading.Thread(
                target=_reader,
                args=(make(), keys, size, ttl, writes, stop, results[name], lock, n * 7919 + i),
                daemon=True,
            )
            for n, (name, make) in enumerate(paths.items())
            for i in range(args.readers)
        ]
        written: list[int] = []
        writer = threading.Thread(
            target=lambda: written.append(
                _writer(origin_client(origin_url), keys, size, args.writes, writes, stop, 0)
            ),
            daemon=True,
        )
        load0 = _loadavg()
        for t in [writer, *threads]:
            t.start()
        stop.wait(args.seconds)
        stop.set()
        for t in [writer, *threads]:
            t.join(timeout=60)
        figures: dict[str, Any] = {
            "seconds": args.seconds,
            "keys": args.keys,
            "size": size,
            "metadata_ttl": ttl,
            "overwrites": written[0] if written else None,
            "load": [load0, _loadavg()],
            "paths": {},
        }
        print(
            f"origin: rclone; {args.keys} keys of {size} bytes overwritten "
            f"{figures['overwrites']} times in {args.seconds:.0f} s; metadata_ttl {ttl:g} s; "
            f"load {load0} -> {_loadavg()}"
        )
        print(f"{'path':8} {'reads':>7} {'behind':>7} {'p99 lag s':>9} {'max lag s':>9} "
              f"{'> TTL+1 s':>9} {'bad':>4} {'errors':>6}")  # fmt: skip
        for name, res in results.items():
            row = {
                "reads": res.reads, "behind": res.behind, "late": res.late, "bad": res.bad,
                "errors": res.errors, "p99_lag": _pct(res.lags, 0.99),
                "max_lag": max(res.lags, default=0.0),
            }  # fmt: skip
            figures["paths"][name] = row
            print(
                f"{name:8} {res.reads:7d} {res.behind:7d} {row['p99_lag']:9.2f} "
                f"{row['max_lag']:9.2f} {res.late:9d} {res.bad:4d} {res.errors:6d}"
            )
        return figures
    finally:
        cleanup.run()


def _loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.staleness", description=__doc__)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--keys", type=int, default=32)
    p.add_argument("--size", default="4KiB")
    p.add_argument("--writes", type=float, default=40.0, help="overwrites a second (40)")
    p.add_argument("--metadata-ttl", default="5", help="the mount's metadata_ttl (5: the default)")
    p.add_argument("--readers", type=int, default=2, help="reader threads a path (2)")
    p.add_argument("--json", help="write the figures here too")
    args = p.parse_args(argv)
    figures = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    late = sum(row["late"] + row["bad"] for row in figures["paths"].values())
    return 1 if late else 0


if __name__ == "__main__":
    sys.exit(main())
