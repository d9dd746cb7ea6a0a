"""How a command works on the node: over its database, and through the one door for
administration (gateway/admin/ops.py), what it refuses said as the command's error."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import click

from gateway.config import Settings
from gateway.meta import MetaStore, open_meta

if TYPE_CHECKING:
    from gateway.admin import Administration

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def with_meta(settings: Settings, work: Callable[[MetaStore], Coroutine[Any, Any, T]]) -> T:
    from gateway.admin import tell_node
    from gateway.datadir import DIR_MODE, private_umask

    private_umask()  # the database, and the key file, the node's alone (gateway/datadir.py)
    settings.data_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    meta = open_meta(settings)
    # A change tells the workers of a node over this data dir (gateway/admin/ops.py).
    meta.on_change = functools.partial(tell_node, settings.effective_cache_dir)
    try:
        await meta.migrate()
        return await work(meta)
    finally:
        await meta.close()


def with_admin(settings: Settings, work: Callable[[Administration], Coroutine[Any, Any, T]]) -> T:
    """Run `work` through the one door for administration (gateway/admin/ops.py), over the
    node's database; what it refuses is said as the command's error (exit 2 for a malformed
    argument, else 1)."""
    from gateway.admin import AdminError, Administration, Invalid

    try:
        return run(with_meta(settings, lambda meta: work(Administration(meta))))
    except Invalid as exc:
        raise click.BadParameter(str(exc), param_hint=exc.param) from None
    except AdminError as exc:
        raise click.ClickException(str(exc)) from None


def checked(check: Callable[[], Any]) -> None:
    """A check of gateway/admin/ops.py made before any database is opened, as its error."""
    from gateway.admin import AdminError, Invalid

    try:
        result = check()
        if asyncio.iscoroutine(result):
            run(result)
    except Invalid as exc:
        raise click.BadParameter(str(exc), param_hint=exc.param) from None
    except AdminError as exc:
        raise click.ClickException(str(exc)) from None


def validate_bucket(name: str) -> None:
    """A bucket name S3 takes, or the command's error (exit 2)."""
    from gateway.admin import check_bucket_name

    checked(lambda: check_bucket_name(name))
