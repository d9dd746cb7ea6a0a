"""The catalog as the request path uses it: listings and lookups of synced prefixes, and what
writes through the gateway change, at once. Which prefixes are synced is held in process
(re-read every few seconds): asking costs no database round trip."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.catalog.keys import decode_token
from gateway.catalog.listing import list_page
from gateway.catalog.rows import entry_info, entry_row
from gateway.meta import MetaUnavailable
from gateway.meta.catalog import catalog_entries as E
from gateway.meta.catalog import catalog_syncs as S
from gateway.meta.store import transaction
from gateway.stores import ListPage, ObjectInfo

log = logging.getLogger("gateway.catalog")

_BATCH = 256  # keys a lookup query at most


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class Entry:
    """A key as the catalog has it; `complete` False: only what a listing tells."""

    info: ObjectInfo
    complete: bool


class Catalog:
    def __init__(self, engine: AsyncEngine, clock: Callable[[], datetime] = utcnow) -> None:
        self.engine = engine
        self.clock = clock
        self._synced: dict[int, tuple[str, ...]] = {}
        self._wanted: dict[tuple[int, str], asyncio.Future[Entry | None]] = {}
        self._finder: asyncio.Task[None] | None = None
        dialect = postgresql if engine.dialect.name == "postgresql" else sqlite
        self.insert: Any = dialect.insert

    # -- which prefixes are synced -----------------------------------------------------------

    async def refresh(self) -> None:
        """Re-read which prefixes of which mounts have been synced."""
        query = sa.select(S.c.mount_id, S.c.prefix).where(S.c.synced_at.is_not(None))
        async with transaction(self.engine) as conn:
            rows = (await conn.execute(query)).all()
        synced: dict[int, list[str]] = {}
        for mount_id, prefix in rows:
            synced.setdefault(mount_id, []).append(prefix)
        self._synced = {m: tuple(p) for m, p in synced.items()}

    def covers(self, mount_id: int, key: str) -> bool:
        """Whether the catalog answers for `key` (or for a listing of prefix `key`)."""
        prefixes = self._synced.get(mount_id)
        return prefixes is not None and key.startswith(prefixes)

    # -- reads -------------------------------------------------------------------------------

    async def list_page(
        self,
        mount_id: int,
        prefix: str,
        delimiter: str | None,
        token: str | None,
        start_after: str | None,
        max_keys: int,
    ) -> ListPage | None:
        """A page of the listing; None when the catalog does not answer for it (the prefix is
        not synced, the token is a store's, the database is away): the store does.
        ValueError for a malformed catalog token."""
        if not self.covers(mount_id, prefix):
            return None
        after = start_after
        if token is not None:
            after = decode_token(token)
            if after is None:
                return None
        try:
            async with transaction(self.engine) as conn:
                return await list_page(conn, mount_id, prefix, delimiter, after, max_keys)
        except MetaUnavailable as exc:
            log.warning("catalog unavailable, listing from the store: %s", exc)
            return None

    @staticmethod
    def for_store(token: str | None, start_after: str | None) -> tuple[str | None, str | None]:
        """A listing's (token, start-after) as the store takes them, when the catalog did not
        answer a page: a catalog's token (the database went away mid-listing) becomes the
        start-after it means. ValueError for a malformed catalog token."""
        after = None if token is None else decode_token(token)
        return (token, start_after) if after is None else (None, after)

    async def lookup(self, mount_id: int, key: str) -> Entry | None:
        """The catalogued version of `key`; None when the catalog does not answer for it, or
        has no entry (then the store is asked: a key made behind the gateway's back is found).

        The lookups of one turn of the event loop are one query (as the recorder's are): a
        connection and a transaction each cost more than the row, and concurrent cold readers
        would queue for the pool's connections."""
        if not self.covers(mount_id, key):
            return None
        wanted = self._wanted.get((mount_id, key))
        if wanted is None:
            wanted = asyncio.get_running_loop().create_future()
            self._wanted[(mount_id, key)] = wanted
            if self._finder is None:
                self._finder = asyncio.create_task(self._find())
        return await asyncio.shield(wanted)

    async def _find(self) -> None:
        batch: dict[tuple[int, str], asyncio.Future[Entry | None]] = {}
        try:
            while self._wanted:
                await asyncio.sleep(0)  # the lookups of this turn of the loop join in
                batch = {item: self._wanted.pop(item) for item in list(self._wanted)[:_BATCH]}
                try:
                    found = await self._select(list(batch))
                except Exception as exc:  # asked of the store instead
                    log.warning("catalog lookup of %d keys failed: %s", len(batch), exc)
                    found = {}
                for item, wanted in batch.items():
                    if not wanted.done():
                        wanted.set_result(found.get(item))
        finally:
            self._finder = None
            for wanted in [*batch.values(), *self._wanted.values()]:  # cancelled: no answer
                if not wanted.done():
                    wanted.set_result(None)

    async def _select(self, items: list[tuple[int, str]]) -> dict[tuple[int, str], Entry]:
        by_mount: dict[int, list[str]] = {}
        for mount_id, key in items:
            by_mount.setdefault(mount_id, []).append(key)
        found: dict[tuple[int, str], Entry] = {}
        async with transaction(self.engine) as conn:
            for mount_id, keys in by_mount.items():
                query = sa.select(E).where(E.c.mount_id == mount_id, E.c.key.in_(keys))
                for row in await conn.execute(query):
                    found[(mount_id, row.key)] = Entry(entry_info(row), row.complete)
        return found

    # -- changes -----------------------------------------------------------------------------

    async def written(self, mount_id: int, key: str, info: ObjectInfo | None) -> None:
        """A write through the gateway made `info` the key's version (None: deleted it), in
        a transaction of its own."""
        await self._change(self.change(mount_id, key, info), key)

    def change(self, mount_id: int, key: str, info: ObjectInfo | None) -> Any:
        """The statement that makes `info` the key's catalogued version (None: removes the
        key), for the caller to run in the transaction of the rest of a write's bookkeeping
        (gateway.service.writes): its failure is the caller's to log."""
        if info is None:
            return self._removal(mount_id, key)
        return self._upsert(mount_id, info, complete=True)

    async def learnt(self, mount_id: int, key: str, info: ObjectInfo | None) -> None:
        """The store told the key's version (None: it has none), where the catalog did not:
        kept for the next reader, under a synced prefix."""
        if self.covers(mount_id, key):
            await self.written(mount_id, key, info)

    async def put(self, mount_id: int, info: ObjectInfo, complete: bool = True) -> None:
        """`info` is the key's current version (a write through the gateway, or the store's
        own answer)."""
        await self._change(self._upsert(mount_id, info, complete), info.key)

    async def remove(self, mount_id: int, key: str) -> None:
        """The key has no version any more."""
        await self._change(self._removal(mount_id, key), key)

    def _upsert(self, mount_id: int, info: ObjectInfo, complete: bool) -> Any:
        row = entry_row(mount_id, info, complete, self.clock())
        insert = self.insert(E).values(row)
        update = {name: insert.excluded[name] for name in row if name not in ("mount_id", "key")}
        return insert.on_conflict_do_update(index_elements=["mount_id", "key"], set_=update)

    @staticmethod
    def _removal(mount_id: int, key: str) -> sa.Delete:
        return sa.delete(E).where(E.c.mount_id == mount_id, E.c.key == key)

    async def doubt(self, mount_id: int, key: str) -> None:
        """The catalogued version was not found at the store: listed still, but not trusted
        for reads until the store has been asked again."""
        query = sa.update(E).where(E.c.mount_id == mount_id, E.c.key == key).values(complete=False)
        await self._change(query, key)

    async def _change(self, query: Any, key: str) -> None:
        try:
            async with transaction(self.engine) as conn:
                await conn.execute(query)
        except MetaUnavailable as exc:
            # The store has the change; the next crawl brings the catalog up to it.
            log.warning("catalog not updated for %s: %s", key, exc)
        except Exception:
            # Never the client's failure: what it asked of the store was done.
            log.exception("catalog not updated for %s", key)
