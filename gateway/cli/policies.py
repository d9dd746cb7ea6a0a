"""`gateway policies create|delete|attach|detach|list`: the built-in policies and custom IAM
documents, and which users hold them (docs/tenants.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from gateway.cli.door import checked, run, with_admin, with_meta
from gateway.cli.options import DB_OPTIONS, settings_from, settings_options
from gateway.meta import InUse, MetaStore, NoSuchPolicy, NoSuchUser, PolicyExists


def no_policy(exc: NoSuchPolicy) -> click.ClickException:
    """What the CLI says of a policy that is neither built in nor stored."""
    from gateway.iam import BUILTIN

    return click.ClickException(
        f"{exc}: the built-in ones are {', '.join(BUILTIN)}; `gateway policies create` makes others"
    )


@click.group("policies")
def policies() -> None:
    """Manage policies: the built-in own, readonly, readwrite, admin, and custom documents in
    the IAM JSON grammar."""


@policies.command("create")
@click.argument("name")
@click.argument("document", metavar="FILE|JSON")
@settings_options(DB_OPTIONS)
def policies_create(name: str, document: str, **kwargs: Any) -> None:
    """Create policy NAME from a JSON document, given inline or as a file ('-': stdin)."""
    from gateway.admin import check_policy_document, check_policy_name
    from gateway.iam import MalformedPolicy

    checked(lambda: check_policy_name(name))
    if document == "-":
        text = sys.stdin.read()
    elif document.lstrip().startswith("{"):
        text = document
    else:
        try:
            text = Path(document).read_text()
        except OSError as exc:
            raise click.BadParameter(str(exc), param_hint="FILE|JSON") from None
    try:
        check_policy_document(text)
    except MalformedPolicy as exc:
        raise click.ClickException(f"MalformedPolicy: {exc}") from None
    try:
        with_admin(settings_from(kwargs), lambda ops: ops.create_policy(name, text))
    except PolicyExists:
        raise click.ClickException(f"policy {name!r} exists") from None
    click.echo(f"created policy {name}")


@policies.command("delete")
@click.argument("name")
@settings_options(DB_OPTIONS)
def policies_delete(name: str, **kwargs: Any) -> None:
    """Delete custom policy NAME (refused while a user holds it)."""
    try:
        with_admin(settings_from(kwargs), lambda ops: ops.delete_policy(name))
    except (NoSuchPolicy, InUse) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"deleted policy {name}")


@policies.command("attach")
@click.argument("policy")
@click.option("--user", required=True, help="The user to attach it to.")
@settings_options(DB_OPTIONS)
def policies_attach(policy: str, user: str, **kwargs: Any) -> None:
    """Attach POLICY to a user (effective on every node within refresh_interval)."""
    try:
        added = with_admin(settings_from(kwargs), lambda ops: ops.attach_policy(user, policy))
    except NoSuchPolicy as exc:
        raise no_policy(exc) from None
    except NoSuchUser as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"attached {policy} to {user}" if added else f"{user} holds {policy} already")


@policies.command("detach")
@click.argument("policy")
@click.option("--user", required=True, help="The user to detach it from.")
@settings_options(DB_OPTIONS)
def policies_detach(policy: str, user: str, **kwargs: Any) -> None:
    """Detach POLICY from a user."""
    try:
        gone = with_admin(settings_from(kwargs), lambda ops: ops.detach_policy(user, policy))
    except NoSuchUser as exc:
        raise click.ClickException(str(exc)) from None
    if not gone:
        raise click.ClickException(f"{user} does not hold {policy}")
    click.echo(f"detached {policy} from {user}")


@policies.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON document, with the documents.")
@settings_options(DB_OPTIONS)
def policies_list(as_json: bool, **kwargs: Any) -> None:
    """List the built-in and custom policies, and who holds each."""
    from gateway.iam import BUILTIN, builtin_document

    async def read(meta: MetaStore) -> tuple[dict[str, str], list[Any]]:
        return await meta.custom_policies(), await meta.list_users()

    custom, found = run(with_meta(settings_from(kwargs), read))
    docs = {name: builtin_document(name) or "" for name in BUILTIN} | custom
    rows = [
        {"name": name, "builtin": name in BUILTIN,
         "users": [u.name for u in found if name in u.policies], "document": json.loads(text)}
        for name, text in sorted(docs.items())
    ]  # fmt: skip
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        kind = "built-in" if r["builtin"] else "custom"
        click.echo(f"{r['name']}\t{kind}\tusers={','.join(r['users']) or '-'}")
