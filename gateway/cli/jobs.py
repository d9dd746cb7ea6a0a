"""`gateway load` and `gateway jobs list|show|wait|cancel`: preload jobs, over a node's API or
the database; gateway/jobs/commands.py does the work."""

from __future__ import annotations

import sys
from typing import Any

import click

from gateway.cli.door import validate_bucket
from gateway.cli.options import DB_OPTIONS, F, settings_from, settings_options
from gateway.jobs.model import DEFAULT_CONCURRENCY, MAX_CONCURRENCY
from gateway.meta import open_meta

_JOB_CLIENT_OPTIONS: list[tuple[str, str]] = [
    *DB_OPTIONS,
]


def _job_client(fn: F) -> F:
    """How a jobs command reaches the jobs: --endpoint (a node's API, signed with an admin
    key) or the database (--database-url, as the other commands)."""
    fn = click.option(
        "--format", "fmt", type=click.Choice(["text", "json"]), default="text",
        help="text for people, json for scripts.",
    )(fn)  # fmt: skip
    fn = click.option("--region", default="us-east-1", envvar="AWS_REGION",
                      help="Region to sign for (with --endpoint).")(fn)  # fmt: skip
    fn = click.option("--secret-key", envvar="AWS_SECRET_ACCESS_KEY", default=None,
                      help="Secret of the admin key (with --endpoint).")(fn)  # fmt: skip
    fn = click.option("--access-key", envvar="AWS_ACCESS_KEY_ID", default=None,
                      help="An admin access key (with --endpoint).")(fn)  # fmt: skip
    fn = click.option("--endpoint", envvar="GATEWAY_ENDPOINT", default=None,
                      help="A node's URL: use its API instead of the database.")(fn)  # fmt: skip
    return settings_options(_JOB_CLIENT_OPTIONS)(fn)


def _connect(kwargs: dict[str, Any]) -> tuple[Any, bool]:
    """A connect() for gateway.jobs.commands, and whether the output is JSON."""
    from gateway.admin import Administration
    from gateway.jobs.client import DatabaseClient, HttpClient, JobsClient

    endpoint = kwargs.pop("endpoint")
    access_key, secret_key = kwargs.pop("access_key"), kwargs.pop("secret_key")
    region = kwargs.pop("region")
    as_json = kwargs.pop("fmt") == "json"
    if endpoint:
        if not access_key or not secret_key:
            raise click.UsageError(
                "--endpoint needs an admin key: --access-key and --secret-key "
                "(or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
            )

        async def over_http() -> JobsClient:
            return HttpClient(endpoint, access_key, secret_key, region)

        return over_http, as_json
    settings = settings_from(kwargs)

    async def over_database() -> JobsClient:
        from gateway.datadir import DIR_MODE, private_umask

        private_umask()
        settings.data_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        meta = open_meta(settings)
        await meta.migrate()
        return DatabaseClient(meta, Administration(meta))

    return over_database, as_json


@click.command("load")
@click.argument("target", metavar="BUCKET[/PREFIX]")
@click.option("--pin", is_flag=True, help="Keep what is loaded from eviction.")
@click.option("--replicas", type=click.IntRange(1, 8), default=1,
              help="Fill the first N owners of each block.")  # fmt: skip
@click.option("--concurrency", type=click.IntRange(1, MAX_CONCURRENCY),
              default=DEFAULT_CONCURRENCY, show_default=True,
              help="Blocks in flight per node.")  # fmt: skip
@click.option("--bandwidth", default=None, metavar="RATE",
              help="Fleet-wide limit, e.g. 200MiB/s.")  # fmt: skip
@click.option("--include", multiple=True, metavar="GLOB",
              help="Only keys (after the prefix) matching one of these.")  # fmt: skip
@click.option("--exclude", multiple=True, metavar="GLOB",
              help="Leave out keys (after the prefix) matching any of these.")  # fmt: skip
@click.option("--verify", is_flag=True, help="Count what is cached, per node; load nothing.")
@click.option("--metadata-only", is_flag=True, help="Learn versions and sizes; no bytes.")
@click.option("--refresh", is_flag=True, help="Reload objects whose version changed.")
@click.option("--unpin", is_flag=True,
              help="Load nothing: take the pins off what every node has cached.")  # fmt: skip
@click.option("--detach", is_flag=True, help="Print the job's id and return.")
@_job_client
def load(
    target: str, pin: bool, replicas: int, concurrency: int, bandwidth: str | None,
    include: tuple[str, ...], exclude: tuple[str, ...], verify: bool, metadata_only: bool,
    refresh: bool, unpin: bool, detach: bool, **kwargs: Any,
) -> None:  # fmt: skip
    """Load BUCKET[/PREFIX] into the fleet's caches, each node the blocks it owns.

    Shows a progress bar until the job ends (Ctrl-C: cancel or detach). Exit status: 0 done,
    1 failed, 3 partial (not everything fit or loaded), 4 cancelled.

    --unpin undoes --pin: every node unpins the blocks of the prefix it has cached, which
    stay cached as ordinary blocks the cache may evict (exit 3: some node's pins stay, as
    when it was down).
    """
    from gateway.jobs import commands
    from gateway.jobs.model import JobSpec, parse_bandwidth

    bucket, _, prefix = target.removeprefix("s3://").partition("/")
    validate_bucket(bucket)
    try:
        spec = JobSpec(
            bucket, prefix, include=include, exclude=exclude, replicas=replicas,
            concurrency=concurrency,
            bandwidth=parse_bandwidth(bandwidth) if bandwidth else None,
            pin=pin, verify=verify, metadata_only=metadata_only, refresh=refresh,
            unpin=unpin,
        )  # fmt: skip
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    connect, as_json = _connect(kwargs)
    sys.exit(commands.load(connect, spec, detach=detach, as_json=as_json))


@click.group("jobs")
def jobs() -> None:
    """Preload jobs: list, show, wait for, cancel."""


@jobs.command("list")
@click.option("--limit", type=click.IntRange(1, 1000), default=50, help="The newest N.")
@_job_client
def jobs_list(limit: int, **kwargs: Any) -> None:
    """The newest jobs, with their state and progress."""
    from gateway.jobs import commands

    connect, as_json = _connect(kwargs)
    sys.exit(commands.list_jobs(connect, as_json=as_json, limit=limit))


@jobs.command("show")
@click.argument("job_id", type=int, metavar="ID")
@_job_client
def jobs_show(job_id: int, **kwargs: Any) -> None:
    """One job: options, progress per node, first errors."""
    from gateway.jobs import commands

    connect, as_json = _connect(kwargs)
    sys.exit(commands.show(connect, job_id, as_json=as_json))


@jobs.command("wait")
@click.argument("job_id", type=int, metavar="ID")
@_job_client
def jobs_wait(job_id: int, **kwargs: Any) -> None:
    """Follow a job to its end (the same bar as `load`); exits as `load` does."""
    from gateway.jobs import commands

    connect, as_json = _connect(kwargs)
    sys.exit(commands.wait(connect, job_id, as_json=as_json))


@jobs.command("cancel")
@click.argument("job_id", type=int, metavar="ID")
@_job_client
def jobs_cancel(job_id: int, **kwargs: Any) -> None:
    """Cancel a job; what it loaded stays cached."""
    from gateway.jobs import commands

    connect, as_json = _connect(kwargs)
    sys.exit(commands.cancel(connect, job_id, as_json=as_json))
