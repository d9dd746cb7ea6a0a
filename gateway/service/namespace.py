"""The mount table and access keys as the request path sees them: in-process, no database.

Both are re-read from the metadata store every few seconds (and on demand for an unknown
access key), so `gateway mount add` on any machine reaches a running node without restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

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
}
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

    @property
    def id(self) -> int:
        return self.mount.id

    @property
    def bucket(self) -> str:
        return self.mount.bucket


def store_options(options: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in options.items() if k not in MOUNT_OPTIONS}


def make_handle(mount: Mount, default_ttl: float) -> MountHandle:
    opts = mount.options
    return MountHandle(
        mount=mount,
        store=open_store(mount.uri, store_options(opts)),
        ttl=float(opts.get("metadata_ttl", default_ttl)),
        public_read=opts.get("public_read", "").lower() in _TRUE,
        cache_enabled=opts.get("cache", "on").lower() not in {"off", "false", "0", "no"},
        read_only=opts.get("read_only", "").lower() in _TRUE,
    )


class Namespace:
    """bucket -> MountHandle and access key -> secret, refreshed from the metadata store."""

    def __init__(self, meta: MetaStore, default_ttl: float) -> None:
        self._meta = meta
        self._default_ttl = default_ttl
        self._mounts: dict[str, MountHandle] = {}
        self._secrets: dict[str, str] = {}
        self._keys_refreshed = 0.0
        self._key_refresh: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def mount(self, bucket: str) -> MountHandle | None:
        return self._mounts.get(bucket)

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
                fresh[m.bucket] = make_handle(m, self._default_ttl)
            except ValueError as exc:
                log.error("mount %s skipped: %s", m.bucket, exc)
        self._mounts = fresh
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
    async def _close_later(store: Store) -> None:
        await asyncio.sleep(_CLOSE_GRACE)
        await store.close()
