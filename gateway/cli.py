"""`gateway` command line: serve, migrate, mount add|list|remove,
keys create|list|delete|disable|enable,
users create|list|delete, policies create|delete|attach|detach|list|show, status, load,
jobs list|show|wait|cancel.

Every option is also read from GATEWAY_<NAME> and from the TOML file named by --config;
flags win over the environment, which wins over the file (see docs/configuration.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import os
import re
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from gateway.cluster import NodeFigures

from gateway.config import Settings, build_settings, cpu_cores, load_toml
from gateway.meta import (
    ADMIN_USER,
    AccessKeyExists,
    InUse,
    MetaStore,
    MountExists,
    NoSuchPolicy,
    NoSuchUser,
    PolicyExists,
    UserExists,
    open_meta,
)

if TYPE_CHECKING:
    from gateway.admin import Administration

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

_DB_OPTIONS: list[tuple[str, str]] = [
    (
        "data_dir",
        "The node's folder (SQLite database, cache, secret.key); default: the config file's"
        " data_dir, else ./data (commands but serve and migrate: if it holds a node).",
    ),
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
    ("cache_sub_block_size", "Random small ranges fill pieces of a block this size (0: off)."),
    ("readahead_blocks", "Blocks fetched ahead of a sequential reader."),
    ("fill_concurrency", "Read-ahead fills in flight per worker process."),
    ("verify_sample", "Share of cache reads that re-check a block's checksum (0..1)."),
    ("zero_copy_recheck", "Seconds a checked block is sent from its file unread (0: off)."),
    ("workers", "Worker processes; they share the node's cache. Default: one per core."),
    ("server", "HTTP server: gateway (the node's own, default) or uvicorn (plain ASGI)."),
    ("database_connections", "PostgreSQL connections the workers pool together (2+ each)."),
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
    ("write_lease", "Seconds a node's own store upload stays claimed unrenewed (then aborted)."),
    ("job_takeover_delay", "Seconds a node is gone before others take over its job shares."),
    ("tls_cert", "Serve HTTPS: the certificate chain (PEM)."),
    ("tls_key", "Serve HTTPS: the private key (PEM)."),
    ("fleet_ca", "CA bundle (PEM) peers' certificates are checked against; default: system's."),
    ("max_request_line", "Largest request target (path and query), e.g. 16KiB: 414 past it."),
    ("max_header_bytes", "Largest header section (names and values), e.g. 32KiB: 431 past it."),
    ("max_headers", "Most header fields in one request: 431 past it."),
    ("head_timeout", "Seconds to receive a request head: 408 past it (silent: closed)."),
    ("keepalive_timeout", "Seconds an idle connection is kept open between requests."),
    ("body_timeout", "Seconds a request body may send nothing: 408 past it (own server)."),
    ("max_connections", "Open connections per port and worker: 503 SlowDown past it."),
    ("local_socket", "Unix socket for short-circuit reads (default: <data-dir>/gateway.sock)."),
    ("local_socket_uids", "Uids that may read cache files through it (default: the node's)."),
    ("admin_access_key", "An access key to ensure at start (with --admin-secret-key)."),
    ("admin_secret_key", "The secret of --admin-access-key."),
    ("log_level", "debug, info, warning or error."),
]
_FLAGS: list[tuple[str, str]] = [
    ("access_log", "Log one JSON line per request."),
    ("fast_hits", "Answer plain GETs of small objects in memory at the HTTP edge."),
    ("short_circuit", "Hand cached block files to clients on this host (Unix socket)."),
    ("seal_blocks", "Seal cached block files (fs-verity) where the file system can."),
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
        settings = build_settings(kwargs, config)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    ctx = click.get_current_context(silent=True)
    if ctx is not None and "data_dir" in ctx.params:
        _find_node(ctx, settings, config)
    return settings


# Commands that may make a node's database where there is none: serve and migrate anywhere,
# these only in a data dir named by --data-dir, GATEWAY_DATA_DIR or the config file.
_MAY_CREATE = {"mount add", "keys create", "users create", "policies create"}

_DATA_DIR_HELP = """The node's data dir (its SQLite database, cache and secret.key) is the first of:
--data-dir, GATEWAY_DATA_DIR, data_dir in the TOML file of --config or GATEWAY_CONFIG, and
./data if it holds a node. A command that reads refuses, naming where it looked, rather than
make an empty node; with --database-url postgresql://... the data dir holds only the key."""


