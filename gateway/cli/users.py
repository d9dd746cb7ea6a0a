"""`gateway users create|list|delete` (docs/tenants.md)."""

from __future__ import annotations

import json
from typing import Any

import click

from gateway.cli.door import checked, run, with_admin, with_meta
from gateway.cli.options import DB_OPTIONS, settings_from, settings_options
from gateway.cli.policies import no_policy
from gateway.meta import InUse, NoSuchPolicy, NoSuchUser, UserExists


@click.group("users")
def users() -> None:
    """Manage users: each access key belongs to one, its policies say what it may do."""


@users.command("create")
@click.argument("name")
@click.option(
    "--policy", "policy_names", multiple=True,
    help="A policy to attach (repeatable; default: own, which may create buckets and do"
    " everything in the buckets it owns).",
)  # fmt: skip
@settings_options(DB_OPTIONS)
def users_create(name: str, policy_names: tuple[str, ...], **kwargs: Any) -> None:
    """Create user NAME (letters, digits and _+=,.@-, as IAM's user names)."""
    from gateway.admin import check_user_name

    checked(lambda: check_user_name(name))
    try:
        wanted = with_admin(settings_from(kwargs), lambda ops: ops.create_user(name, policy_names))
    except NoSuchPolicy as exc:
        raise no_policy(exc) from None
    except UserExists:
        raise click.ClickException(f"user {name!r} exists") from None
    click.echo(f"created user {name} with policies {', '.join(wanted)}")


@users.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
@settings_options(DB_OPTIONS)
def users_list(as_json: bool, **kwargs: Any) -> None:
    """List users with their policies, keys and buckets."""
    found = run(with_meta(settings_from(kwargs), lambda meta: meta.list_users()))
    rows = [
        {"name": u.name, "policies": list(u.policies), "keys": list(u.keys),
         "buckets": list(u.buckets), "created_at": u.created_at.isoformat()}
        for u in found
    ]  # fmt: skip
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        click.echo(
            f"{r['name']}\tpolicies={','.join(r['policies']) or '-'}"
            f"\tkeys={len(r['keys'])}\tbuckets={','.join(r['buckets']) or '-'}"
        )


@users.command("delete")
@click.argument("name")
@settings_options(DB_OPTIONS)
def users_delete(name: str, **kwargs: Any) -> None:
    """Delete user NAME and its keys (refused while it owns buckets)."""
    try:
        with_admin(settings_from(kwargs), lambda ops: ops.delete_user(name))
    except (NoSuchUser, InUse) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"deleted user {name}")
