"""How a job is shown to people: a live progress bar (rich) while it runs, lines when the
output is not a terminal, and the summary, table and detail views of `gateway jobs`."""

from __future__ import annotations

import shutil
import time
from collections.abc import Awaitable, Callable

from rich.console import Console
from rich.progress import Progress, ProgressColumn, Task
from rich.table import Table
from rich.text import Text

from gateway.jobs.model import LISTING, JobView

POLL = 0.5  # seconds between looks at the job
_LINE_EVERY = 5.0  # seconds between progress lines when the output is not a terminal


def size(count: int) -> str:
    """Bytes in binary units, as the size settings take them (64MiB, 10GiB)."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


_MIN_BAR = 8  # columns of bar below which the figures on its right give way first
_MAX_BAR = 40  # as rich's own bar: a wide terminal gets no longer a bar


def bar_console(stderr: bool = False) -> Console:
    """The console the bar is drawn on: as wide as the terminal (shutil's answer, which
    COLUMNS overrides), so that the bar's line is laid out for it and never wraps."""
    return Console(stderr=stderr, width=shutil.get_terminal_size().columns)


class LineColumn(ProgressColumn):
    """The whole progress line as one cell, laid out for the console's width: the job and its
    state, the bar in the room left, then the figures (per cent, objects, bytes, the rate in
    binary units, time left, failures). Where the line would not fit, the rate and the time
    left give way, then the bar shrinks; the line is cut, never wrapped (rich's own columns
    wrap their cells onto a second line when the terminal is narrower than they are)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.width = max(20, width - 1)  # a character written in the last column may wrap

    def render(self, task: Task) -> Text:
        f = task.fields
        left = f"job {f['job']} {f['state']} "
        total = task.total
        done = int(task.completed)
        figures = [
            f"{task.percentage:3.0f}%" if total else "",
            f"{f['objects']} objects",
            _fraction(done, int(total)) if total else size(done),
        ]
        extra = [_rate(task), _time_left(task), f["failures"]]
        right = _joined(figures + extra)
        while len(left) + len(right) + _MIN_BAR > self.width and extra:
            extra.pop(0)
            right = _joined(figures + extra)
        room = min(_MAX_BAR, max(0, self.width - len(left) - len(right) - 1))
        filled = round(room * min(1.0, done / total)) if total else 0
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append(left)
        line.append("━" * filled, style="bar.complete")
        line.append("━" * (room - filled), style="bar.back")
        line.append(" " + right)
        line.truncate(self.width, overflow="ellipsis")
        return line


def _fraction(done: int, total: int) -> str:
    """ "73.1/100.0 MiB" as rich's download column writes it, in the units of the total."""
    whole, unit = size(total).rsplit(" ", 1)
    scale = 1024 ** ("B", "KiB", "MiB", "GiB", "TiB").index(unit)
    part = str(done) if unit == "B" else f"{done / scale:.1f}"
    return f"{part}/{whole} {unit}"


def _joined(parts: list[str]) -> str:
    return " ".join(p for p in parts if p)


def _rate(task: Task) -> str:
    """The transfer rate in the binary units of the sizes beside it (rich's own is decimal:
    "73.1 MiB ... 19.1 MB/s")."""
    speed = task.finished_speed or task.speed
    return "?/s" if speed is None else f"{size(int(speed))}/s"


def _time_left(task: Task) -> str:
    left = task.time_remaining
    if left is None or task.finished:
        return ""
    minutes, seconds = divmod(int(left), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d} left"


def done_fraction(job: JobView) -> float:
    """How far the work is, as a share of the job's bytes: what is loaded (or found cached)
    for a load; the shares of batches checked for --verify, which loads nothing."""
    if job.spec.verify or job.spec.metadata_only:
        total = sum(n.batches for n in job.nodes)
        return sum(n.batches_done for n in job.nodes) / total if total else 0.0
    return job.bytes_done / job.total_bytes if job.total_bytes else 0.0


def status_line(job: JobView) -> str:
    total = f"{job.total_objects}" + ("" if job.listed else "+")
    parts = [
        f"job {job.id} {job.state}",
        f"{job.objects_done}/{total} objects",
        f"{size(job.bytes_done)}/{size(job.total_bytes)}",
    ]
    if job.failures:
        parts.append(f"{job.failures} failed")
    if job.state == LISTING and job.message:
        parts.append(job.message)  # a catalog sync's progress, before the items
    return ", ".join(parts)


def _state(job: JobView) -> str:
    return f"{job.state} ({job.message})" if job.state == LISTING and job.message else job.state


def summary(job: JobView) -> str:
    lines = [f"job {job.id} {job.state}: {job.message or status_line(job)}"]
    if job.spec.verify or job.spec.unpin:
        lines.append(_nodes_table(job, verify=job.spec.verify, unpin=job.spec.unpin))
    for error in job.errors[:5]:
        lines.append(f"  {error.key}: {error.message} (on {error.node})")
    return "\n".join(lines)


