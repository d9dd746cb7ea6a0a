"""`gateway serve` (one node: its options, sockets, TLS, its server, and the line it says once
it answers) and `gateway migrate`."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import socket
import ssl
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click

from gateway.cli.door import run, with_meta
from gateway.cli.options import DB_OPTIONS, settings_from, settings_options
from gateway.config import Settings, cpu_cores
from gateway.meta import MetaStore

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


@click.command("serve")
@settings_options(DB_OPTIONS + _SERVE_OPTIONS, _FLAGS)
def serve(**kwargs: Any) -> None:
    """Run one gateway node."""
    from gateway.datadir import prepare_metrics_dir
    from gateway.logs import setup_logging

    settings = settings_from(kwargs)
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
    banner, mounts = run(with_meta(settings, lambda meta: _bootstrap(meta, settings)))
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
            from gateway.cache import share_checks

            # The workers' zero-copy sends share what any of them checked (cache/checks.py).
            share_checks()
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
        serving_file(settings).unlink(missing_ok=True)


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


def serving_file(settings: Settings) -> Path:
    """Where a serving node says who it is (pid, address, health URL) for `gateway status`."""
    return settings.data_dir / "serving.json"


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
    path = serving_file(settings)
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


@click.command("migrate")
@settings_options(DB_OPTIONS)
def migrate(**kwargs: Any) -> None:
    """Apply the database migrations (serve also does this at start)."""
    settings = settings_from(kwargs)

    async def noop(meta: MetaStore) -> None:
        return None

    run(with_meta(settings, noop))
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
