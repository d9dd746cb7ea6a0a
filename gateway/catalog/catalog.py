"""The catalog as the request path uses it: which prefixes are synced, and listings of them.
Which prefixes are synced is held in process (re-read every few seconds): asking costs no
database round trip. A worker that reads a change of them tells the node's other workers
(`on_change`), which re-read before their next request: one node answers alike through all of
its workers as soon as one of them has seen a sync finish. The keys' rows are the table of
object versions (gateway.meta.versions), which gateway.service.versions reads and writes for
single keys and crawls reconcile."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.catalog.keys import decode_token
from gateway.catalog.listing import list_page
from gateway.meta import MetaUnavailable
from gateway.meta.catalog import catalog_syncs as S
from gateway.meta.store import transaction
from gateway.stores import ListPage

log = logging.getLogger(__name__)


def utcnow() -> datetime:
    return datetime.now(UTC)


class Catalog:
    def __init__(
        self,
        engine: AsyncEngine,
        clock: Callable[[], datetime] = utcnow,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self._synced: dict[int, tuple[str, ...]] = {}
        self._read = False  # whether refresh has read them once
        self._on_change = on_change
        dialect = postgresql if engine.dialect.name == "postgresql" else sqlite
        self.insert: Any = dialect.insert

    # -- which prefixes are synced -----------------------------------------------------------

    async def refresh(self) -> None:
        """Re-read which prefixes of which mounts have been synced; a change since the last
        read is told to `on_change` (the node's other workers re-read it then)."""
        query = sa.select(S.c.mount_id, S.c.prefix).where(S.c.synced_at.is_not(None))
        async with transaction(self.engine) as conn:
            rows = (await conn.execute(query)).all()
        synced: dict[int, list[str]] = {}
        for mount_id, prefix in rows:
            synced.setdefault(mount_id, []).append(prefix)
        now = {m: tuple(sorted(p)) for m, p in synced.items()}
        before, self._synced = self._synced, now
        if self._read and before != now and self._on_change is not None:
            self._on_change()
        self._read = True

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
