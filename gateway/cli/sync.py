"""`gateway sync` (a mount's listing into the catalog, docs/catalog.md) and `gateway syncs`."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import click

from gateway.cli.door import run, with_meta
from gateway.cli.options import DB_OPTIONS, settings_from, settings_options
from gateway.meta import MetaStore


@click.command("sync")
@click.argument("target", metavar="BUCKET[/PREFIX]")
@click.option("--page-size", default=1000, show_default=True, help="Keys a listing request.")
@click.option(
    "--parallel", default=4, show_default=True,
    help="Sub-prefixes (PREFIX/name/) listed at once, where every key lies in one.",
)  # fmt: skip
@click.option("--quiet", "-q", is_flag=True, help="No progress bar; the summary line only.")
@settings_options(DB_OPTIONS)
def sync_command(target: str, page_size: int, parallel: int, quiet: bool, **kwargs: Any) -> None:
    """List BUCKET[/PREFIX] from its store into the catalog (docs/catalog.md).

    The catalog then answers listings, HEADs and cold GETs under PREFIX on every node. A run
    that stopped (Ctrl-C, a crash) resumes where it stopped; run again to re-sync, writing
    only what changed.
    """
    from gateway.admin import tell_node
    from gateway.catalog import Catalog, SyncBusy, SyncProgress, catalog_options, sync_parallel
    from gateway.service.namespace import store_options
    from gateway.stores import open_store

    bucket, _, prefix = target.partition("/")
    settings = settings_from(kwargs)

    async def work(meta: MetaStore) -> SyncProgress:
        mount = await meta.get_mount(bucket)
        if mount is None:
            raise click.ClickException(f"bucket {bucket!r} is not mounted")
        if catalog_options(mount.options) is None:
            raise click.ClickException(
                f"bucket {bucket!r} is mounted with the catalog off: mount it with -o catalog=on"
            )
        store = open_store(mount.uri, store_options(mount.options))
        try:
            with _SyncBar(target, quiet) as bar:
                done = await sync_parallel(
                    Catalog(meta.engine), mount.id, store, prefix, workers=parallel,
                    page_size=page_size, on_progress=bar.update,
                )  # fmt: skip
        finally:
            await store.close()
        tell_node(settings.effective_cache_dir)  # synced: the node's workers answer from it
        return done

    try:
        done = run(with_meta(settings, work))
    except SyncBusy as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        f"synced {target}: {done.listed} keys listed, {done.changed} written,"
        f" {done.removed} removed"
    )


@click.command("syncs")
@click.argument("bucket", required=False)
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
@settings_options(DB_OPTIONS)
def syncs_command(bucket: str | None, as_json: bool, **kwargs: Any) -> None:
    """The synced prefixes of catalog=on mounts (of BUCKET), and runs in progress."""
    from gateway.catalog import Catalog, sync_states

    async def read(meta: MetaStore) -> list[dict[str, Any]]:
        mounts = {m.id: m.bucket for m in await meta.list_mounts()}
        if bucket is not None and bucket not in mounts.values():
            raise click.ClickException(f"bucket {bucket!r} is not mounted")
        rows = []
        for state in await sync_states(Catalog(meta.engine)):
            if bucket is None or mounts.get(state.mount_id) == bucket:
                row = {"bucket": mounts.get(state.mount_id, "?"), **dataclasses.asdict(state)}
                rows.append({k: v.isoformat() if hasattr(v, "isoformat") else v
                             for k, v in row.items() if k != "mount_id"})  # fmt: skip
        return rows

    rows = run(with_meta(settings_from(kwargs), read))
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo("BUCKET\tPREFIX\tSYNCED\tRUNNING\tLISTED\tWRITTEN\tREMOVED")
    for r in rows:
        running = f"{r['owner'] or 'stopped'} at {r['cursor'] or '-'}" if r["started_at"] else "-"
        click.echo(
            f"{r['bucket']}\t{r['prefix'] or '(all)'}\t{r['synced_at'] or 'never'}\t{running}"
            f"\t{r['listed']}\t{r['changed']}\t{r['removed']}"
        )


class _SyncBar:
    """A sync's progress on the terminal (stderr), with rich: keys listed, written, removed."""

    def __init__(self, target: str, quiet: bool) -> None:
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            TextColumn("{task.completed:,} keys listed"),
            TextColumn("{task.fields[changed]:,} written, {task.fields[removed]:,} removed"),
            TextColumn("{task.fields[cursor]}", style="dim"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            disable=quiet,
        )
        self.task = self.progress.add_task(f"sync {target}", changed=0, removed=0, cursor="")

    def __enter__(self) -> _SyncBar:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def update(self, p: Any) -> None:
        where = "resumed" if p.resumed and not p.listed else (p.cursor or "")[-40:]
        self.progress.update(
            self.task, completed=p.listed, changed=p.changed, removed=p.removed, cursor=where
        )
