"""The node's ASGI application: the S3 API, operator routes, and the lifespan that opens
the metadata store, the cache and the namespace, and closes them again."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import ssl
from collections.abc import Callable

from gateway import counters
from gateway.admin import Administration
from gateway.admin.metrics import cache_figures, publish_forever, shared_dir, watch_cache
from gateway.admin.routes import ADMIN_PATHS, admin_app
from gateway.cache import PageStore
from gateway.catalog.upkeep import CatalogMount, Upkeep
from gateway.cluster.identity import local_node
from gateway.cluster.membership import Membership
from gateway.cluster.peer_api import PeerApi
from gateway.cluster.peers import Fleet
from gateway.cluster.placement import DEFAULT_MAX_REPLICAS, DEFAULT_PARTITIONS
from gateway.cluster.registry import MountLine, NodeFigures, NodeRegistry
from gateway.config import Settings, build_settings
from gateway.console import Console, is_console_path
from gateway.edge import install_fast_path
from gateway.jobs.api import JobsApi, is_jobs_path
from gateway.jobs.db import JobStore
from gateway.jobs.runner import JobRunner, Member
from gateway.meta import MetaStore, MetaUnavailable, open_meta
from gateway.meta.secrets import WrongSecretKey
from gateway.s3.app import S3App
from gateway.s3.http import Receive, Scope, Send
from gateway.s3.local import LocalReads
from gateway.service import Loads, S3Service
from gateway.service.namespace import store_options
from gateway.service.reads import Reader
from gateway.service.shared import Shared
from gateway.stores import ObjectInfo

log = logging.getLogger(__name__)
# Seconds /readyz waits for the database before it says the node is not ready.
READY_TIMEOUT = 3.0

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


def open_pages(settings: Settings) -> PageStore:
    return PageStore(
        settings.effective_cache_dir,
        capacity_bytes=settings.cache_capacity,
        min_free_bytes=settings.cache_min_free,
        memory_bytes=settings.cache_memory,
        memory_object_max=settings.cache_memory_object_max,
        verify_sample=settings.verify_sample,
        zero_copy_recheck=settings.zero_copy_recheck,
        seal_blocks=settings.seal_blocks,
    )


def fleet_tls(settings: Settings) -> ssl.SSLContext | None:
    """How this node checks its peers: when it serves TLS (on its fleet port too) its peers do
    as well, and their certificates must chain to `fleet_ca` (the system's CAs by default)
    and name the address they advertise."""
    if settings.tls_cert is None:
        return None
    cafile = str(settings.fleet_ca) if settings.fleet_ca else None
    return ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)


def node_figures(shared: Shared) -> NodeFigures:
    """This node's cache figures (every worker's counts) and totals, its mounts named by their
    buckets: what its heartbeat writes for `gateway status`, and what its console shows."""
    cache = cache_figures(shared.pages, shared.fills)
    requests, sent = counters.totals()
    names = {h.id: h.bucket for h in shared.namespace.mounts()}
    mounts = tuple(
        MountLine(
            names.get(m.mount_id, f"mount {m.mount_id}"),
            m.cache_bytes,
            m.pinned_bytes,
            m.capacity_bytes,
            m.hits,
            m.misses,
            m.preload_fills,
        )
        for m in cache.mounts
    )
    return NodeFigures(
        cache_bytes=cache.cache_bytes, hits=cache.hits, misses=cache.misses, requests=requests,
        sent_bytes=sent, capacity_bytes=cache.capacity_bytes, pinned_bytes=cache.pinned_bytes,
        preload_fills=cache.preload_fills, mounts=mounts,
    )  # fmt: skip


def s3_url(settings: Settings) -> str:
    """How clients reach this node's S3 port, told to clients that route reads to owners."""
    host = local_node(settings).address.rpartition(":")[0]
    scheme = "https" if settings.tls_cert is not None else "http"
    return f"{scheme}://{host}:{settings.port}"


