"""Benchmark `rebuild`: how long the page store's janitor takes to know a node's blocks again,
by a full scan of the block files and from its snapshot, and what its index costs in memory.

    python -m loadtest.rebuild [--blocks 1000000] [--dir D] [--mounts 4] [--writers N]
                               [--fs auto|image|folder]

Creates `--blocks` tiny block files (3 bytes and a valid trailer, so a million take ~4 GiB of
file system blocks) in the layout, measures, removes them. The files go on a file system made
for the run (loadtest/fsimage.py): a sparse image file in a temporary folder in D (default
$TMPDIR), formatted ext4 by mkfs.ext4 with its default features (4 KiB blocks, 256-byte
inodes, a 1 GiB journal as on a disk of 128 GiB or more) and loop-mounted in a mount namespace
of the run's own. Every measured step runs the real code on a real ext4 whose writes and
fsyncs reach D's disk through the image file, and removing the million files is an unmount and
one unlink (~8 s) instead of a million unlinks (70 s here when quiet, 390 s when busy).
Without root, loop devices or ext4 (or with `--fs folder`), the files go into a plain
temporary folder in D and are unlinked after; the printed note says which. The scans run with
the files' inodes in the page cache, as on a node that has been up.

A run killed with SIGKILL leaves its folder `loadtest-rebuild-<pid>-*` in D (its mount and loop
device go with its processes); the next run with the same D deletes it.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import signal
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from awscrt.checksums import crc32c

from gateway.cache import relayout
from gateway.cache.janitor import Janitor, read_stats, scan_blocks
from gateway.cache.journal import load_snapshot, write_snapshot
from gateway.cache.layout import SNAPSHOT, block_path, trailer
from gateway.cache.policy import SLRU
from loadtest.common import Options
from loadtest.fsimage import Scratch, die_with_parent, remove_stale
from loadtest.procs import Cleanup
from loadtest.report import Row, format_table

SUMMARY = "janitor index rebuild of N block files: full scan, snapshot write and load, memory"
COLUMNS = ["step", "seconds", "CPU seconds", "per second", "note"]
_OFFSETS = {f"{i}-0123456789ab.log": 48 for i in range(16)}  # as if 16 processes wrote
_DATA = b"blk"
_BLOCK = _DATA + trailer(len(_DATA), crc32c(_DATA), 0)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
_PREFIX = "loadtest-rebuild-"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--blocks", type=int, default=1_000_000, help="block files (1000000)")
    p.add_argument("--dir", type=Path, help="where the temporary folder goes (default: $TMPDIR)")
    p.add_argument("--mounts", type=int, default=4, help="mounts the blocks spread over (4)")
    p.add_argument(
        "--writers", type=int, default=os.cpu_count() or 2, help="processes creating files"
    )
    p.add_argument(
        "--fs",
        choices=["auto", "image", "folder"],
        default="auto",
        help="image: a loop-mounted ext4 image file made for the run; folder: a plain folder "
        "(a million unlinks after: 1-7 min); auto: image when possible (default)",
    )


def run(options: Options, args: argparse.Namespace) -> None:
    """The scenario entry point, for `python -m loadtest rebuild`."""
    bench(args.blocks, args.dir or options.workdir, args.mounts, args.writers, args.fs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.rebuild", description=SUMMARY)
    add_arguments(parser)
    args = parser.parse_args(argv)
    bench(args.blocks, args.dir, args.mounts, args.writers, args.fs)
    return 0


def bench(blocks: int, base: Path | None, mounts: int, writers: int, fs: str = "auto") -> list[Row]:
    Cleanup()  # SIGTERM and SIGHUP unwind through `finally` as Ctrl-C does
    remove_stale(base, _PREFIX, writers, lambda note: print(f"rebuild: {note}", flush=True))
    scratch = Scratch(base, _PREFIX, *disk_use(blocks, mounts), mode=fs)
    load = os.getloadavg()[0]
    steps = _Steps()
    try:
        root = scratch.make().root
        print(f"rebuild: {blocks:,} blocks, {mounts} mounts, in {root}; load {load:.1f}")
        print(f"rebuild: the files go on {scratch.note}", flush=True)
        steps.mark()
        create_blocks(root, blocks, mounts, writers)
        steps.done("create the files", blocks, f"{writers} processes", cpu=False)
        found = list(scan_blocks(root))
        steps.done("full scan (scandir + stat)", len(found))
        policy = index_of(found)
        steps.done("sort by mtime + Policy.add", len(found))
        steps.rows += policy_costs(policy, found)
        per_entry = policy_memory(found)
        del found
        steps.mark()
        count = write_snapshot(root, policy.entries(), _OFFSETS)
        size = os.path.getsize(os.path.join(root, SNAPSHOT))
        steps.done("snapshot write (+fsync)", count, f"{size / 1e6:.0f} MB")
        del policy
        snapshot = load_snapshot(root)
        steps.done("snapshot load (read + CRC)", count)
        assert snapshot is not None
        SLRU(1 << 62).restore(snapshot.entries)
        steps.done("Policy.restore from it", count)
        del snapshot
        first_pass(root, steps, "janitor start, snapshot", "lock, load, a pass")
        os.unlink(os.path.join(root, SNAPSHOT))
        first_pass(root, steps, "janitor start, no snapshot", "scan, a pass, snapshot")
        steps.rows.append({"step": "Policy memory per block", "note": f"{per_entry:.0f} bytes"})
    finally:
        how = "unmount, delete the image" if scratch.is_image else f"{writers} processes"
        steps.mark()
        scratch.remove(writers)
        steps.done("remove the files", blocks, how, cpu=False)
    now = os.getloadavg()[0]
    print(f"\n{os.cpu_count()} cores, load average {load:.1f} at the start, {now:.1f} at the end")
    print(f"files on {scratch.note}")
    print(format_table(COLUMNS, steps.rows))
    return steps.rows


def disk_use(blocks: int, mounts: int) -> tuple[int, int]:
    """(bytes, inodes) the files take: ~4.4 KiB a block (a data block, an inode, its share of
    the directories), snapshots and journals."""
    dirs = mounts * (1 + 256) + min(blocks, mounts * 65536) + 64
    inodes = blocks + dirs + 4096
    return (blocks + dirs) * 4096 + inodes * 256 + blocks * 256, inodes


class _Steps:
    """The rows of the table: wall and CPU seconds (this process's) of each step."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.mark()

    def mark(self) -> None:
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def done(self, step: str, count: int = 0, note: str = "", cpu: bool = True) -> None:
        wall = time.perf_counter() - self._wall
        used = time.process_time() - self._cpu
        self.rows.append(
            {
                "step": step,
                "seconds": wall,
                "CPU seconds": used if cpu else "",
                "per second": f"{count / wall:,.0f}" if count else "",
                "note": note,
            }
        )
        print(f"  {step}: {wall:.2f} s", flush=True)
        self.mark()


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def create_blocks(root: str, blocks: int, mounts: int, writers: int) -> None:
    """`writers` processes, forked (so they are in this thread's mount namespace), each making
    a share of the files; killed at once if this process stops (kill -9 too)."""
    relayout.mark(root)  # written in the current layout: nothing for a node to move
    ctx, me, step = multiprocessing.get_context("fork"), os.getpid(), -(-blocks // writers)
    jobs = [(me, root, mounts, lo, min(lo + step, blocks)) for lo in range(0, blocks, step)]
    procs = [ctx.Process(target=_writer, args=job, daemon=True) for job in jobs]
    try:
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
            if proc.exitcode != 0:
                raise RuntimeError(f"a writer process failed (exit code {proc.exitcode})")
    finally:
        for proc in procs:
            if proc.pid is not None and proc.is_alive():
                proc.kill()
                proc.join()


def _writer(parent: int, root: str, mounts: int, lo: int, hi: int) -> None:
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the parent, which stops us
    _create_range(root, mounts, lo, hi)


def _create_range(root: str, mounts: int, lo: int, hi: int) -> None:
    for i in range(lo, hi):
        name = hashlib.sha256(i.to_bytes(8, "big")).hexdigest()
        path = block_path(root, i % mounts + 1, name)
        try:
            fd = os.open(path, _CREATE, 0o644)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, _CREATE, 0o644)
        try:
            os.write(fd, _BLOCK)
        finally:
            os.close(fd)


def index_of(found: list[tuple[float, int, bytes, int]]) -> SLRU:
    """What a janitor does with a scan: oldest first into the SLRU."""
    policy = SLRU(1 << 62)
    for _, mount, name, size in sorted(found):
        policy.add(mount, name, size)
    return policy


def policy_memory(found: list[tuple[float, int, bytes, int]]) -> float:
    """Bytes a block of the index takes, its name included (tracemalloc: Python's own count)."""
    names = [(mount, name.hex(), size) for _, mount, name, size in found]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        policy = SLRU(1 << 62)
        for mount, name, size in names:
            policy.add(mount, bytes.fromhex(name), size)  # a name of its own, as in a janitor
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return used / max(1, len(policy))


def policy_costs(policy: SLRU, found: list[tuple[float, int, bytes, int]]) -> list[Row]:
    """Microseconds per policy operation on the full index, on blocks picked across it (so
    mostly cache misses, as in a janitor)."""
    keys = [(mount, name) for _, mount, name, _ in found[:: max(1, len(found) // 200_000)]]

    def each() -> None:
        for mount, name in keys:
            policy.access(mount, name)

    promote = timed(each)
    again = timed(each)
    policy.set_capacity(policy.bytes_used // 2)
    t0 = time.perf_counter()
    victims = policy.victims()
    evict = time.perf_counter() - t0
    policy.set_capacity(1 << 62)
    for mount, name, size in victims:
        policy.add(mount, name, size)
    return [
        {"step": "Policy.access, second use", "note": f"{promote / len(keys) * 1e6:.2f} us"},
        {"step": "Policy.access, protected", "note": f"{again / len(keys) * 1e6:.2f} us"},
        {"step": "Policy.victims", "note": f"{evict / max(1, len(victims)) * 1e6:.2f} us/block"},
    ]


def first_pass(root: str, steps: _Steps, step: str, note: str) -> None:
    """A janitor's first pass, which loads the index (its stop is not timed)."""
    janitor = Janitor(root, 1 << 62, 0, rescan_interval=1e9)
    try:
        steps.mark()
        janitor.run_once()
        stats = read_stats(root)
        steps.done(step, stats.entries if stats else 0, note)
        assert janitor.is_janitor
    finally:
        janitor.stop()  # also when interrupted: its files closed, the mount can go


if __name__ == "__main__":
    sys.exit(main())
