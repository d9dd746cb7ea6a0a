"""Node configuration: one frozen Settings value, from flags > environment > TOML file > defaults.

Every setting NAME is also read from the environment as GATEWAY_<NAME> (click does the
flag/env part) and from the optional TOML file given by --config / GATEWAY_CONFIG.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


def cpu_cores() -> int:
    """The cores this process may run on (its CPU affinity, as a container's cpuset sets it)."""
    return len(os.sched_getaffinity(0))


def parse_size(value: str | int) -> int:
    """'64MiB', '10G', '4096' -> bytes (binary units: k = 1024)."""
    if isinstance(value, int):
        return value
    m = _SIZE.match(value)
    if not m:
        raise ValueError(f"not a size: {value!r} (use e.g. 4096, 64MiB, 10GiB)")
    unit = (m.group(2) or "").lower().rstrip("b").rstrip("i")
    return int(float(m.group(1)) * _UNITS[unit])


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 9000
    data_dir: Path = Path("./data")
    database_url: str | None = None  # None: SQLite in data_dir
    encryption_key: str | None = None  # Fernet key(s), comma-separated; first one encrypts
    encryption_key_file: Path | None = None
    region: str = "us-east-1"
    base_domain: str | None = None  # enables virtual-host style: BUCKET.<base_domain>
    cache_dir: Path | None = None  # None: <data_dir>/cache
    cache_capacity: int = 10 << 30
    cache_min_free: int = 1 << 30
    cache_memory: int = 64 << 20
    cache_memory_object_max: int = 256 << 10
    cache_block_size: int = 4 << 20  # objects are cached in blocks of this size (per mount too)
    # A random reader's small range of a block not cached fills only these pieces of it (0: off)
    cache_sub_block_size: int = 128 << 10
    readahead_blocks: int = 4  # blocks fetched ahead of a sequential reader
    fill_concurrency: int = 16  # store fetches for the cache in flight per process
    verify_sample: float = 1.0  # share of cache reads from disk that check their checksums
    # seconds a block checked whole may be sent from its file unread (0: never; docs/cache.md)
    zero_copy_recheck: float = 60.0
    # seal block files with fs-verity where the cache folder's file system can (docs/cache.md)
    seal_blocks: bool = True
    workers: int = 0  # worker processes sharing the node's cache; 0: one per core
    server: str = "gateway"  # the HTTP server: the node's own (gateway/server/) or "uvicorn"
    # PostgreSQL connections the node's workers pool together (each at least 2; docs/fleet.md)
    database_connections: int = 16
    # -- the fleet (docs/fleet.md); without a PostgreSQL database_url a node runs alone
    node_id: str | None = None  # default: kept in <data_dir>/node-id
    internal_port: int = 0  # port of the fleet's internal API; 0: port + 1
    advertise_host: str | None = None  # how peers reach this node; default: host
    fleet_secret: str | None = None  # shared by the fleet; authenticates internal requests
    node_weight: float = 0.0  # share of placement; 0: the cache capacity in GiB
    zone: str = ""
    heartbeat_interval: float = 2.0
    heartbeat_timeout: float = 10.0  # a node silent this long leaves the placement
    forward_timeout: float = 1.0  # seconds to wait for a peer to start answering
    metadata_ttl: float = 5.0  # seconds; 0 revalidates every request, -1 never
    refresh_interval: float = 2.0  # how often mounts and keys are re-read from the database
    bucket_store: str | None = None  # where CreateBucket makes buckets: file:///dir or s3://
    bucket_store_options: str | None = None  # "endpoint_url=...,access_key=...,secret_key=..."
    multipart_max_age: float = 7 * 86400.0  # abandoned uploads are aborted after this
    tls_cert: Path | None = None  # serve HTTPS with this certificate chain (PEM)
    tls_key: Path | None = None
    fleet_ca: Path | None = None  # CA bundle peers' certificates are checked against; None: system
    # -- the HTTP edge (gateway/edge.py), on the S3 port and the fleet's port alike
    max_request_line: int = 16 << 10  # bytes of a request's target (path and query): 414 past it
    max_header_bytes: int = 32 << 10  # bytes of its header fields' names and values: 431 past it
    max_headers: int = 128  # header fields in one request: 431 past it
    head_timeout: float = 10.0  # seconds to receive a request head: 408 (silence: closed) past it
    keepalive_timeout: int = 5  # seconds an idle connection is kept open between requests
    body_timeout: float = 60.0  # seconds a request body may send nothing: 408, closed
    max_connections: int = 1024  # open connections per port and worker: 503 SlowDown past it
    admin_access_key: str | None = None  # ensured to exist at start (with admin_secret_key)
    admin_secret_key: str | None = None
    access_log: bool = True
    short_circuit: bool = True  # hand cached block files to clients on this host (s3/local.py)
    local_socket: Path | None = None  # None: <data_dir>/gateway.sock
    local_socket_uids: str | None = None  # uids allowed, comma-separated; None: the node's own
    config_file: Path | None = None  # the --config TOML it was read from (kept out of mounts)
    fast_hits: bool = True  # plain hits from memory answered at the edge (gateway/s3/fast.py)
    log_level: str = "info"
    demo: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)
    # Seconds an upload a node opens at a store on its own behalf (an S3 origin's multipart
    # upload of a large PUT) stays claimed without renewal: a writer renews it every third of
    # this; a janitor aborts it once it has run out (its writer died).
    write_lease: float = 60.0
    # A node gone from the fleet this long has its unfinished share of preload jobs taken
    # over by the others; one back sooner (a restart) takes it up itself (docs/jobs.md).
    job_takeover_delay: float = 60.0

    @property
    def database_pool(self) -> int:
        """Pooled PostgreSQL connections of one worker: the node's `database_connections`
        shared by its workers, at least 2 each (one for a request while the heartbeat or the
        job loop holds the other). A worker also holds one LISTEN connection in a fleet."""
        workers = self.workers if self.workers > 0 else 1
        return max(2, -(-self.database_connections // workers))

    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite+aiosqlite:///{self.data_dir.resolve() / 'gateway.db'}"

    @property
    def bucket_store_option_map(self) -> dict[str, str]:
        pairs = [p for p in (self.bucket_store_options or "").split(",") if p.strip()]
        out = {}
        for pair in pairs:
            name, eq, value = pair.partition("=")
            if not eq:
                raise ValueError(f"bucket_store_options: {pair!r} is not KEY=VALUE")
            out[name.strip()] = value.strip()
        return out

    @property
    def effective_internal_port(self) -> int:
        return self.internal_port or self.port + 1

    @property
    def effective_local_socket(self) -> Path:
        return self.local_socket or self.data_dir / "gateway.sock"

    @property
    def allowed_local_uids(self) -> frozenset[int]:
        if not self.local_socket_uids:
            return frozenset({os.getuid()})
        return frozenset(int(u) for u in self.local_socket_uids.split(",") if u.strip())

    @property
    def effective_cache_dir(self) -> Path:
        return self.cache_dir or self.data_dir / "cache"


_FIELDS = {f.name: f for f in dataclasses.fields(Settings) if f.name != "extra"}
_SIZES = {n for n in _FIELDS if n.startswith("cache_") and n != "cache_dir"}
_SIZES |= {"max_request_line", "max_header_bytes"}
_NUMBERS = {"node_weight", "verify_sample"}


def _coerce(name: str, value: Any) -> Any:
    if value is None:
        return None
    if name in _SIZES:
        return parse_size(value)
    default = _FIELDS[name].default
    if isinstance(default, bool):
        if isinstance(value, str):
            return value.strip().lower() in {"1", "true", "yes", "on"}
        return bool(value)
    if isinstance(default, int):
        return int(value)
    if isinstance(default, float) or name in _NUMBERS:
        return float(value)
    if name in {
        "data_dir", "cache_dir", "encryption_key_file", "tls_cert", "tls_key", "fleet_ca",
        "local_socket", "config_file",
    }:  # fmt: skip
        return Path(value)
    return str(value)


def load_toml(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    with path.open("rb") as f:
        raw = tomllib.load(f)
    # Accept both a flat file and one with a [gateway] table; '-' and '_' alike.
    table = raw.get("gateway", raw)
    out = {k.replace("-", "_"): v for k, v in table.items() if not isinstance(v, dict)}
    unknown = sorted(set(out) - set(_FIELDS))
    if unknown:
        raise ValueError(f"{path}: unknown settings {', '.join(unknown)}")
    return out


def build_settings(given: Mapping[str, Any], config_file: Path | None = None) -> Settings:
    """Merge: `given` (flags and environment, None = not given) over the TOML file over defaults."""
    merged: dict[str, Any] = {}
    for source in (load_toml(config_file), {k: v for k, v in given.items() if v is not None}):
        for name, value in source.items():
            if name in _FIELDS:
                merged[name] = _coerce(name, value)
    if config_file is not None:
        merged["config_file"] = config_file.resolve()
    return Settings(**merged)