class PlacementDocument:
    """/_gateway/placement: what a client needs to send each block read to the node that owns
    it, with the nodes' own placement function (gateway/client/routing.py): the members with
    their S3 URLs, weights and zones, the partition table's shape, and the mounts' block sizes
    and ids, of the buckets the caller's key may see (as ListBuckets shows them). `version`
    changes with any of them."""

    def __init__(self, settings: Settings, shared: Shared, fleet: Fleet | None) -> None:
        self._shared = shared
        self._fleet = fleet
        self._own = s3_url(settings)
        self._urls: dict[str, str] = {}  # peers' S3 URLs, asked once of each

    async def render(self, access_key: str | None) -> bytes:
        if self._fleet is None:
            members = [{"id": "local", "s3": self._own, "weight": 1.0, "zone": ""}]
            partitions, max_replicas = DEFAULT_PARTITIONS, DEFAULT_MAX_REPLICAS
        else:
            placement = self._fleet.placement
            partitions, max_replicas = placement.partitions, placement.max_replicas
            me = self._fleet.me.id
            self._urls.setdefault(me, self._own)
            unknown = [n for n in placement.nodes if n.id not in self._urls]
            if unknown:
                found = await asyncio.gather(
                    *(self._fleet.about(n) for n in unknown), return_exceptions=True
                )
                for node, about in zip(unknown, found, strict=True):
                    url = about.get("s3") if isinstance(about, dict) else None
                    if isinstance(url, str):
                        self._urls[node.id] = url
            members = [
                {"id": n.id, "s3": self._urls.get(n.id), "weight": n.weight, "zone": n.zone}
                for n in placement.nodes
            ]
        mounts = {
            h.bucket: {"id": h.id, "block_size": h.block_size, "replicas": h.replicas,
                       "cache": h.cache_enabled}
            for h in self._shared.namespace.mounts()
            if self._shared.namespace.auth.may_see(access_key, h.bucket)
        }  # fmt: skip
        shape = {"partitions": partitions, "max_replicas": max_replicas, "nodes": members}
        version = hashlib.sha256(json.dumps([shape, mounts], sort_keys=True).encode())
        return json.dumps({"version": version.hexdigest()[:16], **shape, "mounts": mounts}).encode()


