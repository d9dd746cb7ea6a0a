"""The mount table, access keys and who may do what (service/authz.py) as the request path
sees them: in-process, no database.

All are re-read from the metadata store every few seconds (what a change made on another node
waits for), on demand for an unknown access key or bucket, and before the next request of each
worker of the node whenever the node's state counter has moved (generations.py): a change made
through any worker of a node, or by the CLI on its host (`gateway mount add`, `keys disable`,
`users`, `policies`, `sync`), holds on every worker of that node once it is acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.catalog import OPTIONS as CATALOG_OPTIONS
from gateway.catalog import Catalog, CatalogOptions, catalog_options
from gateway.config import Settings, parse_size
from gateway.generations import Generations
from gateway.meta import MetaStore, MetaUnavailable, Mount, UploadLeases
from gateway.meta.engine import sqlite_path
from gateway.meta.models import TenancyRows
from gateway.meta.secrets import KEY_FILE_NAME
from gateway.service.authz import Authorizer, build_authorizer
from gateway.stores import Store, open_store

log = logging.getLogger(__name__)

# Re-reads on demand (an unknown key or bucket) start at most this often, so that a flood of
# requests naming buckets that do not exist costs the database a few small queries a second.
REREAD_GAP = 0.1
# An idle worker looks this often whether the node's state moved (one load from shared memory).
CATCH_UP_TICK = 0.25

_TRUE = {"1", "true", "yes", "on"}
# Options the gateway itself reads; every other mount option belongs to the store.
MOUNT_OPTIONS = {
    "metadata_ttl": "seconds; 0 revalidates every read, -1 never",
    "public_read": "true: anonymous reads allowed",
    "cache": "on|off",
    "read_only": "true: writes refused",
    "owned": "true: made by CreateBucket; DeleteBucket removes the container too",
    "block_size": "objects are cached in blocks of this size, e.g. 8MiB (default: the node's)",
    "cache_quota": "most bytes of cache this mount may take, e.g. 100GiB",
    "pin": "key prefixes never evicted, separated by '|' (an empty prefix pins the mount)",
    "replicas": "nodes of a fleet that may hold each block (default 1): failover targets",
    "cors": "the bucket's CORS rules, as PutBucketCors sets them (JSON)",
    **CATALOG_OPTIONS,
}
_MIN_BLOCK, _MAX_BLOCK = 64 << 10, 1 << 30
# Stores of a changed or removed mount stay open this long for requests still reading them.
_CLOSE_GRACE = 30.0


@dataclass(frozen=True, slots=True)
class MountHandle:
    """A mount with its open store and the options the read path consults on every request."""

    mount: Mount
    store: Store
    ttl: float  # metadata TTL in seconds: 0 revalidates always, < 0 never
    public_read: bool
    cache_enabled: bool
    read_only: bool
    kind: str  # the store's scheme (s3, gs, az, hdfs, file), for metrics
    block_size: int
    quota: int | None
    pins: tuple[str, ...]
    replicas: int
    catalog: CatalogOptions | None = None  # None: the catalog is off for this mount
    # The mount's id, kept as a field: the read path asks for it a dozen times a request,
    # and a property is a function call each time.
    id: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", self.mount.id)

    @property
    def bucket(self) -> str:
        return self.mount.bucket

    def pinned(self, key: str) -> bool:
        return bool(self.pins) and key.startswith(self.pins)


@dataclass(frozen=True, slots=True)
class OwnPaths:
    """The gateway's own folders and files (real paths, symlinks resolved): no file mount or
    bucket store may lie inside such a folder or contain any of them, or clients could read
    the database and the secret key, or write over them."""

    folders: tuple[tuple[str, str], ...] = ()  # (what it is, real path)
    files: tuple[tuple[str, str], ...] = ()
    # Folders inside the data dir that the gateway makes for mounting (--demo's sample files).
    mountable: tuple[str, ...] = ()

    def problem(self, folder: str) -> str | None:
        """Why a store over `folder` would expose the gateway's own files, or None."""
        real = os.path.realpath(folder)
        if real in self.mountable:
            return None
        # The widest of the gateway's folders it holds, or the narrowest it lies inside.
        held = [(len(p), w, p) for w, p in (*self.folders, *self.files) if _within(p, real)]
        if held:
            _, what, path = min(held)
            if path == real:
                return f"the folder {folder} is the gateway's {what}"
            return f"the folder {folder} contains the gateway's {what} {path}"
        around = [(len(p), w, p) for w, p in self.folders if _within(real, p)]
        if around:
            _, what, path = max(around)
            return f"the folder {folder} lies inside the gateway's {what} {path}"
        return None

    def check(self, store: Store) -> None:
        """ValueError, saying why, if `store` serves files of this machine that it must not."""
        folder = store.local_folder()
        problem = None if folder is None else self.problem(folder)
        if problem is not None:
            raise ValueError(f"{problem}; mount a folder beside it instead")


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def own_paths(settings: Settings) -> OwnPaths:
    """What of the gateway lives on this machine, by the node's (or the CLI's) settings."""
    data = os.path.realpath(settings.data_dir)
    folders = [("data dir", data), ("cache dir", os.path.realpath(settings.effective_cache_dir))]
    files: list[tuple[str, str]] = []
    key_file = settings.encryption_key_file or settings.data_dir / KEY_FILE_NAME
    files.append(("encryption key file", os.path.realpath(key_file)))
    database = sqlite_path(settings.effective_database_url)
    if database is not None:
        files.append(("database", os.path.realpath(database)))
    if settings.tls_key is not None:
        files.append(("TLS key", os.path.realpath(settings.tls_key)))
    if settings.config_file is not None:  # it may hold the admin's and the fleet's secrets
        files.append(("config file", os.path.realpath(settings.config_file)))
    return OwnPaths(tuple(folders), tuple(files), (os.path.join(data, "demo"),))


