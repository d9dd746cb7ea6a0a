"""What a new file costs the kernel now, in the folder a benchmark's cache is about to fill.

On ext4 without a journal (this VM's root file system: /proc/fs/jbd2 is empty), allocating an
inode skips every inode of the group deleted in the last 60 s (360 s while its inode table
block is still dirty), looking each one up in the buffer cache first (`recently_deleted()`
under `find_inode_bit()`; perf: ~60 % of a create's CPU then). A create costs ~20 µs of CPU
in a group nothing was deleted from lately and 300-800 µs after a few thousand deletions
there, and a benchmark's own cleanup (the previous run's work folder, removed a minute ago,
near the same parent) is such a deletion. A miss in a cache that is still growing makes one
file (the janitor's spare, docs/cache.md), so a cold-miss figure read after a cleanup carries
up to ~600 µs a miss of the kernel's scan on the janitor's thread: the benchmarks print this
probe beside their figures, so that two readings are compared only at a like cost.

The probe's files are left in place (removed with the work folder, after the run): removing
them now would make the next creates in that group dearer, which is what it measures.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PROBE_FILES = 200


def create_cost(folder: Path, files: int = PROBE_FILES) -> float:
    """CPU µs (user + system) a new empty file costs in a new subfolder of `folder`."""
    probe = folder / "inode-probe"
    probe.mkdir(parents=True, exist_ok=True)
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    started = time.process_time()
    for i in range(files):
        os.close(os.open(probe / f"{i:x}", flags, 0o600))
    return (time.process_time() - started) / files * 1e6


def describe(cost: float) -> str:
    return f"a new file in the work folder costs {cost:.0f} µs of CPU now (inode probe)"


_DAMON = Path("/sys/kernel/mm/damon/admin/kdamonds")


def idle_pageout() -> str | None:
    """What the kernel's DAMON pages out by itself now, as a line to print beside a benchmark's
    figures, or None where it pages out nothing. This VM runs a DAMON `pageout` scheme over
    physical memory (kdamond.0): a region read at most once an aggregation interval for 12 of
    them (5 s each: 60 s) is paged out, up to 128 MiB a second, the page cache included. A
    cache block not read for a minute is then on disk again, not in the page cache: the edge
    does not answer it from its parser (it waits for no disk), and a warm epoch that follows a
    cold one of more than a minute reads its first blocks through the full path and a thread."""
    lines = []
    for scheme in sorted(_DAMON.glob("*/contexts/*/schemes/*")):
        try:
            context = scheme.parent.parent
            if (context.parent.parent / "state").read_text().strip() != "on":
                continue
            if (scheme / "action").read_text().strip() != "pageout":
                continue
            aggr_us = int((context / "monitoring_attrs/intervals/aggr_us").read_text())
            age = int((scheme / "access_pattern/age/min").read_text())
            quota = int((scheme / "quotas/bytes").read_text())
            reset_ms = int((scheme / "quotas/reset_interval_ms").read_text())
            ops = (context / "operations").read_text().strip()
        except (OSError, ValueError):
            continue
        rate = f", up to {quota >> 20} MiB every {reset_ms} ms" if quota and reset_ms else ""
        lines.append(
            f"the kernel pages out memory ({ops}) idle for {age * aggr_us / 1e6:.0f} s{rate} "
            "(DAMON): a cache block unread that long is read from disk again"
        )
    return "; ".join(lines) or None


def drop_from_page_cache(folder: Path) -> tuple[int, int]:
    """Write back and drop from the page cache every file under `folder` (a cache's blocks):
    the next read of each goes to the disk, as a hit of a data set larger than the machine's
    memory does (or one the kernel paged out: idle_pageout()). (files, bytes) dropped."""
    files = size = 0
    for path in folder.rglob("*"):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # a folder, or gone (evicted meanwhile)
            continue
        try:
            if not os.path.isfile(f"/proc/self/fd/{fd}"):
                continue
            os.fdatasync(fd)  # a dirty page is not dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            files += 1
            size += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return files, size
