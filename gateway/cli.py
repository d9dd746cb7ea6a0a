"""`gateway` command line: serve, migrate, mount add|list|remove, keys create|list|delete.

Every option is also read from GATEWAY_<NAME> and from the TOML file named by --config;
flags win over the environment, which wins over the file (see docs/configuration.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import click

from gateway.config import Settings, build_settings
from gateway.meta import AccessKeyExists, MetaStore, MountExists
from gateway.service.buckets import bucket_name_problem
from gateway.service.namespace import store_options
from gateway.stores import open_store

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

_DB_OPTIONS: list[tuple[str, str]] = [
    ("data_dir", "Folder for the SQLite database, the cache and the generated encryption key."),
    ("database_url", "sqlite+aiosqlite:///... or postgresql://...; default: SQLite in data-dir."),
    ("encryption_key", "Fernet key(s) for secrets at rest, comma-separated (first encrypts)."),
    ("encryption_key_file", "File holding the Fernet key; default <data-dir>/secret.key."),
]
_SERVE_OPTIONS: list[tuple[str, str]] = [
    ("host", "Address to listen on."),
    ("port", "Port to listen on."),
    ("region", "Region the gateway reports and expects in signatures."),
    ("base_domain", "Domain for virtual-host style requests (BUCKET.<domain>)."),
    ("cache_dir", "Cache folder; default <data-dir>/cache."),
    ("cache_capacity", "Cache size budget, e.g. 10GiB."),
    ("cache_block_size", "Objects are cached in blocks of this size, e.g. 4MiB."),
    ("readahead_blocks", "Blocks fetched ahead of a sequential reader."),
    ("fill_concurrency", "Read-ahead fills in flight per worker process."),
    ("verify_sample", "Share of cache reads that re-check a block's checksum (0..1)."),
    ("workers", "Worker processes; they share the node's cache."),
    ("fleet_secret", "Shared secret of the fleet; set, the node joins it (docs/fleet.md)."),
    ("node_id", "This node's id in the fleet; default: kept in <data-dir>/node-id."),
    ("internal_port", "Port of the fleet's internal API; default: port + 1."),
    ("advertise_host", "Host name or address peers use to reach this node; default: host."),
    ("node_weight", "This node's share of the placement; default: cache capacity in GiB."),
    ("zone", "Failure zone; replicas prefer distinct zones."),
    ("heartbeat_interval", "Seconds between heartbeats to the database."),
    ("heartbeat_timeout", "Seconds of silence after which a node leaves the placement."),
    ("forward_timeout", "Seconds to wait for a peer to accept a connection before failing over."),
    ("cache_min_free", "Free disk space never to cross, e.g. 1GiB."),
    ("cache_memory", "Memory tier budget for small hot objects."),
    ("cache_memory_object_max", "Largest object kept in the memory tier."),
    ("metadata_ttl", "Default metadata TTL in seconds (0 always revalidate, -1 never)."),
    ("refresh_interval", "Seconds between re-reads of mounts and keys from the database."),
    ("bucket_store", "Where CreateBucket makes buckets: file:///dir or s3:// (none: refused)."),
    ("bucket_store_options", "Options of the bucket store: endpoint_url=...,secret_key=..."),
    ("multipart_max_age", "Seconds after which an unfinished multipart upload is aborted."),
    ("tls_cert", "Serve HTTPS: the certificate chain (PEM)."),
    ("tls_key", "Serve HTTPS: the private key (PEM)."),
    ("admin_access_key", "An access key to ensure at start (with --admin-secret-key)."),
    ("admin_secret_key", "The secret of --admin-access-key."),
    ("log_level", "debug, info, warning or error."),
]
_FLAGS: list[tuple[str, str]] = [
    ("access_log", "Log one JSON line per request."),
    ("demo", "Mount a folder of sample files as bucket 'demo' if it is not mounted."),
]


def _options(names: list[tuple[str, str]], flags: list[tuple[str, str]] = ()) -> Callable[[F], F]:  # type: ignore[assignment]
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


def _settings(kwargs: dict[str, Any]) -> Settings:
    config = kwargs.pop("config", None)
    try:
        return build_settings(kwargs, config)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def _with_meta(settings: Settings, work: Callable[[MetaStore], Coroutine[Any, Any, T]]) -> T:
    from gateway.app import open_meta

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    meta = open_meta(settings)
    try:
        await meta.migrate()
        return await work(meta)
    finally:
        await meta.close()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """An S3-compatible caching gateway over object stores, HDFS and local files."""


# -- serve / migrate ---------------------------------------------------------------------


@main.command()
@_options(_DB_OPTIONS + _SERVE_OPTIONS, _FLAGS)
def serve(**kwargs: Any) -> None:
    """Run one gateway node."""
    import uvicorn

    from gateway.app import SETTINGS_ENV, Node, settings_to_json
    from gateway.logs import setup_logging
    from gateway.metrics import prepare_shared_dir

    settings = _settings(kwargs)
    setup_logging(settings.log_level)
    banner = _run(_with_meta(settings, lambda meta: _bootstrap(meta, settings)))
    click.echo(banner)
    sys.stdout.flush()
    if settings.workers > 1:
        # Each worker process builds its own Node from the settings resolved here, and
        # shares its metrics with the others (gateway/metrics.py).
        os.environ[SETTINGS_ENV] = settings_to_json(settings)
        prepare_shared_dir(Path(settings.data_dir))
        app: Any = "gateway.app:node_from_environment"
    else:
        app = Node(settings)
    config = uvicorn.Config(
        app,
        factory=settings.workers > 1,
        workers=settings.workers,
        host=settings.host,
        port=settings.port,
        lifespan="on",
        access_log=False,
        log_config=None,
        server_header=False,
        timeout_graceful_shutdown=10,
        ssl_certfile=settings.tls_cert,
        ssl_keyfile=settings.tls_key,
    )
    sockets = [config.bind_socket()]
    if settings.fleet_secret:
        # The fleet's internal API listens on a port of its own (gateway/internal.py).
        sockets.append(_bind(settings.host, settings.effective_internal_port))
    if settings.workers > 1:
        from uvicorn.supervisors import Multiprocess

        Multiprocess(config, sockets=sockets).run()
    else:
        config.load_app()
        server = uvicorn.Server(config)
        server.run(sockets=sockets)
        if not server.started:
            sys.exit(3)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc}") from None
    sock.set_inheritable(True)
    return sock


@main.command()
@_options(_DB_OPTIONS)
def migrate(**kwargs: Any) -> None:
    """Apply the database migrations (serve also does this at start)."""
    settings = _settings(kwargs)

    async def noop(meta: MetaStore) -> None:
        return None

    _run(_with_meta(settings, noop))
    click.echo(f"database at head: {_redact(settings.effective_database_url)}")


DEMO_FILES = {
    "README.txt": b"This bucket is a folder on the gateway's disk, mounted as s3://demo.\n",
    "hello.txt": b"hello, world\n",
    "data/numbers.csv": b"n,square\n" + b"".join(f"{i},{i * i}\n".encode() for i in range(100)),
    "data/nested/deep.txt": b"keys with slashes are folders on disk\n",
}


async def _bootstrap(meta: MetaStore, s: Settings) -> str:
    """Keys and the demo mount a fresh node needs; returns what to print for the user."""
    scheme = "https" if s.tls_cert else "http"
    lines = [f"gateway: S3 endpoint {scheme}://{s.host}:{s.port} (region {s.region})"]
    created = None
    if s.admin_access_key and s.admin_secret_key:
        existing = await meta.get_key(s.admin_access_key)
        if existing is None:
            await meta.create_key(s.admin_access_key, s.admin_secret_key, "admin (configured)")
        elif existing.secret_key != s.admin_secret_key:
            await meta.delete_key(s.admin_access_key)
            await meta.create_key(s.admin_access_key, s.admin_secret_key, "admin (configured)")
    keys = await meta.list_keys()
    if not keys:
        created = await meta.create_key(description="created at first start")
        keys = [created]
    if s.demo and await meta.get_mount("demo") is None:
        folder = (s.data_dir / "demo").resolve()
        for name, data in DEMO_FILES.items():
            path = folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                path.write_bytes(data)
        await meta.add_mount("demo", folder.as_uri(), {})
    key = created or keys[0]
    lines.append(f"  access key: {key.access_key}")
    if created is not None or s.demo:
        lines.append(f"  secret key: {key.secret_key}")
        lines.append(
            f"  try: AWS_ACCESS_KEY_ID={key.access_key} AWS_SECRET_ACCESS_KEY={key.secret_key} "
            f"aws --endpoint-url {scheme}://{s.host}:{s.port} s3 ls"
            + (" s3://demo/ --recursive" if s.demo else "")
        )
    else:
        lines.append(
            "  (its secret was printed when it was created; `gateway keys create` adds one)"
        )
    return "\n".join(lines)


def _redact(url: str) -> str:
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)


# -- mounts ------------------------------------------------------------------------------


def validate_bucket(name: str) -> None:
    problem = bucket_name_problem(name)
    if problem:
        raise click.BadParameter(f"{name!r}: {problem}", param_hint="BUCKET")


def _parse_options(pairs: tuple[str, ...]) -> dict[str, str]:
    options: dict[str, str] = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        if not eq or not name:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--option")
        options[name] = value
    return options


def _validate_mount(uri: str, options: dict[str, str]) -> None:
    """The store checks its own options and URI; the gateway checks the rest."""
    try:
        float(options.get("metadata_ttl", "0"))
        _run(open_store(uri, store_options(options)).close())
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="URI or --option") from None


@main.group()
def mount() -> None:
    """Manage the mount table (bucket -> under-store URI)."""


@mount.command("add")
@click.argument("bucket")
@click.argument("uri")
@click.option("--option", "-o", "pairs", multiple=True, metavar="KEY=VALUE", help="Mount option.")
@_options(_DB_OPTIONS)
def mount_add(bucket: str, uri: str, pairs: tuple[str, ...], **kwargs: Any) -> None:
    """Mount URI (file:///abs/path, s3://bucket[/prefix]) as BUCKET."""
    validate_bucket(bucket)
    options = _parse_options(pairs)
    _validate_mount(uri, options)
    settings = _settings(kwargs)
    try:
        m = _run(_with_meta(settings, lambda meta: meta.add_mount(bucket, uri, options)))
    except MountExists:
        raise click.ClickException(f"bucket {bucket!r} is already mounted") from None
    click.echo(f"mounted {m.bucket} -> {m.uri} {json.dumps(m.public_options())}")


@mount.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
@_options(_DB_OPTIONS)
def mount_list(as_json: bool, **kwargs: Any) -> None:
    """List mounts (secrets masked)."""
    mounts = _run(_with_meta(_settings(kwargs), lambda meta: meta.list_mounts()))
    if as_json:
        rows = [{"bucket": m.bucket, "uri": m.uri, "options": m.public_options()} for m in mounts]
        click.echo(json.dumps(rows, indent=2))
        return
    for m in mounts:
        opts = " ".join(f"{k}={v}" for k, v in sorted(m.public_options().items()))
        click.echo(f"{m.bucket}\t{m.uri}\t{opts}".rstrip())


@mount.command("remove")
@click.argument("bucket")
@_options(_DB_OPTIONS)
def mount_remove(bucket: str, **kwargs: Any) -> None:
    """Remove the mount of BUCKET (the under-store is not touched)."""
    if not _run(_with_meta(_settings(kwargs), lambda meta: meta.remove_mount(bucket))):
        raise click.ClickException(f"bucket {bucket!r} is not mounted")
    click.echo(f"removed {bucket}")


# -- keys --------------------------------------------------------------------------------


@main.group()
def keys() -> None:
    """Manage the access keys clients sign with."""


@keys.command("create")
@click.option("--access-key", default=None, help="Access key id (default: generated).")
@click.option("--secret-key", default=None, help="Secret (default: generated).")
@click.option("--description", default="", help="A note kept with the key.")
@_options(_DB_OPTIONS)
def keys_create(
    access_key: str | None, secret_key: str | None, description: str, **kwargs: Any
) -> None:
    """Create an access key and print it with its secret (the only time it is printed)."""
    settings = _settings(kwargs)
    try:
        key = _run(
            _with_meta(settings, lambda meta: meta.create_key(access_key, secret_key, description))
        )
    except AccessKeyExists:
        raise click.ClickException(f"access key {access_key!r} exists") from None
    click.echo(f"access key: {key.access_key}\nsecret key: {key.secret_key}")


@keys.command("list")
@_options(_DB_OPTIONS)
def keys_list(**kwargs: Any) -> None:
    """List access key ids (never their secrets)."""
    for key in _run(_with_meta(_settings(kwargs), lambda meta: meta.list_keys())):
        click.echo(f"{key.access_key}\t{key.created_at.isoformat()}\t{key.description}".rstrip())


@keys.command("delete")
@click.argument("access_key")
@_options(_DB_OPTIONS)
def keys_delete(access_key: str, **kwargs: Any) -> None:
    """Delete an access key; requests signed with it are refused within seconds."""
    if not _run(_with_meta(_settings(kwargs), lambda meta: meta.delete_key(access_key))):
        raise click.ClickException(f"no access key {access_key!r}")
    click.echo(f"deleted {access_key}")


# -- status ------------------------------------------------------------------------------

_STATUS_OPTIONS = [
    *_DB_OPTIONS,
    ("heartbeat_timeout", "Seconds of silence after which a node counts as lapsed."),
]


@main.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
@_options(_STATUS_OPTIONS)
def status(as_json: bool, **kwargs: Any) -> None:
    """List the fleet's nodes as the database knows them: live, lapsed or left."""
    from gateway.cluster import NodeRegistry
    from gateway.meta import MetaUnavailable

    settings = _settings(kwargs)

    async def read(meta: MetaStore) -> list[dict[str, Any]]:
        records = await NodeRegistry(meta.engine, settings.heartbeat_timeout).read()
        return [record.summary() for record in records]

    try:
        rows = _run(_with_meta(settings, read))
    except MetaUnavailable as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    elif not rows:
        click.echo("no node has joined the fleet yet (nodes join when `gateway serve` starts)")
    else:
        click.echo(_status_table(rows))


def _status_table(rows: list[dict[str, Any]]) -> str:
    table = [("NODE", "ADDRESS", "ZONE", "WEIGHT", "STATE", "HEARTBEAT", "CACHE", "HIT RATIO")]
    for row in rows:
        ratio = row["hit_ratio"]
        table.append(
            (
                row["id"],
                row["address"],
                row["zone"] or "-",
                f"{row['weight']:g}",
                row["state"],
                f"{row['heartbeat_age']:.1f}s ago",
                _size(row["cache_bytes"]),
                "-" if ratio is None else f"{ratio:.1%}",
            )
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in table
    ]
    live = sum(1 for row in rows if row["live"])
    lines.append(f"{live} of {len(rows)} nodes live")
    return "\n".join(lines)


def _size(count: int) -> str:
    """Bytes in binary units, as the size settings take them (64MiB, 10GiB)."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
