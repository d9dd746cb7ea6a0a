"""What a system call costs a thread of a process whose event loop is busy: the GIL.

    python -m loadtest.gilcost [--calls 3000] [--busy 0,1,2]

A Python thread lets the GIL go for each system call it makes (os.pwrite, os.rename, a
SQLite step...) and must take it back after. Alone, that is nearly free. Beside a thread
that runs Python (an event loop with work to do), the caller waits on a condition variable
until the other lets go at its own next system call, or until the switch interval (5 ms)
runs out and the interpreter makes it: a cross-CPU wake-up each way, dear on a VM. A page
store commit on a cache-io thread is a few such calls; each fewer is worth that cost
(docs/performance.md, "A commit's system calls and the GIL").

It measures a 1-byte pwrite into a file in the page cache, `--calls` times, on the main
thread, beside 0, 1, 2... threads spinning in Python: the caller's CPU a call
(CLOCK_THREAD_CPUTIME_ID: the scheduler's count, not the tick's) and its time a call. No
servers; the file is made in a temporary folder under the working directory and removed.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time

FILE_BYTES = 16 << 20  # as the cache's Bloom filter at its largest


def measure(path: str, calls: int, busy: int) -> tuple[float, float]:
    """(CPU µs, time µs) a pwrite costs the calling thread beside `busy` spinning threads."""
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    spinners = [threading.Thread(target=spin, daemon=True) for _ in range(busy)]
    for t in spinners:
        t.start()
    fd = os.open(path, os.O_RDWR)
    offsets = [random.randrange(FILE_BYTES) for _ in range(calls)]
    try:
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        for offset in offsets:
            os.pwrite(fd, b"\x01", offset)
        cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
    finally:
        os.close(fd)
        stop.set()
        for t in spinners:
            t.join()
    return cpu / calls * 1e6, wall / calls * 1e6


def main(argv: list[str] | None = None) -> None:
    summary = (__doc__ or "").split("\n")[0]
    p = argparse.ArgumentParser(prog="python -m loadtest.gilcost", description=summary)
    p.add_argument("--calls", type=int, default=3000, help="pwrites a reading (3000)")
    p.add_argument("--busy", default="0,1,2", help="spinning threads beside, a reading each")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=".") as folder:
        path = os.path.join(folder, "file")
        with open(path, "wb") as f:
            f.write(bytes(FILE_BYTES))
        interval = sys.getswitchinterval() * 1e3
        print(f"a 1-byte pwrite into a {FILE_BYTES >> 20} MiB file in the page cache, "
              f"{args.calls} calls a reading (switch interval {interval:.1f} ms)")  # fmt: skip
        for busy in (int(b) for b in args.busy.split(",")):
            cpu, wall = measure(path, args.calls, busy)
            print(f"  beside {busy} busy thread(s): {cpu:8.1f} µs of the caller's CPU a call, "
                  f"{wall:8.1f} µs of its time")  # fmt: skip


if __name__ == "__main__":
    main()
