"""How a job is shown to people: a live progress bar (rich) while it runs, lines when the
output is not a terminal, and the summary, table and detail views of `gateway jobs`."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
)
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


class SpeedColumn(ProgressColumn):
    """The transfer rate in the binary units of the sizes beside it (rich's own is decimal:
    "73.1 MiB ... 19.1 MB/s")."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("?" if speed is None else f"{size(int(speed))}/s", style="progress.data.speed")


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
    columns = (
        TextColumn("job {task.fields[job]} [bold]{task.fields[state]}[/]"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[objects]} objects"),
        DownloadColumn(binary_units=True),
        SpeedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[failures]}"),
    )
    with Progress(*columns, console=console, refresh_per_second=4) as bar:
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