def store_options(options: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in options.items() if k not in MOUNT_OPTIONS}


def make_handle(
    mount: Mount,
    default_ttl: float,
    default_block_size: int = 4 << 20,
    own: OwnPaths = OwnPaths(),  # noqa: B008 - frozen, so shared safely
) -> MountHandle:
    """The handle of a mount; ValueError, saying why, for one that cannot be served."""
    opts = mount.options
    block_size = parse_size(opts.get("block_size", default_block_size))
    if not _MIN_BLOCK <= block_size <= _MAX_BLOCK:
        raise ValueError(f"block_size must be between 64KiB and 1GiB, not {block_size}")
    quota = parse_size(opts["cache_quota"]) if opts.get("cache_quota") else None
    pins = tuple(opts["pin"].split("|")) if "pin" in opts else ()
    store = open_store(mount.uri, store_options(opts))
    own.check(store)
    return MountHandle(
        mount=mount,
        store=store,
        ttl=float(opts.get("metadata_ttl", default_ttl)),
        public_read=opts.get("public_read", "").lower() in _TRUE,
        cache_enabled=opts.get("cache", "on").lower() not in {"off", "false", "0", "no"},
        read_only=opts.get("read_only", "").lower() in _TRUE,
        kind=mount.uri.partition(":")[0],
        block_size=block_size,
        quota=quota,
        pins=pins,
        replicas=max(1, int(opts.get("replicas", 1))),
        catalog=catalog_options(opts),
    )


class Reread:
    """On-demand re-reads of one table, coalesced: whoever asks waits for a re-read that began
    after they asked (so it sees whatever was committed before), and one re-read answers all
    who asked meanwhile; a new one starts at most every REREAD_GAP seconds."""

    def __init__(self, read: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._read = read
        self._began = -REREAD_GAP  # when the last re-read began (monotonic)
        self._task: asyncio.Task[None] | None = None

    async def read(self) -> None:
        """A re-read now, for the periodic refresh (errors to the caller)."""
        self._began = time.monotonic()
        await self._read()

    async def fresh(self) -> None:
        """Return once a re-read that began after this call has ended (or failed: the
        database is down, and the last state stands)."""
        asked = time.monotonic()
        while self._began < asked:
            if self._task is None or self._task.done():
                self._task = asyncio.create_task(self._after(self._began + REREAD_GAP))
            task = self._task
            with contextlib.suppress(Exception):
                await asyncio.shield(task)
            if task.cancelled() or task.exception() is not None:
                return

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _after(self, at: float) -> None:
        delay = at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)  # rate limit, not a wait for an outcome
        try:
            await self.read()
        except MetaUnavailable as exc:
            log.warning("re-read on demand failed, serving last known state: %s", exc)
            raise


