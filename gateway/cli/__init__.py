"""The `gateway` command line, a module per command group: serve and migrate, mount, keys,
users, policies, sync and syncs, status, load and jobs. Every change of mounts, users, keys,
policies and jobs goes through gateway/admin/ops.py (gateway/cli/door.py).

Every option is also read from GATEWAY_<NAME> and from the TOML file named by --config;
flags win over the environment, which wins over the file (see docs/configuration.md).
"""

from __future__ import annotations

import click

from gateway.cli import jobs, keys, mounts, policies, serve, status, sync, users
from gateway.cli.options import DATA_DIR_HELP

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=DATA_DIR_HELP)
def main() -> None:
    """An S3-compatible caching gateway over object stores, HDFS and local files."""


for command in (
    serve.serve, serve.migrate, mounts.mount, keys.keys, users.users, policies.policies,
    sync.sync_command, sync.syncs_command, status.status, jobs.load, jobs.jobs,
):  # fmt: skip
    main.add_command(command)
