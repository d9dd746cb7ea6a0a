"""How a command learns its settings: the options it takes, each also read from GATEWAY_<NAME>
and from the TOML file named by --config (flags win over the environment, which wins over the
file: docs/configuration.md), and the refusal to work on a node that is not there."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from gateway.config import Settings, build_settings, load_toml

F = TypeVar("F", bound=Callable[..., Any])


DB_OPTIONS: list[tuple[str, str]] = [
    (
        "data_dir",
        "The node's folder (SQLite database, cache, secret.key); default: the config file's"
        " data_dir, else ./data (commands but serve and migrate: if it holds a node).",
    ),
    ("database_url", "sqlite+aiosqlite:///... or postgresql://...; default: SQLite in data-dir."),
    ("encryption_key", "Fernet key(s) for secrets at rest, comma-separated (first encrypts)."),
    ("encryption_key_file", "File holding the Fernet key; default <data-dir>/secret.key."),
]


def settings_options(
    names: list[tuple[str, str]], flags: Sequence[tuple[str, str]] = ()
) -> Callable[[F], F]:
    """Give a command the settings `names` (and the on/off `flags`) as options, each also read
    from GATEWAY_<NAME>, and --config."""

    def deco(fn: F) -> F:
        for name, help_ in reversed(flags):
            opt = name.replace("_", "-")
            fn = click.option(
                f"--{opt}/--no-{opt}", name, default=None, envvar=f"GATEWAY_{name.upper()}",
                help=help_,
            )(fn)  # fmt: skip
        for name, help_ in reversed(names):
            fn = click.option(
                f"--{name.replace('_', '-')}", name, default=None,
                envvar=f"GATEWAY_{name.upper()}", help=help_, show_envvar=True,
            )(fn)  # fmt: skip
        return click.option(
            "--config", "config", type=click.Path(path_type=Path, dir_okay=False, exists=True),
            envvar="GATEWAY_CONFIG", help="TOML file of settings.",
        )(fn)  # fmt: skip

    return deco


def settings_from(kwargs: dict[str, Any]) -> Settings:
    """The settings of a command's options, its environment and its --config file."""
    config = kwargs.pop("config", None)
    try:
        settings = build_settings(kwargs, config)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    ctx = click.get_current_context(silent=True)
    if ctx is not None and "data_dir" in ctx.params:
        find_node(ctx, settings, config)
    return settings


# Commands that may make a node's database where there is none: serve and migrate anywhere,
# these only in a data dir named by --data-dir, GATEWAY_DATA_DIR or the config file.
_MAY_CREATE = {"mount add", "keys create", "users create", "policies create"}

DATA_DIR_HELP = """The node's data dir (its SQLite database, cache and secret.key) is the first of:
--data-dir, GATEWAY_DATA_DIR, data_dir in the TOML file of --config or GATEWAY_CONFIG, and
./data if it holds a node. A command that reads refuses, naming where it looked, rather than
make an empty node; with --database-url postgresql://... the data dir holds only the key."""


def find_node(ctx: click.Context, settings: Settings, config: Path | None) -> None:
    """Refuse to work on a node that is not there: a command run from another folder would
    otherwise make a fresh database (and secret key) in ./data and report on that."""
    from gateway.meta.engine import sqlite_path

    command = ctx.command_path.partition(" ")[2]
    if command in ("serve", "migrate"):
        return
    database = sqlite_path(settings.effective_database_url)
    if database is None or database.exists():
        return  # PostgreSQL (or SQLite in memory), or a node's SQLite file: found
    source = ctx.get_parameter_source("data_dir")
    named = source in (click.core.ParameterSource.COMMANDLINE,
                       click.core.ParameterSource.ENVIRONMENT)  # fmt: skip
    from_file = config is not None and "data_dir" in load_toml(config)
    if (named or from_file) and command in _MAY_CREATE:
        return
    given = os.environ.get("GATEWAY_DATA_DIR")
    if config is None:
        in_file = "none (--config or GATEWAY_CONFIG)"
    else:
        in_file = f"{config}, " + (f"data_dir {settings.data_dir}" if from_file else "no data_dir")
    looked = [
        "--data-dir: "
        + (
            str(settings.data_dir)
            if source is click.core.ParameterSource.COMMANDLINE
            else "not given"
        ),
        "GATEWAY_DATA_DIR: " + (given if given is not None else "not set"),
        "config file: " + in_file,
    ]
    where = str(database.parent.absolute()) + ("" if named or from_file else " (the default)")
    raise click.ClickException(
        f"no gateway node: {where} holds no {database.name}.\n  looked at "
        + "; ".join(looked)
        + "\n  Name the node's data dir with --data-dir or GATEWAY_DATA_DIR (`scripts/serve` uses"
        " data/ in its checkout), or its database with --database-url."
    )