class Namespace:
    """bucket -> MountHandle and access key -> secret, refreshed from the metadata store."""

    def __init__(
        self,
        meta: MetaStore,
        default_ttl: float,
        default_block_size: int = 4 << 20,
        on_mounts: Callable[[list[MountHandle]], None] | None = None,
        generations: Generations | None = None,
        catalog: Catalog | None = None,
    ) -> None:
        self._meta = meta
        self._generations = generations
        self._catalog = catalog
        self._seen = -1 if generations is None else generations.state()
        self._catching_up: asyncio.Task[None] | None = None
        self._default_ttl = default_ttl
        self._default_block_size = default_block_size
        self._on_mounts = on_mounts
        self._mounts: dict[str, MountHandle] = {}
        self._by_id: dict[int, MountHandle] = {}
        self._secrets: dict[str, str] = {}
        self._keys = Reread(self._read_keys)
        self._mounts_reread = Reread(self._read_mounts)
        self._tasks: set[asyncio.Task[None]] = set()
        # Stores of changed or removed mounts, open for their grace period: closed at the
        # node's shutdown too, whatever is left of it.
        self._retiring: set[Store] = set()
        self.own = OwnPaths()
        self.write_lease = Settings.write_lease
        self._refused: dict[str, Mount] = {}  # mounts not served, each logged once
        # Users, policies, owners: replaced whole at each refresh, read without I/O.
        self.auth = Authorizer()

    def configure(self, settings: Settings) -> None:
        """Take what the node's settings say of its own files (kept out of every mount) before
        the first refresh; ValueError, saying why, for a bucket store that would expose them."""
        self.own = own_paths(settings)
        if settings.write_lease <= 0:
            raise ValueError(
                f"write_lease must be a positive number of seconds, not {settings.write_lease}"
            )
        self.write_lease = settings.write_lease
        if not settings.bucket_store:
            return
        try:
            store = open_store(settings.bucket_store, settings.bucket_store_option_map)
        except ValueError:
            return  # a malformed URI is reported where it is used, by CreateBucket
        folder = store.local_folder()
        problem = None if folder is None else self.own.problem(folder)
        if problem is not None:
            raise ValueError(
                f"bucket_store {settings.bucket_store}: {problem}, and new buckets would be"
                " made there; choose a folder beside it"
            )

    def mount(self, bucket: str) -> MountHandle | None:
        return self._mounts.get(bucket)

    def by_id(self, mount_id: int) -> MountHandle | None:
        return self._by_id.get(mount_id)

    def mounts(self) -> list[MountHandle]:
        return sorted(self._mounts.values(), key=lambda h: h.bucket)

    def secret_for(self, access_key: str) -> str | None:
        return self._secrets.get(access_key)

    async def refresh(self) -> None:
        seen = self._seen if self._generations is None else self._generations.state()
        await self.refresh_mounts()
        await self.refresh_keys()
        if self._catalog is not None:
            await self._catalog.refresh()
        self._seen = seen

    def stale(self) -> bool:
        """Whether mounts, tenants or keys changed on this node since this worker last read
        them (one load from shared memory)."""
        return self._generations is not None and self._generations.state() != self._seen

    async def current(self) -> None:
        """Return once this worker has re-read what changed on the node before this call; one
        re-read at a time answers every request that waits. With the database down, the last
        state read stands (and the periodic refresh tries again)."""
        while self.stale():
            task = self._catching_up
            if task is None or task.done():
                task = self._catching_up = asyncio.create_task(self._catch_up())
            await asyncio.shield(task)

    async def _catch_up(self) -> None:
        assert self._generations is not None
        seen = self._generations.state()
        try:
            await self.refresh()
        except MetaUnavailable as exc:
            log.warning("metadata store unavailable, serving last known mounts: %s", exc)
        except Exception:
            log.exception("re-read of mounts and keys failed")
        self._seen = seen

    async def refresh_auth(self) -> None:
        """Re-read users, policies, keys' users, owners and bucket policies, and compile them."""
        self._publish_auth(await self._meta.read_tenancy())

    async def refresh_mounts(self) -> None:
        """Re-read the mounts, and with them who may do what: both change at one instant, so
        that no request sees a new mount with the old policies (a public mount refused)."""
        await self._mounts_reread.read()

    async def refresh_keys(self) -> None:
        """Re-read the keys, and with them (at the same instant) the users they belong to."""
        await self._keys.read()

    def _publish_auth(self, rows: TenancyRows) -> None:
        self.auth = build_authorizer(
            rows, [h.bucket for h in self._mounts.values() if h.public_read]
        )

    async def lookup_unknown_key(self, access_key: str) -> str | None:
        """A key perhaps created (or enabled) since the last refresh: wait for a re-read of
        the keys. Requests with a key that does not exist or is disabled come here each time;
        Reread starts at most one re-read every REREAD_GAP for all of them."""
        if access_key not in self._secrets:
            await self._keys.fresh()
        return self._secrets.get(access_key)

    async def lookup_unknown_mount(self, bucket: str | None = None, mount_id: int = -1) -> None:
        """A mount perhaps added since the last refresh (by the CLI, another worker or node),
        named by bucket or by id: wait for a re-read of the mounts."""
        if bucket not in self._mounts and mount_id not in self._by_id:
            await self._mounts_reread.fresh()

    async def _read_mounts(self) -> None:
        mounts = await self._meta.list_mounts()
        tenancy = await self._meta.read_tenancy()
        current = self._mounts
        fresh: dict[str, MountHandle] = {}
        for m in mounts:
            old = current.get(m.bucket)
            if old is not None and old.mount == m:
                fresh[m.bucket] = old
                continue
            if self._refused.get(m.bucket) == m:
                continue
            try:
                handle = make_handle(m, self._default_ttl, self._default_block_size, self.own)
            except ValueError as exc:
                log.error("mount %s (%s) not served: %s", m.bucket, m.uri, exc)
                self._refused[m.bucket] = m
                continue
            handle.store.journal = UploadLeases(self._meta, m.id, self.write_lease)
            fresh[m.bucket] = handle
            self._spawn(self._prepare(fresh[m.bucket]))
        self._refused = {m.bucket: m for m in mounts if self._refused.get(m.bucket) == m}
        self._mounts = fresh
        self._by_id = {h.id: h for h in fresh.values()}
        self._publish_auth(tenancy)  # no await since the line above
        if self._on_mounts is not None:
            self._on_mounts(list(fresh.values()))
        for bucket, handle in current.items():
            if fresh.get(bucket) is not handle:
                self._retiring.add(handle.store)
                self._spawn(self._close_later(handle.store))

    async def _read_keys(self) -> None:
        keys = await self._meta.list_keys()
        tenancy = await self._meta.read_tenancy()
        # A disabled key is left out: to every verifier it is a key that does not exist.
        self._secrets = {k.access_key: k.secret_key for k in keys if not k.disabled}
        self._publish_auth(tenancy)

    async def run(self, interval: float) -> None:
        """Refresh every `interval`, forever; a database outage keeps the last known state
        serving. Between refreshes, a change told on this node (by a sibling worker, the CLI,
        the console) is caught up with within CATCH_UP_TICK even with no request to prompt
        it: an idle worker holds what the node acknowledged before the database can go away."""
        loop = asyncio.get_running_loop()
        due = loop.time() + interval
        while True:
            await asyncio.sleep(max(0.0, min(CATCH_UP_TICK, due - loop.time())))
            if loop.time() < due:
                if self.stale():
                    await self.current()
                continue
            due = loop.time() + interval
            try:
                await self.refresh()
            except MetaUnavailable as exc:
                log.warning("metadata store unavailable, serving last known mounts: %s", exc)
            except Exception:
                log.exception("refresh of mounts and keys failed")

    async def close(self) -> None:
        if self._catching_up is not None:
            self._catching_up.cancel()
        self._keys.close()
        self._mounts_reread.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        # Ended before the stores close: a store's preparation cut short opens nothing after.
        await asyncio.gather(*tasks, return_exceptions=True)
        stores = [*(h.store for h in self._mounts.values()), *self._retiring]
        self._mounts, self._retiring = {}, set()
        for store in stores:
            await _close(store)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _prepare(handle: MountHandle) -> None:
        try:
            await handle.store.prepare()
        except Exception as exc:  # the first request will try again, and say what is wrong
            log.warning("mount %s: store not ready: %s", handle.bucket, exc)

    async def _close_later(self, store: Store) -> None:
        await asyncio.sleep(_CLOSE_GRACE)
        if store in self._retiring:
            self._retiring.discard(store)
            await _close(store)


async def _close(store: Store) -> None:
    """Close a store's clients; a failure is the log's, never the caller's (a shutdown goes on)."""
    try:
        await store.close()
    except Exception as exc:
        log.warning("%r not closed cleanly: %s", store, exc)