def _find_node(ctx: click.Context, settings: Settings, config: Path | None) -> None:
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


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def _make_private(settings: Settings) -> None:
    """The data dir and the cache are the node's alone (gateway/datadir.py), or no start."""
    from gateway.datadir import NotPrivate, make_private

    socket = settings.effective_local_socket if settings.short_circuit else None
    try:
        repaired = make_private(settings.data_dir, settings.effective_cache_dir, socket)
    except NotPrivate as exc:
        raise click.ClickException(str(exc)) from None
    if repaired:
        logging.getLogger("gateway").warning(
            "made %d files and folders of the node private (first: %s, was %04o)",
            len(repaired), repaired[0].path, repaired[0].was,
        )  # fmt: skip


async def _with_meta(settings: Settings, work: Callable[[MetaStore], Coroutine[Any, Any, T]]) -> T:
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


def _with_admin(settings: Settings, work: Callable[[Administration], Coroutine[Any, Any, T]]) -> T:
    """Run `work` through the one door for administration (gateway/admin/ops.py), over the
    node's database; what it refuses is said as the command's error (exit 2 for a malformed
    argument, else 1)."""
    from gateway.admin import AdminError, Administration, Invalid

    try:
        return _run(_with_meta(settings, lambda meta: work(Administration(meta))))
    except Invalid as exc:
        raise click.BadParameter(str(exc), param_hint=exc.param) from None
    except AdminError as exc:
        raise click.ClickException(str(exc)) from None


def _checked(check: Callable[[], Any]) -> None:
    """A check of gateway/admin/ops.py made before any database is opened, as its error."""
    from gateway.admin import AdminError, Invalid

    try:
        result = check()
        if asyncio.iscoroutine(result):
            _run(result)
    except Invalid as exc:
        raise click.BadParameter(str(exc), param_hint=exc.param) from None
    except AdminError as exc:
        raise click.ClickException(str(exc)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=_DATA_DIR_HELP)
def main() -> None:
    """An S3-compatible caching gateway over object stores, HDFS and local files."""


# -- serve / migrate ---------------------------------------------------------------------