class Node:
    """One gateway node: what its lifespan opens, and the ASGI entry point."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.shared: Shared | None = None
        self.s3: S3App | None = None
        self.admin = admin_app(lambda: self.s3 is not None, self._readiness)
        self._tasks: list[asyncio.Task[None]] = []
        self.membership: Membership | None = None
        self.internal: PeerApi | None = None
        self.internal_port = -1
        self.local: LocalReads | None = None
        self.jobs: JobRunner | None = None
        self.jobs_api: JobsApi | None = None
        self.console: Console | None = None

    async def start(self) -> None:
        s = self.settings
        meta = open_meta(s)
        await meta.migrate()
        pages = open_pages(s)
        await pages.open()
        fleet = None
        if s.fleet_secret:
            fleet = Fleet(local_node(s), s.fleet_secret, s.forward_timeout, fleet_tls(s))
        shared = Shared.build(
            meta, pages, s.metadata_ttl, s.cache_block_size, fleet, workers=s.workers,
            fill_concurrency=s.fill_concurrency, sub_block_size=s.cache_sub_block_size,
        )  # fmt: skip
        watch_cache(pages, shared.fills)
        # The one door for administration, for the console, the jobs API and the S3 API's
        # own bucket operations alike; it wakes the job loop once that runs.
        admin = Administration(meta, submitted=self._wake_jobs)
        service = S3Service(
            shared,
            readahead=s.readahead_blocks,
            multipart_max_age=s.multipart_max_age,
            bucket_store=s.bucket_store,
            bucket_store_options=s.bucket_store_option_map,
            door=admin,
        )
        shared.namespace.configure(s)  # the node's own files, kept out of every mount
        await shared.namespace.refresh()
        figures = functools.partial(node_figures, shared)
        if fleet is not None:
            await self._join_fleet(fleet, service.reader, meta, figures)
        self._tasks = [
            asyncio.create_task(shared.namespace.run(s.refresh_interval)),
            asyncio.create_task(service.multipart.run_janitor(min(3600.0, s.multipart_max_age))),
        ]
        self._tasks.append(asyncio.create_task(self._catalog_upkeep(shared).run()))
        if (folder := shared_dir()) is not None:  # one of several workers
            self._tasks.append(asyncio.create_task(publish_forever(pages, shared.fills, folder)))
        self._start_jobs(meta, service.reader, fleet, admin)
        self.console = Console(meta, shared, admin, s.heartbeat_timeout, figures=figures)
        self.shared = shared
        self.s3 = S3App(service, s.region, s.base_domain, s.access_log)
        if s.fast_hits:
            install_fast_path(s.port, self.s3.fast.answer)
        self._placement_doc = PlacementDocument(s, shared, fleet)
        self.s3.documents["placement"] = self._placement_doc.render
        if s.short_circuit:
            local = LocalReads(
                service, self.s3.verifier, s.effective_local_socket, s.allowed_local_uids
            )
            try:
                if await local.start():
                    self.local = local
            except OSError as exc:  # a path too long for a socket, a read-only data dir...
                log.warning("no short-circuit reads: %s", exc)

    async def _readiness(self) -> dict[str, str]:
        """What /readyz checks: the database answers and the mounts' secrets decrypt with the
        configured key (one listing of the mounts), and the cache folder is a writable folder.
        Liveness (/healthz) stays 200 meanwhile: the node serves what it can, a balancer or
        orchestrator sends its traffic elsewhere."""
        assert self.shared is not None
        found = {"database": "ok", "secrets": "ok", "cache": "ok"}
        try:
            async with asyncio.timeout(READY_TIMEOUT):
                await self.shared.meta.list_mounts()
        except WrongSecretKey as exc:
            found["secrets"] = "the configured encryption key does not decrypt the mounts"
            log.warning("not ready: %s", exc)
        except (MetaUnavailable, TimeoutError) as exc:
            found["database"] = found["secrets"] = "unreachable"
            log.warning("not ready: database unreachable: %s", exc or "timed out")
        root = self.shared.pages.root
        if not await asyncio.to_thread(lambda: os.path.isdir(root) and os.access(root, os.W_OK)):
            found["cache"] = "the cache folder is missing or not writable"
            log.warning("not ready: cache folder %s is missing or not writable", root)
        return found

    def _catalog_upkeep(self, shared: Shared) -> Upkeep:
        """Re-crawls and change notifications of the catalog=on mounts; a change the store
        notifies is forgotten here and, through the fleet, on every node."""

        def mounts() -> list[CatalogMount]:
            return [
                CatalogMount(h.id, h.mount.uri, store_options(h.mount.options), h.store, h.catalog)
                for h in shared.namespace.mounts()
                if h.catalog is not None
            ]

        async def changed(mount_id: int, key: str, info: ObjectInfo | None) -> None:
            handle = shared.namespace.by_id(mount_id)
            if handle is not None:
                await shared.versions.noticed(handle, key, info)
            if shared.fleet is not None:
                await shared.fleet.invalidate(mount_id, key)

        return Upkeep(shared.catalog, mounts, changed, self.settings.refresh_interval)

    async def _join_fleet(
        self, fleet: Fleet, reader: Reader, meta: MetaStore, figures: Callable[[], NodeFigures]
    ) -> None:
        s = self.settings
        me = fleet.me
        membership = Membership(
            meta,
            me,
            interval=s.heartbeat_interval,
            timeout=s.heartbeat_timeout,
            figures=figures,
            on_change=fleet.update,
        )
        await membership.start()
        self.membership = membership
        self.internal = PeerApi(reader, fleet, json.dumps({"s3": s3_url(s)}).encode())
        self.internal_port = s.effective_internal_port
        log.info("joined the fleet as %s at %s", me.id, me.address)

    def _wake_jobs(self) -> None:
        if self.jobs is not None:
            self.jobs.wake()

    def _start_jobs(
        self, meta: MetaStore, reader: Reader, fleet: Fleet | None, admin: Administration
    ) -> None:
        """The job loop (gateway/jobs): preload work for this node, polled from the database,
        woken by the one door for administration (gateway/admin/ops.py) when the console or
        the jobs API submits a job."""
        s = self.settings
        me = fleet.me if fleet is not None else local_node(s)
        registry = NodeRegistry(meta.engine, s.heartbeat_timeout)
        # A job's end is decided with the fleet's live nodes read in its own transaction.
        store = JobStore(meta.engine, registry.live_ids if fleet is not None else None)

        async def members() -> list[Member]:
            if fleet is None:
                return [Member(me, True)]
            return [Member(r.node, r.live, 0.0 if r.live else r.age) for r in await registry.read()]

        self.jobs = JobRunner(
            store, Loads(reader), me, members, lease=s.heartbeat_timeout,
            poll=min(1.0, s.heartbeat_interval), takeover_after=s.job_takeover_delay,
            workers=s.workers,
        )  # fmt: skip
        self.jobs_api = JobsApi(store, meta, admin)
        self._tasks.append(asyncio.create_task(self.jobs.run()))

    async def stop(self) -> None:
        install_fast_path(self.settings.port, None)
        if self.local is not None:
            await self.local.close()
        if self.jobs is not None:
            await self.jobs.stop()
        if self.membership is not None:
            await self.membership.stop()
        if self.shared is not None and self.shared.fleet is not None:
            await self.shared.fleet.close()
        if self.s3 is not None and self.s3.access_log is not None:
            self.s3.access_log.flush()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.shared is not None:
            await self.shared.close()
            await self.shared.pages.close()
            await self.shared.meta.close()

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
            elif is_jobs_path(scope["path"]) and self.jobs_api is not None:
                await self.jobs_api(scope, receive, send)
            elif is_console_path(scope["path"]) and self.console is not None:
                await self.console(scope, receive, send)
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
