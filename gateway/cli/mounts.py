"""`gateway mount add|set|list|remove`: the mount table (bucket -> under-store URI)."""

from __future__ import annotations

import json
from typing import Any

import click

from gateway.cli.door import checked, run, validate_bucket, with_admin, with_meta
from gateway.cli.options import DB_OPTIONS, settings_from, settings_options
from gateway.meta import MountExists


def _parse_options(pairs: tuple[str, ...]) -> dict[str, str]:
    options: dict[str, str] = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        if not eq or not name:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--option")
        options[name] = value
    return options


_MOUNT_OPTIONS = [
    *DB_OPTIONS,
    ("cache_dir", "The node's cache folder, kept out of mounts; default <data-dir>/cache."),
]


@click.group("mount")
def mount() -> None:
    """Manage the mount table (bucket -> under-store URI)."""


@mount.command("add")
@click.argument("bucket")
@click.argument("uri")
@click.option("--option", "-o", "pairs", multiple=True, metavar="KEY=VALUE", help="Mount option.")
@click.option("--check/--no-check", default=True, show_default=True,
              help="List one key first: the store answers, takes the credentials, and its"
              " bucket or folder exists.")  # fmt: skip
@settings_options(_MOUNT_OPTIONS)
def mount_add(bucket: str, uri: str, pairs: tuple[str, ...], check: bool, **kwargs: Any) -> None:
    """Mount URI (file:///abs/path, s3://bucket[/prefix]) as BUCKET.

    The store is checked first (--no-check: not): a folder or bucket that is not there, a
    refused connection or refused credentials are said now, not at the first request.
    A file:// folder that holds the gateway's data dir or cache dir, or lies inside one, is
    refused: clients would read (and write) the gateway's database and secret key.
    """
    from gateway.admin import check_mount, reach_mount

    validate_bucket(bucket)
    options = _parse_options(pairs)
    settings = settings_from(kwargs)
    # Checked before the database is opened: a refused mount makes no node.
    checked(lambda: check_mount(uri, options, settings))
    if check:
        checked(lambda: reach_mount(bucket, uri, options))
    try:
        m = with_admin(
            settings, lambda ops: ops.add_mount(bucket, uri, options, settings, check=False)
        )
    except MountExists as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"mounted {m.bucket} -> {m.uri} {json.dumps(m.public_options())}")


@mount.command("set")
@click.argument("bucket")
@click.option("--option", "-o", "pairs", multiple=True, metavar="KEY=VALUE", help="Option to set.")
@click.option("--unset", multiple=True, metavar="KEY", help="Option to remove (its default then).")
@settings_options(_MOUNT_OPTIONS)
def mount_set(bucket: str, pairs: tuple[str, ...], unset: tuple[str, ...], **kwargs: Any) -> None:
    """Change options of the mount of BUCKET in place (its cache, versions and uploads stay).

    The options that result are checked as `mount add` checks them; nodes serve with them
    from their next refresh of the mounts.
    """
    if not pairs and not unset:
        raise click.UsageError("nothing to change: give -o KEY=VALUE or --unset KEY")
    changes = _parse_options(pairs)
    settings = settings_from(kwargs)
    m = with_admin(settings, lambda ops: ops.set_mount_options(bucket, changes, unset, settings))
    click.echo(f"changed {m.bucket} -> {m.uri} {json.dumps(m.public_options())}")


@mount.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
@settings_options(DB_OPTIONS)
def mount_list(as_json: bool, **kwargs: Any) -> None:
    """List mounts (secrets masked)."""
    mounts = run(with_meta(settings_from(kwargs), lambda meta: meta.list_mounts()))
    if as_json:
        rows = [{"bucket": m.bucket, "uri": m.uri, "options": m.public_options()} for m in mounts]
        click.echo(json.dumps(rows, indent=2))
        return
    for m in mounts:
        opts = " ".join(f"{k}={v}" for k, v in sorted(m.public_options().items()))
        click.echo(f"{m.bucket}\t{m.uri}\t{opts}".rstrip())


@mount.command("remove")
@click.argument("bucket")
@settings_options(DB_OPTIONS)
def mount_remove(bucket: str, **kwargs: Any) -> None:
    """Remove the mount of BUCKET (the under-store is not touched)."""
    with_admin(settings_from(kwargs), lambda ops: ops.remove_mount(bucket))
    click.echo(f"removed {bucket}")