@main.command()
@_options(_DB_OPTIONS + _SERVE_OPTIONS, _FLAGS)
def serve(**kwargs: Any) -> None:
    """Run one gateway node."""
    from gateway.datadir import prepare_metrics_dir
    from gateway.logs import setup_logging

    settings = _settings(kwargs)
    if settings.workers < 0:
        raise click.UsageError(f"--workers must be 0 (one per core) or more: {settings.workers}")
    if settings.workers == 0:
        settings = dataclasses.replace(settings, workers=cpu_cores())
    setup_logging(settings.log_level)
    _make_private(settings)
    if settings.workers > 1:
        # The workers share their metrics in a folder of the node (gateway/admin/metrics.py);
        # they are forked from this process, so prometheus_client, imported below, must find
        # the folder named in the environment when it is.
        prepare_metrics_dir(Path(settings.data_dir))
    from gateway.edge import EdgeLimits
    from gateway.node import SETTINGS_ENV, Node, node_from_environment, settings_to_json
    from gateway.service import learnt, listed

    if settings.server not in ("gateway", "uvicorn"):
        raise click.UsageError(f"--server must be gateway or uvicorn: {settings.server}")
    try:
        limits = EdgeLimits.from_settings(settings)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    learnt.reset(settings.effective_cache_dir)  # versions learnt by a run before this one
    listed.reset(settings.effective_cache_dir)  # and what its listings said
    banner, mounts = _run(_with_meta(settings, lambda meta: _bootstrap(meta, settings)))
    click.echo(banner)
    sys.stdout.flush()
    announce = threading.Thread(
        target=_announce, args=(settings, mounts), name="announce", daemon=True
    )
    if settings.workers > 1:
        # Each worker process builds its own Node from the settings resolved here, and
        # shares its metrics with the others (gateway/admin/metrics.py).
        os.environ[SETTINGS_ENV] = settings_to_json(settings)
    # Both listening sockets, the S3 port and the fleet's, have the same limits and TLS.
    sockets = [_bind(settings.host, settings.port)]
    if settings.fleet_secret:
        # The fleet's internal API listens on a port of its own (gateway/cluster/peer_api.py).
        sockets.append(_bind(settings.host, settings.effective_internal_port))
    try:
        if settings.server == "uvicorn":
            _serve_uvicorn(settings, limits, sockets, announce)
            return
        from gateway.server import ServerConfig, run_workers, serve_process

        config = ServerConfig(limits, ssl=_tls(settings), graceful_timeout=10.0)
        if settings.workers > 1:
            # The announcing thread starts once the workers are forked: they are forked from
            # a process with no other thread (gateway/server/).
            code = run_workers(
                node_from_environment, config, sockets, settings.workers, announce.start
            )
            if code:
                sys.exit(code)
        else:
            announce.start()
            if not serve_process(Node(settings), config, sockets):
                sys.exit(3)
    finally:
        _serving_file(settings).unlink(missing_ok=True)


def _tls(settings: Settings) -> ssl.SSLContext | None:
    """The server's TLS context, when the node has a certificate."""
    if settings.tls_cert is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    key = str(settings.tls_key) if settings.tls_key else None
    context.load_cert_chain(str(settings.tls_cert), key)
    return context


def _serve_uvicorn(
    settings: Settings, limits: Any, sockets: list[socket.socket], announce: threading.Thread
) -> None:
    """`--server uvicorn`: the plain-ASGI fallback (gateway/edge_uvicorn.py)."""

    from gateway.edge_uvicorn import EdgeConfig, EdgeServer, run_workers
    from gateway.node import Node

    # uvicorn says "running" when it binds, seconds before the workers answer: the node says
    # "serving" itself once it does (_announce).
    logging.getLogger("uvicorn.error").addFilter(_NotRunningYet())
    app: Any = "gateway.node:node_from_environment" if settings.workers > 1 else Node(settings)
    config = EdgeConfig(
        app,
        limits,
        factory=settings.workers > 1,
        workers=settings.workers,
        host=settings.host,
        port=settings.port,
        lifespan="on",
        access_log=False,
        log_config=None,
        server_header=False,
        timeout_graceful_shutdown=10,
        # A worker answers the supervisor's health pings only once it has built its node; on
        # a busy machine that takes longer than uvicorn's default of 5 s, and a worker killed
        # for it is started again, and again.
        timeout_worker_healthcheck=30,
        ssl_certfile=settings.tls_cert,
        ssl_keyfile=settings.tls_key,
    )
    if settings.workers > 1:
        run_workers(config, sockets, started=announce.start)
    else:
        announce.start()
        config.load_app()
        server = EdgeServer(config)
        server.run(sockets=sockets)
        if not server.started:
            sys.exit(3)


def _serving_file(settings: Settings) -> Path:
    return settings.data_dir / "serving.json"


