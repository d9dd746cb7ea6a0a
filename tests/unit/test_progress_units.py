"""The live progress bar of `gateway load` and `gateway jobs wait` speaks one kind of unit:
sizes and the rate both binary (MiB and MiB/s), as the size settings take them."""

from __future__ import annotations

import asyncio
import io
import re
from datetime import UTC, datetime

from rich.console import Console

from gateway.jobs import progress
from gateway.jobs.model import JobSpec, JobView, NodeProgress

MIB = 1 << 20


def _job(loaded: int, state: str) -> JobView:
    return JobView(
        id=7, spec=JobSpec("data", "train/"), state=state, message="", submitted_by="ops",
        submitted_at=datetime(2026, 12, 1, tzinfo=UTC), started_at=None, ended_at=None,
        total_objects=100, total_bytes=100 * MIB, listed=True,
        nodes=(NodeProgress("node-0", objects=loaded, bytes=loaded * MIB),),
    )  # fmt: skip


def test_the_bar_shows_sizes_and_rate_in_binary_units() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200, color_system=None)
    looks = iter([_job(0, "running"), *(_job(n, "running") for n in range(10, 100, 10))])

    async def look(job_id: int) -> JobView:
        return next(looks, _job(100, "done"))

    async def sleep(seconds: float) -> None:
        await asyncio.sleep(0.02)  # rich measures the rate on its own clock: let it move

    ended = asyncio.run(progress.follow(7, look, console, sleep=sleep))
    assert ended.state == "done"
    shown = out.getvalue()
    assert "100.0/100.0 MiB" in shown
    rates = re.findall(r"[\d.]+ ?([KMGT]i?B|B)/s", shown)
    assert rates and all(unit.endswith("iB") or unit == "B" for unit in rates), rates
