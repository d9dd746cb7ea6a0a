"""Revalidation in bulk: held versions confirmed by listing their prefix, a thousand a request.

Once the TTL has run out, a dataset of N objects read again costs N store round trips if each
key is asked alone (a HEAD). Object stores list a thousand keys with their ETags and sizes in
one request, so the node lists instead wherever more than a lone key of one prefix needs
revalidating: the first key past its TTL under a prefix is asked alone (a lone key stays one
HEAD); the next ones within a TTL list the prefix from themselves, and every key the listing
spans is answered from it (listed.py) by every worker of the node until the TTL runs out
again. Concurrent askers of one prefix join a listing in flight that will span them.
`cover()` lists ahead for many keys at once (a short-circuit client's lease renewal).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

from gateway import counters
from gateway.service.listed import Listed, ListedVersions, after_for, prefix_of
from gateway.service.namespace import MountHandle
from gateway.service.store_errors import store_errors

log = logging.getLogger(__name__)

PAGE = 1000  # keys a listing asks for
LONE = 1  # revalidations of a prefix within a TTL that are asked alone, before it is listed
_PREFIXES_KEPT = 4096  # prefixes whose recent revalidations are counted


class Revalidator:
    """Decides how held versions are revalidated, and lists (see the module)."""

    def __init__(self, listed: ListedVersions, wall: Callable[[], float] = time.time) -> None:
        self.listed = listed
        self._wall = wall
        self._recent: dict[tuple[int, str], deque[float]] = {}
        # Listings in flight by prefix: (start-after, done when recorded).
        self._listing: dict[tuple[int, str], list[tuple[str, asyncio.Future[None]]]] = {}

    def lookup(self, handle: MountHandle, key: str) -> Listed | None:
        """What a listing within the mount's TTL said of the key; None if none spans it."""
        if handle.ttl <= 0:
            return None
        return self.listed.lookup(handle.id, key, self._wall() - handle.ttl)

    async def find(self, handle: MountHandle, key: str) -> Listed | None:
        """What a listing within the TTL says of the key, listing its prefix from it when more
        than a lone key of the prefix wanted revalidating lately; None: ask the key alone."""
        if handle.ttl <= 0:
            return None  # "always revalidate": a listing from before the request won't do
        found = self.lookup(handle, key)
        if found is not None:
            return found
        if self._lone(handle, key):
            return None
        await self._list(handle, key)
        return self.lookup(handle, key)

    async def cover(self, handle: MountHandle, keys: list[str]) -> None:
        """List ahead so that a listing within the TTL spans each key (many keys wanted at
        once: a lease renewal), prefix by prefix from the first key not yet spanned."""
        if handle.ttl <= 0 or len(keys) <= LONE:
            return
        todo = sorted(k for k in keys if self.lookup(handle, k) is None)
        while todo:
            # A listing from every PAGE-th key not yet spanned, side by side (one after
            # another, 8,000 keys cost 8 round trips in a row while a client waits); where the
            # store holds keys between them that were not asked for, a page ends short of the
            # next start and the next round lists from the first key left.
            await asyncio.gather(*(self._list(handle, k, join=False) for k in todo[::PAGE]))
            left = [k for k in todo if self.lookup(handle, k) is None]
            if len(left) == len(todo):
                return  # no listing spans them (their TTL is shorter than a listing): alone
            todo = left

    def _lone(self, handle: MountHandle, key: str) -> bool:
        """Whether this revalidation is of a lone key of its prefix (counted): few of the
        prefix were wanted within the last TTL."""
        at = (handle.id, prefix_of(key))
        now = self._wall()
        recent = self._recent.get(at)
        if recent is None:
            if len(self._recent) >= _PREFIXES_KEPT:
                del self._recent[next(iter(self._recent))]
            recent = self._recent[at] = deque()
        while recent and recent[0] < now - handle.ttl:
            recent.popleft()
        recent.append(now)
        return len(recent) <= LONE

    async def _list(self, handle: MountHandle, key: str, join: bool = True) -> None:
        """One listing of the key's prefix from the key, or (`join`) the one in flight that
        will span it (begun at or before it, and recorded once over)."""
        at = (handle.id, prefix_of(key))
        flying = self._listing.setdefault(at, [])
        for after, done in flying if join else ():
            if after < key:
                await asyncio.shield(done)
                if self.lookup(handle, key) is not None:
                    return
                break
        done = asyncio.get_running_loop().create_future()
        entry = (after_for(key), done)
        flying.append(entry)
        try:
            await self._page(handle, at[1], entry[0])
        finally:
            flying.remove(entry)
            if not flying:
                self._listing.pop(at, None)
            done.set_result(None)

    async def _page(self, handle: MountHandle, prefix: str, after: str) -> None:
        asked = self._wall()
        with store_errors(prefix):
            page = await handle.store.list_page(prefix, "/", None, max(after, prefix), PAGE)
        entries = [(o.key, o.etag, o.size) for o in page.objects]
        hi: str | None = None
        if page.next_token is not None:
            hi = max([e[0] for e in entries[-1:]] + page.common_prefixes[-1:], default=after)
        self.listed.record(handle.id, prefix, after, hi, asked, entries)
        counters.revalidation_listing(handle.kind, len(entries))