def _lone_node(settings: Settings, buckets: dict[int, str]) -> dict[str, Any] | None:
    """The node serving over this data dir, as `gateway serve` recorded it, if its process
    still runs and it answers: a row like a fleet member's, as the console shows it, its
    cache figures read from its /metrics (a node in no fleet writes no heartbeats)."""
    import urllib.request

    from gateway.cluster import NodeFigures

    try:
        record = json.loads(_serving_file(settings).read_text())
        os.kill(record["pid"], 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    figures: dict[str, Any] = {**NodeFigures().summary(), "cache_bytes": None, "hit_ratio": None}
    try:
        with urllib.request.urlopen(record["health"], timeout=3) as answer:
            live = answer.status == 200
        metrics_url = record["health"].rsplit("/", 1)[0] + "/metrics"
        with urllib.request.urlopen(metrics_url, timeout=5) as answer:
            figures = _figures_from_metrics(answer.read().decode(), buckets).summary()
    except OSError:
        live = False
    return {
        "id": "this node", "address": record["address"], "zone": None, "weight": 1.0,
        "state": "alone" if live else "not answering", "live": live,
        "heartbeat_age": None, "started_at": record["started_at"], "pid": record["pid"],
        "workers": record["workers"], **figures,
    }  # fmt: skip


def _figures_from_metrics(text: str, buckets: dict[int, str]) -> NodeFigures:
    """A node's cache figures out of its Prometheus exposition (gateway/admin/metrics.py),
    its mounts named by `buckets` (mount id: bucket)."""
    from prometheus_client.parser import text_string_to_metric_families

    from gateway.cluster import MountLine, NodeFigures

    node: dict[str, int] = {}
    mounts: dict[str, dict[str, int]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removeprefix("gateway_cache_").removesuffix("_total")
            mount = sample.labels.get("mount")
            if mount is None:
                node[name] = int(sample.value)
            elif name.startswith("mount_"):
                mounts.setdefault(mount, {})[name.removeprefix("mount_")] = int(sample.value)
    lines = tuple(
        MountLine(
            buckets.get(int(mount), f"mount {mount}"),
            cache_bytes=m.get("bytes", 0),
            pinned_bytes=m.get("pinned_bytes", 0),
            capacity_bytes=m.get("capacity_bytes", 0),
            hits=m.get("hits", 0),
            misses=m.get("misses", 0),
            preload_fills=m.get("preload_fills", 0),
        )
        for mount, m in sorted(mounts.items(), key=lambda item: int(item[0]))
    )
    return NodeFigures(
        cache_bytes=node.get("bytes", 0),
        hits=node.get("hits", 0),
        misses=node.get("misses", 0),
        capacity_bytes=node.get("capacity_bytes", 0),
        pinned_bytes=node.get("pinned_bytes", 0),
        preload_fills=node.get("preload_fills", 0),
        mounts=lines,
    )


class _NotRunningYet(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Uvicorn running on")


def _announce(settings: Settings, mounts: list[str], poll: float = 0.1) -> None:
    """Print one line once the node answers /healthz on its S3 port: where it serves, from
    which data dir, with which mounts and workers. Runs beside the server, on a thread."""
    import ssl
    import urllib.error
    import urllib.request

    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(settings.host, settings.host)
    scheme = "https" if settings.tls_cert else "http"
    url = f"{scheme}://{f'[{host}]' if ':' in host else host}:{settings.port}/healthz"
    context = ssl.create_default_context()
    context.check_hostname = False  # our own socket, asked on loopback
    context.verify_mode = ssl.CERT_NONE
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as answer:
                if answer.status == 200:
                    break
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(poll)
    where = f"{scheme}://{settings.host}:{settings.port}"
    workers = f"{settings.workers} worker{'s' if settings.workers != 1 else ''}"
    # What `gateway status` reports of a node in no fleet (no heartbeats in the database).
    record = {"pid": os.getpid(), "address": where, "health": url, "workers": settings.workers,
              "started_at": time.time()}  # fmt: skip
    path = _serving_file(settings)
    with contextlib.suppress(OSError):  # a read-only data dir: status will not show it
        path.with_suffix(".tmp").write_text(json.dumps(record))
        path.with_suffix(".tmp").replace(path)
    # Said once the record is there: whoever reads this line can ask `gateway status`.
    click.echo(
        f"gateway: serving {where}, data dir {settings.data_dir.resolve()},"
        f" mounts: {', '.join(mounts) or 'none'}, {workers}"
        + (f", fleet port {settings.effective_internal_port}" if settings.fleet_secret else "")
    )
    sys.stdout.flush()


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


async def _bootstrap(meta: MetaStore, s: Settings) -> tuple[str, list[str]]:
    """Keys and the demo mount a fresh node needs; returns what to print for the user, and
    the buckets mounted."""
    scheme = "https" if s.tls_cert else "http"
    lines = [f"gateway: S3 endpoint {scheme}://{s.host}:{s.port} (region {s.region})"]
    from gateway.admin import Administration

    admin = Administration(meta)
    if s.admin_access_key and s.admin_secret_key:
        await admin.ensure_key(s.admin_access_key, s.admin_secret_key, "admin (configured)")
    created = await admin.first_key()
    keys = [created] if created is not None else await meta.list_keys()
    if s.demo and await meta.get_mount("demo") is None:
        folder = (s.data_dir / "demo").resolve()
        for name, data in DEMO_FILES.items():
            path = folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                path.write_bytes(data)
        await admin.mount_demo("demo", folder.as_uri())
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
    return "\n".join(lines), [m.bucket for m in await meta.list_mounts()]


def _redact(url: str) -> str:
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)


# -- mounts ------------------------------------------------------------------------------


def validate_bucket(name: str) -> None:
    from gateway.admin import check_bucket_name

    _checked(lambda: check_bucket_name(name))


def _parse_options(pairs: tuple[str, ...]) -> dict[str, str]:
    options: dict[str, str] = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        if not eq or not name:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--option")
        options[name] = value
    return options


_MOUNT_OPTIONS = [
    *_DB_OPTIONS,
    ("cache_dir", "The node's cache folder, kept out of mounts; default <data-dir>/cache."),
]


@main.group()
def mount() -> None:
    """Manage the mount table (bucket -> under-store URI)."""


@mount.command("add")
@click.argument("bucket")
@click.argument("uri")
@click.option("--option", "-o", "pairs", multiple=True, metavar="KEY=VALUE", help="Mount option.")
@click.option("--check/--no-check", default=True, show_default=True,
              help="List one key first: the store answers, takes the credentials, and its"
              " bucket or folder exists.")  # fmt: skip
@_options(_MOUNT_OPTIONS)
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
    settings = _settings(kwargs)
    # Checked before the database is opened: a refused mount makes no node.
    _checked(lambda: check_mount(uri, options, settings))
    if check:
        _checked(lambda: reach_mount(bucket, uri, options))
    try:
        m = _with_admin(
            settings, lambda ops: ops.add_mount(bucket, uri, options, settings, check=False)
        )
    except MountExists as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"mounted {m.bucket} -> {m.uri} {json.dumps(m.public_options())}")


@mount.command("set")
@click.argument("bucket")
@click.option("--option", "-o", "pairs", multiple=True, metavar="KEY=VALUE", help="Option to set.")
@click.option("--unset", multiple=True, metavar="KEY", help="Option to remove (its default then).")
@_options(_MOUNT_OPTIONS)
def mount_set(bucket: str, pairs: tuple[str, ...], unset: tuple[str, ...], **kwargs: Any) -> None:
    """Change options of the mount of BUCKET in place (its cache, versions and uploads stay).

    The options that result are checked as `mount add` checks them; nodes serve with them
    from their next refresh of the mounts.
    """
    if not pairs and not unset:
        raise click.UsageError("nothing to change: give -o KEY=VALUE or --unset KEY")
    changes = _parse_options(pairs)
    settings = _settings(kwargs)
    m = _with_admin(settings, lambda ops: ops.set_mount_options(bucket, changes, unset, settings))
    click.echo(f"changed {m.bucket} -> {m.uri} {json.dumps(m.public_options())}")


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
    _with_admin(_settings(kwargs), lambda ops: ops.remove_mount(bucket))
    click.echo(f"removed {bucket}")


# -- keys --------------------------------------------------------------------------------


@main.group()
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
@_options(_DB_OPTIONS)
def keys_create(
    access_key: str | None,
    secret_key: str | None,
    description: str,
    admin: bool,
    user: str | None,
    **kwargs: Any,
) -> None:
    """Create an access key and print it with its secret (the only time it is printed)."""
    settings = _settings(kwargs)
    try:
        key = _with_admin(
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
@_options(_DB_OPTIONS)
def keys_list(as_json: bool, **kwargs: Any) -> None:
    """List access key ids (never their secrets), each with its user and state: tab-separated
    key, created, admin or -, user, enabled or disabled, description."""

    async def read(meta: MetaStore) -> tuple[list[Any], dict[int, str]]:
        users = {u.id: u.name for u in await meta.list_users()}
        return await meta.list_keys(), users

    found, names = _run(_with_meta(_settings(kwargs), read))
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
@_options(_DB_OPTIONS)
def keys_delete(access_key: str, **kwargs: Any) -> None:
    """Delete an access key; requests signed with it are refused within seconds."""
    if not _with_admin(_settings(kwargs), lambda ops: ops.delete_key(access_key)):
        raise click.ClickException(f"no access key {access_key!r}")
    click.echo(f"deleted {access_key}")


def _set_disabled(access_key: str, disabled: bool, kwargs: dict[str, Any]) -> None:
    if not _with_admin(_settings(kwargs), lambda ops: ops.set_key_disabled(access_key, disabled)):
        raise click.ClickException(f"no access key {access_key!r}")
    click.echo(f"{'disabled' if disabled else 'enabled'} {access_key}")


@keys.command("disable")
@click.argument("access_key")
@_options(_DB_OPTIONS)
def keys_disable(access_key: str, **kwargs: Any) -> None:
    """Disable an access key: requests signed with it (S3, the jobs API) and the console's
    sign-ins and sessions are refused within --refresh-interval seconds, on every node, until
    `gateway keys enable` (the key and its secret are kept)."""
    _set_disabled(access_key, True, kwargs)


@keys.command("enable")
@click.argument("access_key")
@_options(_DB_OPTIONS)
def keys_enable(access_key: str, **kwargs: Any) -> None:
    """Enable a disabled access key again (with the secret it had)."""
    _set_disabled(access_key, False, kwargs)


# -- users and policies (docs/tenants.md) ------------------------------------------------


def _no_policy(exc: NoSuchPolicy) -> click.ClickException:
    """What the CLI says of a policy that is neither built in nor stored."""
    from gateway.iam import BUILTIN

    return click.ClickException(
        f"{exc}: the built-in ones are {', '.join(BUILTIN)}; `gateway policies create` makes others"
    )


@main.group()
def users() -> None:
    """Manage users: each access key belongs to one, its policies say what it may do."""


@users.command("create")
@click.argument("name")
@click.option(
    "--policy", "policy_names", multiple=True,
    help="A policy to attach (repeatable; default: own, which may create buckets and do"
    " everything in the buckets it owns).",
)  # fmt: skip
@_options(_DB_OPTIONS)
def users_create(name: str, policy_names: tuple[str, ...], **kwargs: Any) -> None:
    """Create user NAME (letters, digits and _+=,.@-, as IAM's user names)."""
    from gateway.admin import check_user_name

    _checked(lambda: check_user_name(name))
    try:
        wanted = _with_admin(_settings(kwargs), lambda ops: ops.create_user(name, policy_names))
    except NoSuchPolicy as exc:
        raise _no_policy(exc) from None
    except UserExists:
        raise click.ClickException(f"user {name!r} exists") from None
    click.echo(f"created user {name} with policies {', '.join(wanted)}")


@users.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
@_options(_DB_OPTIONS)
def users_list(as_json: bool, **kwargs: Any) -> None:
    """List users with their policies, keys and buckets."""
    found = _run(_with_meta(_settings(kwargs), lambda meta: meta.list_users()))
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
@_options(_DB_OPTIONS)
def users_delete(name: str, **kwargs: Any) -> None:
    """Delete user NAME and its keys (refused while it owns buckets)."""
    try:
        _with_admin(_settings(kwargs), lambda ops: ops.delete_user(name))
    except (NoSuchUser, InUse) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"deleted user {name}")


@main.group()
def policies() -> None:
    """Manage policies: the built-in own, readonly, readwrite, admin, and custom documents in
    the IAM JSON grammar."""


@policies.command("create")
@click.argument("name")
@click.argument("document", metavar="FILE|JSON")
@_options(_DB_OPTIONS)
def policies_create(name: str, document: str, **kwargs: Any) -> None:
    """Create policy NAME from a JSON document, given inline or as a file ('-': stdin)."""
    from gateway.admin import check_policy_document, check_policy_name
    from gateway.iam import MalformedPolicy

    _checked(lambda: check_policy_name(name))
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
        _with_admin(_settings(kwargs), lambda ops: ops.create_policy(name, text))
    except PolicyExists:
        raise click.ClickException(f"policy {name!r} exists") from None
    click.echo(f"created policy {name}")


@policies.command("delete")
@click.argument("name")
@_options(_DB_OPTIONS)
def policies_delete(name: str, **kwargs: Any) -> None:
    """Delete custom policy NAME (refused while a user holds it)."""
    try:
        _with_admin(_settings(kwargs), lambda ops: ops.delete_policy(name))
    except (NoSuchPolicy, InUse) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"deleted policy {name}")


