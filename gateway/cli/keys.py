"""`gateway keys create|list|delete|disable|enable`: the access keys clients sign with."""

from __future__ import annotations

import json
from typing import Any

import click

from gateway.cli.door import run, with_admin, with_meta
from gateway.cli.options import DB_OPTIONS, settings_from, settings_options
from gateway.meta import ADMIN_USER, AccessKeyExists, MetaStore, NoSuchUser


@click.group("keys")
def keys() -> None:
    """Manage the access keys clients sign with."""


@keys.command("create")
@click.option("--access-key", default=None, help="Access key id (default: generated).")
@click.option("--secret-key", default=None, help="Secret (default: generated).")
@click.option("--description", default="", help="A note kept with the key.")
@click.option(
    "--admin", is_flag=True,
    help="May also use the operator API (/_gateway/jobs) and sign in to the console.",
)  # fmt: skip
@click.option("--user", default=None, help="The user it belongs to (default: admin).")
@settings_options(DB_OPTIONS)
def keys_create(
    access_key: str | None,
    secret_key: str | None,
    description: str,
    admin: bool,
    user: str | None,
    **kwargs: Any,
) -> None:
    """Create an access key and print it with its secret (the only time it is printed)."""
    settings = settings_from(kwargs)
    try:
        key = with_admin(
            settings,
            lambda ops: ops.create_key(access_key, secret_key, description, admin=admin, user=user),
        )
    except AccessKeyExists:
        raise click.ClickException(f"access key {access_key!r} exists") from None
    except NoSuchUser:
        raise click.ClickException(f"no user {user!r}: `gateway users create` it") from None
    click.echo(f"access key: {key.access_key}\nsecret key: {key.secret_key}")
    owner = user or ADMIN_USER
    if admin:
        may = (
            f"S3 as user {owner} (its policies), and the operator API and the console"
            " (an admin key)"
        )
    else:
        may = (
            f"S3 as user {owner} (its policies); not the operator API or the console:"
            " `keys create --admin` makes a key that may"
        )
    click.echo(f"user: {owner}\nmay: {may}")


@keys.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
@settings_options(DB_OPTIONS)
def keys_list(as_json: bool, **kwargs: Any) -> None:
    """List access key ids (never their secrets), each with its user and state: tab-separated
    key, created, admin or -, user, enabled or disabled, description."""

    async def read(meta: MetaStore) -> tuple[list[Any], dict[int, str]]:
        users = {u.id: u.name for u in await meta.list_users()}
        return await meta.list_keys(), users

    found, names = run(with_meta(settings_from(kwargs), read))
    rows = [
        {"access_key": key.access_key, "created_at": key.created_at.isoformat(),
         "admin": key.admin,
         "user": ADMIN_USER if key.user_id is None else names.get(key.user_id, "?"),
         "state": "disabled" if key.disabled else "enabled", "description": key.description}
        for key in found
    ]  # fmt: skip
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        role = "admin" if r["admin"] else "-"
        line = (
            f"{r['access_key']}\t{r['created_at']}\t{role}\t{r['user']}\t{r['state']}"
            f"\t{r['description']}"
        )
        click.echo(line.rstrip())


@keys.command("delete")
@click.argument("access_key")
@settings_options(DB_OPTIONS)
def keys_delete(access_key: str, **kwargs: Any) -> None:
    """Delete an access key; requests signed with it are refused within seconds."""
    if not with_admin(settings_from(kwargs), lambda ops: ops.delete_key(access_key)):
        raise click.ClickException(f"no access key {access_key!r}")
    click.echo(f"deleted {access_key}")


def _set_disabled(access_key: str, disabled: bool, kwargs: dict[str, Any]) -> None:
    if not with_admin(
        settings_from(kwargs), lambda ops: ops.set_key_disabled(access_key, disabled)
    ):
        raise click.ClickException(f"no access key {access_key!r}")
    click.echo(f"{'disabled' if disabled else 'enabled'} {access_key}")


@keys.command("disable")
@click.argument("access_key")
@settings_options(DB_OPTIONS)
def keys_disable(access_key: str, **kwargs: Any) -> None:
    """Disable an access key: requests signed with it (S3, the jobs API) and the console's
    sign-ins and sessions are refused within --refresh-interval seconds, on every node, until
    `gateway keys enable` (the key and its secret are kept)."""
    _set_disabled(access_key, True, kwargs)


@keys.command("enable")
@click.argument("access_key")
@settings_options(DB_OPTIONS)
def keys_enable(access_key: str, **kwargs: Any) -> None:
    """Enable a disabled access key again (with the secret it had)."""
    _set_disabled(access_key, False, kwargs)
