"""The mount table and access keys as the request path sees them: in-process, no database.

Both are re-read from the metadata store every few seconds (and on demand for an unknown
access key), so `gateway mount add` on any machine reaches a running node without restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.config import parse_size
from gateway.meta import MetaStore, MetaUnavailable, Mount
from gateway.stores import Store, open_store

log = logging.getLogger("gateway.namespace")

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

    @property
    def id(self) -> int:
        return self.mount.id

    @property
    def bucket(self) -> str:
        return self.mount.bucket

    def pinned(self, key: str) -> bool:
        return bool(self.pins) and key.startswith(self.pins)


def store_options(options: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in options.items() if k not in MOUNT_OPTIONS}


def make_handle(mount: Mount, default_ttl: float, default_block_size: int = 4 << 20) -> MountHandle:
    opts = mount.options
    block_size = parse_size(opts.get("block_size", default_block_size))
    if not _MIN_BLOCK <= block_size <= _MAX_BLOCK:
        raise ValueError(f"block_size must be between 64KiB and 1GiB, not {block_size}")
    quota = parse_size(opts["cache_quota"]) if opts.get("cache_quota") else None
    pins = tuple(opts["pin"].split("|")) if "pin" in opts else ()
    return MountHandle(
        mount=mount,
        store=open_store(mount.uri, store_options(opts)),
        ttl=float(opts.get("metadata_ttl", default_ttl)),
        public_read=opts.get("public_read", "").lower() in _TRUE,
        cache_enabled=opts.get("cache", "on").lower() not in {"off", "false", "0", "no"},
        read_only=opts.get("read_only", "").lower() in _TRUE,
        kind=mount.uri.partition(":")[0],
        block_size=block_size,
        quota=quota,
        pins=pins,
        replicas=max(1, int(opts.get("replicas", 1))),
    )


class Namespace:
    """bucket -> MountHandle and access key -> secret, refreshed from the metadata store."""

    def __init__(
        self,
        meta: MetaStore,
        default_ttl: float,
        default_block_size: int = 4 << 20,
        on_mounts: Callable[[list[MountHandle]], None] | None = None,
    ) -> None:
        self._meta = meta
        self._default_ttl = default_ttl
        self._default_block_size = default_block_size
        self._on_mounts = on_mounts
        self._mounts: dict[str, MountHandle] = {}
        self._by_id: dict[int, MountHandle] = {}
        self._secrets: dict[str, str] = {}
        self._keys_refreshed = 0.0
        self._key_refresh: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def mount(self, bucket: str) -> MountHandle | None:
        return self._mounts.get(bucket)

    def by_id(self, mount_id: int) -> MountHandle | None:
        return self._by_id.get(mount_id)

    def mounts(self) -> list[MountHandle]:
        return sorted(self._mounts.values(), key=lambda h: h.bucket)

    def secret_for(self, access_key: str) -> str | None:
        return self._secrets.get(access_key)

    async def refresh(self) -> None:
        await self.refresh_mounts()
        await self.refresh_keys()

    async def refresh_mounts(self) -> None:
        mounts = await self._meta.list_mounts()
        current = self._mounts
        fresh: dict[str, MountHandle] = {}
        for m in mounts:
            old = current.get(m.bucket)
            if old is not None and old.mount == m:
                fresh[m.bucket] = old
                continue
            try:
                fresh[m.bucket] = make_handle(m, self._default_ttl, self._default_block_size)
            except ValueError as exc:
                log.error("mount %s skipped: %s", m.bucket, exc)
                continue
            self._spawn(self._prepare(fresh[m.bucket]))
        self._mounts = fresh
        self._by_id = {h.id: h for h in fresh.values()}
        if self._on_mounts is not None:
            self._on_mounts(list(fresh.values()))
        for bucket, handle in current.items():
            if fresh.get(bucket) is not handle:
                self._spawn(self._close_later(handle.store))

    async def refresh_keys(self) -> None:
        keys = await self._meta.list_keys()
        self._secrets = {k.access_key: k.secret_key for k in keys}
        self._keys_refreshed = time.monotonic()

    async def lookup_unknown_key(self, access_key: str) -> str | None:
        """A key created since the last refresh: re-read the keys, at most once a second."""
        if time.monotonic() - self._keys_refreshed >= 1.0:
            if self._key_refresh is None or self._key_refresh.done():
                self._key_refresh = asyncio.create_task(self.refresh_keys())
            with contextlib.suppress(MetaUnavailable):
                await asyncio.shield(self._key_refresh)
        return self._secrets.get(access_key)

    async def run(self, interval: float) -> None:
        """Refresh forever; a database outage keeps the last known state serving."""
        while True:
            await asyncio.sleep(interval)
            try:
                await self.refresh()
            except MetaUnavailable as exc:
                log.warning("metadata store unavailable, serving last known mounts: %s", exc)
            except Exception:
                log.exception("refresh of mounts and keys failed")

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for handle in self._mounts.values():
            await handle.store.close()
        self._mounts = {}

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

    @staticmethod
    async def _close_later(store: Store) -> None:
        await asyncio.sleep(_CLOSE_GRACE)
        await store.close()