@policies.command("attach")
@click.argument("policy")
@click.option("--user", required=True, help="The user to attach it to.")
@_options(_DB_OPTIONS)
def policies_attach(policy: str, user: str, **kwargs: Any) -> None:
    """Attach POLICY to a user (effective on every node within refresh_interval)."""
    try:
        added = _with_admin(_settings(kwargs), lambda ops: ops.attach_policy(user, policy))
    except NoSuchPolicy as exc:
        raise _no_policy(exc) from None
    except NoSuchUser as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"attached {policy} to {user}" if added else f"{user} holds {policy} already")


@policies.command("detach")
@click.argument("policy")
@click.option("--user", required=True, help="The user to detach it from.")
@_options(_DB_OPTIONS)
def policies_detach(policy: str, user: str, **kwargs: Any) -> None:
    """Detach POLICY from a user."""
    try:
        gone = _with_admin(_settings(kwargs), lambda ops: ops.detach_policy(user, policy))
    except NoSuchUser as exc:
        raise click.ClickException(str(exc)) from None
    if not gone:
        raise click.ClickException(f"{user} does not hold {policy}")
    click.echo(f"detached {policy} from {user}")


@policies.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON document, with the documents.")
@_options(_DB_OPTIONS)
def policies_list(as_json: bool, **kwargs: Any) -> None:
    """List the built-in and custom policies, and who holds each."""
    from gateway.iam import BUILTIN, builtin_document

    async def read(meta: MetaStore) -> tuple[dict[str, str], list[Any]]:
        return await meta.custom_policies(), await meta.list_users()

    custom, found = _run(_with_meta(_settings(kwargs), read))
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


