"""Where a process's CPU goes below Python: `perf record` of its threads, each sample put in
one part by its call chain (used by `missprofile --perf`).

    python -m loadtest.perfsplit PID SECONDS    one process now, for that long

The parts, tried in this order on each sample's chain (leaf first):

- futex: the sample is inside a futex(2) call: a thread waiting for or handing over the GIL
  (take_gil/drop_gil are a condition variable and a mutex), or any other lock or queue
  between threads, counted with the context switches it costs (`finish_task_switch` and the
  wake-up's `_raw_spin_unlock_irqrestore` land here on this VM);
- network: in the kernel under a socket's code (TCP on loopback: the other end's receive runs
  in the sender's context);
- file: in the kernel under a file system's or the VFS's code, not a socket's (ext4, page
  cache writes and reads, opens, renames, links, unlinks, fsync, locks);
- kernel, other: in the kernel for anything else (epoll, scheduling, faults, timers);
- interpreter: CPython itself (libpython: running Python code, allocating, collecting);
- libraries: any other user-space code (libc, uvloop, SQLite, OpenSSL, awscrt, ...).

Needs `perf` (linux-perf) and the right to trace the process (root, or
kernel.perf_event_paranoid <= 1). Its sampling (999 a second)
is in the figures it samples; its cost was not measured apart.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

PARTS = ("futex", "network", "file", "kernel, other", "interpreter", "libraries")
_FILE = ("ext4_", "vfs_", "jbd2_", "filemap_", "do_sys_open", "do_filp_open", "path_openat",
         "do_renameat", "do_linkat", "do_unlinkat", "generic_perform_write", "iomap_",
         "__fput", "do_fsync", "flock", "fcntl_setlk", "locks_")  # fmt: skip
_NET = ("tcp_", "sock_", "inet_", "__sys_sendto", "__sys_recvfrom", "sys_sendfile",
        "do_splice", "unix_", "ip_", "__sys_sendmsg", "__sys_recvmsg")  # fmt: skip


def available() -> bool:
    return shutil.which("perf") is not None


def record(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """Start sampling `pid` (every thread, call chains) into `out`; stop() ends it."""
    return subprocess.Popen(
        ["perf", "record", "-q", "-F", "999", "-g", "-p", str(pid), "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End a record(): SIGINT, as perf record expects, and wait for its file."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def part(chain: list[tuple[str, str]]) -> str:
    """The part of one sample by its chain of (symbol, object), leaf first."""
    kernel = [sym for sym, dso in chain if dso == "[kernel.kallsyms]"]
    if any("futex" in sym for sym in kernel) or any(
        "futex" in sym or "lll_lock" in sym or "pthread_cond" in sym
        for sym, dso in chain[:4]
        if dso != "[kernel.kallsyms]"
    ):
        return "futex"
    if kernel:
        # A socket's read or write passes the VFS too: the network first.
        if any(sym.startswith(_NET) for sym in kernel):
            return "network"
        if any(sym.startswith(_FILE) for sym in kernel):
            return "file"
        if chain and chain[0][1] == "[kernel.kallsyms]":
            return "kernel, other"
    leaf = chain[0][1] if chain else ""
    if "libpython" in leaf or leaf.endswith("/python3") or "/bin/python" in leaf:
        return "interpreter"
    return "libraries"


def split(data: Path) -> dict[str, Counter[str]]:
    """Samples by thread name and part, from a record()'s file."""
    script = subprocess.run(
        ["perf", "script", "-i", str(data), "-F", "comm,tid,ip,sym,dso"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return parse(script)


def parse(script: str) -> dict[str, Counter[str]]:
    """Samples by thread name and part, from `perf script -F comm,tid,ip,sym,dso`'s text."""
    by: dict[str, Counter[str]] = {}
    comm: str | None = None
    chain: list[tuple[str, str]] = []

    def done() -> None:
        if comm is not None:
            by.setdefault(comm, Counter())[part(chain)] += 1

    for line in script.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():  # a sample's first line: "comm tid"
            done()
            comm, chain = line.rsplit(None, 1)[0].strip(), []
            continue
        fields = line.split(None, 1)
        if len(fields) < 2:
            continue
        rest = fields[1]
        sym, _, dso = rest.rpartition(" (")
        chain.append((sym.strip(), dso.rstrip(")")))
    done()
    return by


def shares(by: dict[str, Counter[str]]) -> dict[str, dict[str, float]]:
    """Each thread name's share of all samples, and of it each part's (fractions of all)."""
    total = sum(sum(c.values()) for c in by.values()) or 1
    out: dict[str, dict[str, float]] = {}
    for name, counts in sorted(by.items(), key=lambda i: -sum(i[1].values())):
        out[name] = {"all": sum(counts.values()) / total}
        for p in PARTS:
            out[name][p] = counts[p] / total
    return out


def table(shared: dict[str, dict[str, float]], us_per: float | None = None) -> str:
    """Rows by thread name: % of the process's samples (with `us_per`, the µs an operation
    each share is of that figure) by part."""
    cols = ("all", *PARTS)

    def cell(x: float) -> str:
        return f"{x * us_per:.0f}" if us_per is not None else f"{x * 100:.1f}"

    unit = "us each" if us_per is not None else "% of samples"
    lines = [f"{'thread (' + unit + ')':24s}" + "".join(f"{c:>15s}" for c in cols)]
    sums = {c: 0.0 for c in cols}
    for name, row in shared.items():
        lines.append(f"{name[:24]:24s}" + "".join(f"{cell(row[c]):>15s}" for c in cols))
        for c in cols:
            sums[c] += row[c]
    lines.append(f"{'all threads':24s}" + "".join(f"{cell(sums[c]):>15s}" for c in cols))
    return "\n".join(lines)


def main() -> None:
    import tempfile
    import time

    pid, seconds = int(sys.argv[1]), float(sys.argv[2])
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "perf.data"
        proc = record(pid, data)
        try:
            time.sleep(seconds)
        finally:
            stop(proc)
        print(table(shares(split(data))))


if __name__ == "__main__":
    main()
