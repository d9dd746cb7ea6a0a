"""What `gateway load` and `gateway jobs ...` do, given a way to reach the jobs (the database
or a node's API); gateway/cli/jobs.py holds only their options. Each returns the exit status."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

import click

from gateway.jobs import progress
from gateway.jobs.client import JobsClient, JobsError
from gateway.jobs.model import CANCELLED, EXIT_STATUS, JobSpec, JobView

T = TypeVar("T")
Connect = Callable[[], Awaitable[JobsClient]]


def _use(connect: Connect, work: Callable[[JobsClient], Awaitable[T]]) -> T:
    async def go() -> T:
        client = await connect()
        try:
            return await work(client)
        finally:
            await client.close()

    try:
        return asyncio.run(go())
    except JobsError as exc:
        raise click.ClickException(str(exc)) from None


def _emit(job: JobView, as_json: bool, text: str) -> None:
    click.echo(json.dumps(job.to_json(), indent=2) if as_json else text)


def load(connect: Connect, spec: JobSpec, *, detach: bool, as_json: bool) -> int:
    job = _use(connect, lambda c: c.submit(spec))
    if detach:
        _emit(job, as_json, str(job.id))
        return 0
    if not as_json:
        click.echo(f"job {job.id}: {spec.kind} s3://{spec.bucket}/{spec.prefix}", err=True)
    return wait(connect, job.id, as_json=as_json)


def wait(connect: Connect, job_id: int, *, as_json: bool) -> int:
    """Follow the job to its end; Ctrl-C asks whether to cancel it or to detach."""
    console = progress.bar_console(stderr=as_json)

    async def look(client: JobsClient) -> JobView:
        return await progress.follow(job_id, client.get, console, sleep=asyncio.sleep)

    try:
        job = _use(connect, look)
    except LookupError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        choice = "detach"
        if sys.stdin.isatty():
            try:
                choice = click.prompt(
                    f"\njob {job_id} goes on: cancel it, or detach from it?",
                    type=click.Choice(["cancel", "detach"]), default="detach",
                )  # fmt: skip
            except (click.Abort, EOFError, KeyboardInterrupt):
                choice = "detach"
        if choice == "cancel":
            cancel(connect, job_id, as_json=as_json)
            return EXIT_STATUS[CANCELLED]
        click.echo(f"\ndetached: job {job_id} goes on (gateway jobs wait {job_id})", err=True)
        return 0
    _emit(job, as_json, progress.summary(job))
    return EXIT_STATUS.get(job.state, 1)


def show(connect: Connect, job_id: int, *, as_json: bool) -> int:
    job = _use(connect, lambda c: c.get(job_id))
    if job is None:
        raise click.ClickException(f"no job {job_id}")
    _emit(job, as_json, progress.detail(job))
    return 0


def list_jobs(connect: Connect, *, as_json: bool, limit: int) -> int:
    jobs = _use(connect, lambda c: c.recent(limit))
    if as_json:
        click.echo(json.dumps([j.to_json() for j in jobs], indent=2))
    elif not jobs:
        click.echo("no jobs (gateway load BUCKET/PREFIX submits one)")
    else:
        click.echo(progress.jobs_table(jobs))
    return 0


def cancel(connect: Connect, job_id: int, *, as_json: bool) -> int:
    job = _use(connect, lambda c: c.cancel(job_id))
    if job is None:
        raise click.ClickException(f"no job {job_id}")
    _emit(job, as_json, f"job {job.id} {job.state}")
    return 0