# -- sync ----------------------------------------------------------------------------------


@main.command("sync")
@click.argument("target", metavar="BUCKET[/PREFIX]")
@click.option("--page-size", default=1000, show_default=True, help="Keys a listing request.")
@click.option(
    "--parallel", default=4, show_default=True,
    help="Sub-prefixes (PREFIX/name/) listed at once, where every key lies in one.",
)  # fmt: skip
@click.option("--quiet", "-q", is_flag=True, help="No progress bar; the summary line only.")
@_options(_DB_OPTIONS)
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
    settings = _settings(kwargs)

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
        done = _run(_with_meta(settings, work))
    except SyncBusy as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        f"synced {target}: {done.listed} keys listed, {done.changed} written,"
        f" {done.removed} removed"
    )


@main.command("syncs")
@click.argument("bucket", required=False)
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
@_options(_DB_OPTIONS)
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

    rows = _run(_with_meta(_settings(kwargs), read))
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

    async def read(meta: MetaStore) -> tuple[list[dict[str, Any]], dict[int, str]]:
        records = await NodeRegistry(meta.engine, settings.heartbeat_timeout).read()
        buckets = {m.id: m.bucket for m in await meta.list_mounts()}
        return [record.summary() for record in records], buckets

    try:
        rows, buckets = _run(_with_meta(settings, read))
    except MetaUnavailable as exc:
        raise click.ClickException(str(exc)) from None
    if not rows and (alone := _lone_node(settings, buckets)) is not None:
        rows = [alone]  # a node in no fleet (no --fleet-secret) writes no heartbeats
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    elif not rows:
        click.echo(
            f"no node serves over {settings.data_dir.absolute()}, and none has joined a fleet"
            " on its database (nodes join when `gateway serve --fleet-secret ...` starts)"
        )
    else:
        click.echo(_status_table(rows))


