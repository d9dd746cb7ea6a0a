"""The live progress bar of `gateway load` and `gateway jobs wait` speaks one kind of unit:
sizes and the rate both binary (MiB and MiB/s), as the size settings take them."""

from __future__ import annotations

import asyncio
import io
import os
import re
from datetime import UTC, datetime

import pytest
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


def _busy_job(loaded: int, state: str) -> JobView:
    """A job whose figures are as wide as they come: thousands of objects, GiBs, failures."""
    gib = 1 << 30
    return JobView(
        id=12345, spec=JobSpec("data", "train/"), state=state, message="",
        submitted_by="ops", submitted_at=datetime(2026, 12, 1, tzinfo=UTC), started_at=None,
        ended_at=None, total_objects=600000, total_bytes=900 * gib, listed=True,
        nodes=(NodeProgress("node-0", objects=loaded, bytes=loaded * gib, failures=1234),),
    )  # fmt: skip


def _frames(shown: str) -> list[str]:
    """The lines a terminal showed: cursor moves and colours taken out."""
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown)
    return [line for line in re.split(r"[\r\n]", plain) if line.strip()]


def test_the_bar_fits_80_columns_on_one_line() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=80, color_system=None)
    looks = iter([_busy_job(n, "running") for n in range(0, 900, 100)])

    async def look(job_id: int) -> JobView:
        return next(looks, _busy_job(900, "done"))

    async def sleep(seconds: float) -> None:
        await asyncio.sleep(0.01)

    asyncio.run(progress.follow(12345, look, console, sleep=sleep))
    frames = _frames(out.getvalue())
    assert frames
    assert all(len(line) <= 80 for line in frames), [line for line in frames if len(line) > 80]
    # Never wrapped: every line that shows the bar shows the job and its counts too.
    assert all("job 12345" in line and "objects" in line for line in frames), frames


def test_the_bar_takes_the_terminals_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        progress.shutil, "get_terminal_size", lambda fallback=(80, 24): os.terminal_size((80, 24))
    )
    assert progress.bar_console().width == 80