def _nodes_table(job: JobView, verify: bool = False, unpin: bool = False) -> str:
    rows: list[tuple[str, ...]]
    if unpin:  # an unpin job counts the blocks each node unpinned as cached_*
        rows = [("NODE", "UNPINNED BLOCKS", "UNPINNED BYTES", "FAILED")]
        rows += [
            (n.node, str(n.cached_objects), size(n.cached_bytes), str(n.failures))
            for n in job.nodes
        ]
    elif verify:
        rows = [("NODE", "CACHED OBJECTS", "CACHED BYTES")]
        rows += [(n.node, str(n.cached_objects), size(n.cached_bytes)) for n in job.nodes]
    else:
        rows = [("NODE", "LOADED", "LOADED BYTES", "CACHED BYTES", "FAILED", "FULL")]
        rows += [
            (n.node, str(n.loaded_objects), size(n.loaded_bytes), size(n.cached_bytes),
             str(n.failures), "yes" if n.full else "")
            for n in job.nodes
        ]  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def detail(job: JobView) -> str:
    s = job.spec
    options = [
        name for name in ("pin", "verify", "metadata_only", "refresh", "unpin") if getattr(s, name)
    ]
    lines = [
        f"job {job.id}: {job.spec.kind} s3://{s.bucket}/{s.prefix}",
        f"  state:      {job.state}" + (f" ({job.message})" if job.message else ""),
        f"  progress:   {status_line(job)}",
        f"  submitted:  {job.submitted_at.isoformat(timespec='seconds')} by {job.submitted_by}",
        f"  options:    replicas={s.replicas} concurrency={s.concurrency}"
        + (f" bandwidth={size(s.bandwidth)}/s" if s.bandwidth else "")
        + "".join(f" --{o.replace('_', '-')}" for o in options)
        + "".join(f" --include {p}" for p in s.include)
        + "".join(f" --exclude {p}" for p in s.exclude),
    ]
    if job.ended_at is not None:
        lines.append(f"  ended:      {job.ended_at.isoformat(timespec='seconds')}")
    if job.nodes:
        lines.append(_nodes_table(job, verify=s.verify, unpin=s.unpin))
    if job.errors:
        lines.append("  first errors:")
        lines += [f"    {e.key}: {e.message} (on {e.node})" for e in job.errors]
    return "\n".join(lines)


def jobs_table(jobs: list[JobView]) -> str:
    table = Table(box=None, pad_edge=False, show_edge=False)
    for name in ("ID", "STATE", "KIND", "WHAT", "OBJECTS", "BYTES", "SUBMITTED"):
        table.add_column(name, no_wrap=True)
    for job in jobs:
        table.add_row(
            str(job.id), job.state, job.spec.kind, f"{job.spec.bucket}/{job.spec.prefix}",
            f"{job.objects_done}/{job.total_objects}",
            f"{size(job.bytes_done)}/{size(job.total_bytes)}",
            job.submitted_at.isoformat(timespec="seconds"),
        )  # fmt: skip
    console = Console(width=200, force_terminal=False, color_system=None)
    with console.capture() as out:
        console.print(table)
    return "\n".join(line.rstrip() for line in out.get().splitlines())


async def follow(
    job_id: int,
    look: Callable[[int], Awaitable[JobView | None]],
    console: Console,
    *,
    sleep: Callable[[float], Awaitable[None]],
    clock: Callable[[], float] = time.monotonic,
) -> JobView:
    """Show the job until it ends: a live bar on a terminal, a line every few seconds
    elsewhere. Returns the job as it ended."""
    job = await look(job_id)
    if job is None:
        raise LookupError(f"no job {job_id}")
    if not console.is_terminal:
        said, at = "", clock()
        while not job.ended:
            line = status_line(job)
            if (line != said and clock() - at >= _LINE_EVERY) or not said:
                console.print(line, highlight=False)
                said, at = line, clock()
            await sleep(POLL)
            job = await look(job_id) or job
        return job
    with Progress(LineColumn(console.width), console=console, refresh_per_second=4) as bar:
        task = bar.add_task("", total=None, job=job.id, state=job.state, objects="0/0",
                            failures="")  # fmt: skip
        while True:
            total = job.total_bytes if job.listed else None
            objects = f"{job.objects_done}/{job.total_objects}" + ("" if job.listed else "+")
            bar.update(
                task, total=total, completed=done_fraction(job) * job.total_bytes,
                state=_state(job), objects=objects,
                failures=f"{job.failures} failed" if job.failures else "",
            )  # fmt: skip
            if job.ended:
                break
            await sleep(POLL)
            job = await look(job_id) or job
    return job