_CACHE_COLUMNS = ("CACHED", "PINNED", "CAPACITY", "HITS", "MISSES", "PRELOADED", "HIT RATIO")


def _cache_cells(figures: dict[str, Any]) -> tuple[str, ...]:
    """A node's or a mount's cache figures as _CACHE_COLUMNS shows them. PRELOADED: blocks
    preload fetched, which are neither hits nor misses (HIT RATIO is the clients')."""
    if figures.get("cache_bytes") is None:
        return ("-",) * len(_CACHE_COLUMNS)
    ratio = figures["hit_ratio"]
    return (
        _size(figures["cache_bytes"]),
        _size(figures["pinned_bytes"]),
        _size(figures["capacity_bytes"]) if figures["capacity_bytes"] else "-",
        str(figures["hits"]),
        str(figures["misses"]),
        str(figures["preload_fills"]),
        "-" if ratio is None else f"{ratio:.1%}",
    )


def _status_table(rows: list[dict[str, Any]]) -> str:
    """The nodes, then their mounts: what each holds and how it answered."""
    head = ("NODE", "ADDRESS", "ZONE", "WEIGHT", "STATE", "HEARTBEAT")
    table: list[tuple[str, ...]] = [head + _CACHE_COLUMNS]
    for row in rows:
        table.append(
            (
                row["id"],
                row["address"],
                row["zone"] or "-",
                f"{row['weight']:g}",
                row["state"],
                "-" if row["heartbeat_age"] is None else f"{row['heartbeat_age']:.1f}s ago",
                *_cache_cells(row),
            )
        )
    lines = _aligned(table)
    live = sum(1 for row in rows if row["live"])
    lines.append(f"{live} of {len(rows)} nodes live")
    mounts = [(row["id"], m) for row in rows for m in row.get("mounts") or ()]
    if mounts:
        lines.append("")
        per_mount: list[tuple[str, ...]] = [("NODE", "MOUNT", *_CACHE_COLUMNS)]
        per_mount += [(node, m["mount"], *_cache_cells(m)) for node, m in mounts]
        lines += _aligned(per_mount)
    return "\n".join(lines)


def _aligned(table: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in table
    ]


def _size(count: int) -> str:
    """Bytes in binary units, as the size settings take them (64MiB, 10GiB)."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


# -- jobs --------------------------------------------------------------------------------

_JOB_CLIENT_OPTIONS: list[tuple[str, str]] = [
    *_DB_OPTIONS,
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
    return _options(_JOB_CLIENT_OPTIONS)(fn)


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
    settings = _settings(kwargs)

    async def over_database() -> JobsClient:
        from gateway.datadir import DIR_MODE, private_umask

        private_umask()
        settings.data_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        meta = open_meta(settings)
        await meta.migrate()
        return DatabaseClient(meta, Administration(meta))

    return over_database, as_json


@main.command()
@click.argument("target", metavar="BUCKET[/PREFIX]")
@click.option("--pin", is_flag=True, help="Keep what is loaded from eviction.")
@click.option("--replicas", type=click.IntRange(1, 8), default=1,
              help="Fill the first N owners of each block.")  # fmt: skip
@click.option("--concurrency", type=click.IntRange(1, 256), default=8,
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


@main.group()
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
