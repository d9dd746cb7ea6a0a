"""What the service's reader, writer, multipart and buckets share, built once per node and
handed to each: none of them reaches the others through a common owner."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Protocol

from gateway import errors
from gateway.cache import Fills, PageStore
from gateway.catalog import Catalog
from gateway.cluster.peers import Fleet
from gateway.generations import Generations, OpenClaims
from gateway.meta import MetaStore
from gateway.service.learnt import LearntVersions
from gateway.service.listed import ListedVersions
from gateway.service.metadata import MetadataCache
from gateway.service.namespace import MountHandle, Namespace
from gateway.service.revalidation import Revalidator
from gateway.service.version_rows import VersionRows
from gateway.service.versions import Versions
from gateway.stores import ObjectInfo


@dataclass(frozen=True, slots=True)
class Shared:
    meta: MetaStore
    pages: PageStore
    fills: Fills  # blocks on their way in from the stores, over `pages`
    namespace: Namespace
    metadata: MetadataCache  # what this node knows of each object's current version
    versions: Versions  # the one authority on each key's current version (versions.py)
    fleet: Fleet | None  # None on a node that runs alone
    catalog: Catalog  # the keys of catalog=on mounts, in the database
    generations: Generations  # the node's change counters, shared by its workers
    opens: OpenClaims | None  # which of the node's workers opens a key (None: one worker)

    @classmethod
    def build(
        cls,
        meta: MetaStore,
        pages: PageStore,
        default_ttl: float,
        block_size: int,
        fleet: Fleet | None = None,
        workers: int = 1,
        fill_concurrency: int = 16,
        sub_block_size: int = 0,
    ) -> Shared:
        def mounts_changed(handles: list[MountHandle]) -> None:
            pages.set_quotas({h.id: h.quota for h in handles if h.quota is not None})

        # The workers of a node tell each other of the keys, mounts and tenants that change
        # (generations.py), and share the versions they learn (learnt.py); the CLI on the
        # node's host tells them too, through the same counters.
        generations = Generations(pages.root)
        catalog = Catalog(meta.engine, on_change=generations.bump_state)
        namespace = Namespace(meta, default_ttl, block_size, mounts_changed, generations, catalog)
        meta.on_change = generations.bump_state
        several = workers > 1
        metadata = MetadataCache(
            generations, learnt=LearntVersions(pages.root) if several else None
        )
        revalidator = Revalidator(ListedVersions(pages.root))
        fills = Fills(pages, fill_concurrency=fill_concurrency, sub_block_size=sub_block_size)
        opens = OpenClaims(pages.root) if several else None
        versions = Versions(
            metadata, VersionRows(meta), catalog, pages, revalidator, fills, fleet, opens
        )
        return cls(
            meta, pages, fills, namespace, metadata, versions, fleet, catalog, generations, opens
        )  # fmt: skip

    async def close(self) -> None:
        """Close what build opened (the fills in flight cancelled); the node closes the
        metadata and page stores it gave."""
        await self.versions.revalidator.close()  # its background listings, before the stores
        await self.fills.close()
        await self.versions.rows.close()  # versions learnt or written, briefly
        await self.namespace.close()
        self.metadata.close()
        if self.opens is not None:
            self.opens.close()
        self.generations.close()

    def mount(self, bucket: str) -> MountHandle:
        handle = self.namespace.mount(bucket)
        if handle is None:
            raise errors.NoSuchBucket(BucketName=bucket)
        return handle

    def writable(self, bucket: str) -> MountHandle:
        handle = self.mount(bucket)
        if handle.read_only:
            raise errors.AccessDenied("The bucket is mounted read-only.")
        return handle


class Reads(Protocol):
    """What a copy asks of the read side: the source's current version, and its bytes from
    the cache where it can."""

    async def stat(self, handle: MountHandle, key: str) -> ObjectInfo: ...

    async def open_body(
        self, handle: MountHandle, info: ObjectInfo, start: int, end: int
    ) -> AsyncGenerator[bytes, None]: ...
