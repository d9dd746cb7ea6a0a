"""The node's ASGI application: the S3 API, operator routes, and the lifespan that opens
the metadata store, the cache and the namespace, and closes them again."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os

from gateway.admin.routes import ADMIN_PATHS, admin_app
from gateway.cache import PageStore
from gateway.cluster.identity import local_node
from gateway.cluster.membership import Membership
from gateway.cluster.registry import NodeFigures
from gateway.config import Settings, build_settings
from gateway.internal import InternalApp
from gateway.meta import MetaStore, SecretBox
from gateway.metrics import publish_forever, shared_dir, watch_cache
from gateway.s3.app import S3App
from gateway.s3.http import Receive, Scope, Send
from gateway.service.fleet import Fleet
from gateway.service.gateway import Gateway

log = logging.getLogger("gateway.app")

SETTINGS_ENV = "GATEWAY_RESOLVED_SETTINGS"


def settings_to_json(settings: Settings) -> str:
    """The resolved settings, for worker processes that must build the same Node."""
    fields = {
        f.name: getattr(settings, f.name) for f in dataclasses.fields(settings) if f.name != "extra"
    }
    return json.dumps({k: (str(v) if isinstance(v, os.PathLike) else v) for k, v in fields.items()})


def node_from_environment() -> Node:
    """uvicorn's app factory in each worker process (`gateway serve --workers N`)."""
    from gateway.logs import setup_logging

    settings = build_settings(json.loads(os.environ[SETTINGS_ENV]))
    setup_logging(settings.log_level)
    return Node(settings)


def open_meta(settings: Settings) -> MetaStore:
    box = SecretBox.from_config(
        settings.encryption_key, settings.encryption_key_file, settings.data_dir
    )
    return MetaStore(settings.effective_database_url, box)


def open_pages(settings: Settings) -> PageStore:
    return PageStore(
        settings.effective_cache_dir,
        capacity_bytes=settings.cache_capacity,
        min_free_bytes=settings.cache_min_free,
        memory_bytes=settings.cache_memory,
        memory_object_max=settings.cache_memory_object_max,
        fill_concurrency=settings.fill_concurrency,
        verify_sample=settings.verify_sample,
    )


class Node:
    """One gateway node: what its lifespan opens, and the ASGI entry point."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.gateway: Gateway | None = None
        self.s3: S3App | None = None
        self.admin = admin_app(lambda: self.s3 is not None)
        self._tasks: list[asyncio.Task[None]] = []
        self.membership: Membership | None = None
        self.internal: InternalApp | None = None
        self.internal_port = -1

    async def start(self) -> None:
        s = self.settings
        meta = open_meta(s)
        await meta.migrate()
        pages = open_pages(s)
        await pages.open()
        watch_cache(pages)
        gateway = Gateway(
            meta,
            pages,
            s.metadata_ttl,
            bucket_store=s.bucket_store,
            bucket_store_options=s.bucket_store_option_map,
            multipart_max_age=s.multipart_max_age,
            block_size=s.cache_block_size,
            readahead=s.readahead_blocks,
        )
        await gateway.namespace.refresh()
        if s.fleet_secret:
            await self._join_fleet(gateway, meta)
        self._tasks = [
            asyncio.create_task(gateway.namespace.run(s.refresh_interval)),
            asyncio.create_task(gateway.multipart.run_janitor(min(3600.0, s.multipart_max_age))),
        ]
        if (folder := shared_dir()) is not None:  # one of several workers
            self._tasks.append(asyncio.create_task(publish_forever(pages, folder)))
        self.gateway = gateway
        self.s3 = S3App(gateway, s.region, s.base_domain, s.access_log)

    async def _join_fleet(self, gateway: Gateway, meta: MetaStore) -> None:
        s = self.settings
        me = local_node(s)
        fleet = Fleet(me, s.fleet_secret or "", s.forward_timeout)
        pages = gateway.pages

        def figures() -> NodeFigures:
            node = pages.janitor_stats()
            return NodeFigures(
                cache_bytes=node.bytes_used if node else 0,
                hits=pages.stats.hits,
                misses=pages.stats.misses,
            )

        membership = Membership(
            meta,
            me,
            interval=s.heartbeat_interval,
            timeout=s.heartbeat_timeout,
            figures=figures,
            on_change=fleet.update,
        )
        await membership.start()
        gateway.fleet = fleet
        self.membership = membership
        self.internal = InternalApp(gateway, fleet)
        self.internal_port = s.effective_internal_port
        log.info("joined the fleet as %s at %s", me.id, me.address)

    async def stop(self) -> None:
        if self.membership is not None:
            await self.membership.stop()
        if self.gateway is not None and self.gateway.fleet is not None:
            await self.gateway.fleet.close()
        if self.s3 is not None and self.s3.access_log is not None:
            self.s3.access_log.flush()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.gateway is not None:
            await self.gateway.close()
            await self.gateway.pages.close()
            await self.gateway.meta.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            server = scope.get("server")
            if server is not None and server[1] == self.internal_port:
                if self.internal is not None:
                    await self.internal(scope, receive, send)
                else:
                    await send({"type": "http.response.start", "status": 503, "headers": []})
                    await send({"type": "http.response.body", "body": b""})
            elif scope["path"] in ADMIN_PATHS:
                await self.admin(scope, receive, send)
            elif self.s3 is not None:
                await self.s3(scope, receive, send)
            else:
                await send({"type": "http.response.start", "status": 503, "headers": []})
                await send({"type": "http.response.body", "body": b""})
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.start()
                except Exception as exc:
                    log.exception("startup failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return
