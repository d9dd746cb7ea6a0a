"""Revalidation in bulk: held versions confirmed by listing their prefix, a thousand a request.

Once the TTL has run out, a dataset of N objects read again costs N store round trips if each
key is asked alone (a HEAD). Object stores list a thousand keys with their ETags and sizes in
one request, so the node lists instead wherever more than a lone key of one prefix needs
revalidating: the first key past its TTL under a prefix is asked alone (a lone key stays one
HEAD); the next ones within a TTL list the page of the prefix that holds them, and every key
the listing spans is answered from it (listed.py) by every worker of the node until the TTL
runs out again. Pages begin where they began before (listed.py, `edge`): readers in any order
list each page once a TTL. Concurrent askers join a listing in flight that will span them.
`cover()` lists ahead for many keys at once (a short-circuit client's lease renewal).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from collections import deque
from collections.abc import Callable

from gateway import counters
from gateway.bounded import Bounded
from gateway.service.listed import END, Listed, ListedVersions, after_for, prefix_of
from gateway.service.namespace import MountHandle
from gateway.service.store_errors import store_errors

log = logging.getLogger(__name__)

PAGE = 1000  # keys a listing asks for
LONE = 1  # revalidations of a prefix within a TTL that are asked alone, before it is listed
_PREFIXES_KEPT = 4096  # prefixes whose recent revalidations are counted
# A prefix revalidated within HOT_FOR of its TTLs is kept listed ahead: its pages are listed
# again once older than AHEAD of the TTL, so that a reader back after a short pause (a lease
# renewal, an epoch's first reads) finds a listing within the TTL and waits for no store
# request; it costs the store a listing a page every AHEAD of a TTL, HOT_FOR TTLs long.
HOT_FOR = 4
AHEAD = 0.75
_AHEAD_TICK = 0.5  # seconds between looks for pages to list again (x 0.5-1, jittered)


class Revalidator:
    """Decides how held versions are revalidated, and lists (see the module)."""

    def __init__(
        self,
        listed: ListedVersions,
        wall: Callable[[], float] = time.time,
        page: int = PAGE,
        ahead_tick: float | None = _AHEAD_TICK,
    ) -> None:
        """`ahead_tick`: seconds between looks for pages to list ahead (None: only when
        `ahead()` is called)."""
        self.listed = listed
        self._wall = wall
        self._ahead_tick = ahead_tick
        self._page_keys = page
        self._recent: Bounded[tuple[int, str], deque[float]] = Bounded(_PREFIXES_KEPT)
        # Listings in flight by prefix: (start-after, done when recorded).
        self._listing_now: dict[tuple[int, str], list[tuple[str, asyncio.Future[None]]]] = {}
        # Prefixes whose pages are walked (`_walk`), and the furthest key wanted of each.
        self._walks: dict[tuple[int, str], asyncio.Task[None]] = {}
        self._wanted: dict[tuple[int, str], str] = {}
        # Prefixes kept listed ahead (`ahead`): their mount, and when last revalidated.
        self._hot: Bounded[tuple[int, str], tuple[MountHandle, float]] = Bounded(_PREFIXES_KEPT)
        self._keeping: asyncio.Task[None] | None = None

    def lookup(self, handle: MountHandle, key: str) -> Listed | None:
        """What a listing within the mount's TTL said of the key; None if none spans it."""
        if handle.ttl <= 0:
            return None
        return self.listed.lookup(handle.id, key, self._wall() - handle.ttl)

    def lookup_many(self, handle: MountHandle, keys: list[str]) -> dict[str, Listed]:
        """lookup() of many keys at once: those a listing within the TTL spans."""
        if handle.ttl <= 0:
            return {}
        return self.listed.lookup_many(handle.id, keys, self._wall() - handle.ttl)

    def kept(self, handle: MountHandle, key: str) -> tuple[Listed, float] | None:
        """What a listing asked within the mount's TTL said of the key, and how many seconds
        ago it was asked, from the spans this process has read only: no query, no await (a
        hit past its TTL, answered at once where `find` would have found the same). None when
        none it holds spans the key: the full path revalidates then."""
        if handle.ttl <= 0:
            return None
        wall = self._wall()
        found = self.listed.kept(handle.id, key, wall - handle.ttl)
        if found is None:
            return None
        self._touch(handle, prefix_of(key), wall)  # read from listings: keep them listed ahead
        return found, max(0.0, wall - found.at)

    async def find(self, handle: MountHandle, key: str) -> Listed | None:
        """What a listing within the TTL says of the key, listing its prefix from it when more
        than a lone key of the prefix wanted revalidating lately; None: ask the key alone."""
        if handle.ttl <= 0:
            return None  # "always revalidate": a listing from before the request won't do
        self._touch(handle, prefix_of(key))
        found = self.lookup(handle, key)
        if found is not None:
            return found
        if self._lone(handle, key):
            return None
        await self._list(handle, key)
        return self.lookup(handle, key)

    async def cover(self, handle: MountHandle, keys: list[str], fresh_for: float = 0.0) -> None:
        """List ahead so that a listing within the TTL spans each key (many keys wanted at
        once: a lease renewal), side by side, until each is spanned or no listing helps;
        `fresh_for`: within the TTL less this many seconds (a renewal ahead of the lapse)."""
        if handle.ttl <= 0 or len(keys) <= LONE:
            return
        since = self._wall() - handle.ttl + max(0.0, min(fresh_for, handle.ttl))
        for prefix in {prefix_of(k) for k in keys}:
            self._touch(handle, prefix)  # renewed from listings: keep them listed ahead
        todo = sorted(k for k in keys if self.listed.lookup(handle.id, k, since) is None)
        while todo:
            # Each page that spans a key, from its edge; where no page began at a key's edge
            # yet, one from every PAGE-th such key instead (and the pages are walked from the
            # edge in the background: listing page after page while a client waits, 8,000
            # keys would cost 8 round trips in a row). All side by side.
            starts: dict[tuple[str, str], bool] = {}
            for prefix, in_prefix in itertools.groupby(todo, prefix_of):
                edges = self.listed.edges(handle.id, prefix)
                unknown: list[str] = []
                for key in in_prefix:
                    start, known = edges.below(key)
                    if known:
                        starts[(prefix, start)] = True
                    else:
                        unknown.append(key)
                for key in unknown[:: self._page_keys]:
                    starts[(prefix, after_for(key))] = False
                if unknown:
                    self._walk(handle, prefix, unknown[-1])
            await asyncio.gather(
                *(self._listing(handle, prefix, start, chained)
                  for (prefix, start), chained in starts.items())
            )  # fmt: skip
            left = [k for k in todo if self.listed.lookup(handle.id, k, since) is None]
            if len(left) == len(todo):
                return  # no listing spans them (their TTL is shorter than a listing): alone
            todo = left

    async def ahead(self) -> int:
        """List again the pages of the prefixes revalidated within HOT_FOR of their TTLs whose
        newest listing is older than AHEAD of their TTL; how many. The node's workers share the
        listings (listed.py): a page another worker listed meanwhile is not listed again."""
        now = self._wall()
        todo = []
        for at, (handle, last) in list(self._hot.items()):
            if now - last > HOT_FOR * handle.ttl or handle.ttl <= 0:
                del self._hot[at]
                continue
            edges = self.listed.edges(handle.id, at[1])
            todo += [(handle, at[1], after) for after, when in edges.listed_at.items()
                     if now - when > AHEAD * handle.ttl]  # fmt: skip
        await asyncio.gather(
            *(self._listing(handle, prefix, after, True) for handle, prefix, after in todo),
            return_exceptions=True,  # a hint only: a reader asks the store itself meanwhile
        )
        return len(todo)

    def _touch(self, handle: MountHandle, prefix: str, wall: float | None = None) -> None:
        """The prefix is revalidated now: keep it listed ahead for HOT_FOR of its TTLs."""
        at = (handle.id, prefix)
        self._hot.put(at, (handle, self._wall() if wall is None else wall))
        if self._keeping is None and self._ahead_tick is not None:
            self._keeping = asyncio.get_running_loop().create_task(self._keep_ahead())

    async def _keep_ahead(self) -> None:
        try:
            while self._hot and self._ahead_tick is not None:
                await asyncio.sleep(self._ahead_tick * random.uniform(0.5, 1.0))
                await self.ahead()
        except Exception as exc:
            log.warning("revalidation: listing ahead stopped: %r", exc)
        finally:
            self._keeping = None

    async def close(self) -> None:
        """Stop listing in the background (the pages walked, the prefixes kept listed ahead),
        then close the listings' file: before the stores are closed."""
        tasks = [*self._walks.values(), *([self._keeping] if self._keeping else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.listed.close()

    async def walked(self) -> None:
        """Until the pages being walked (`_walk`) are listed."""
        while self._walks:
            await asyncio.gather(*self._walks.values(), return_exceptions=True)

    def _lone(self, handle: MountHandle, key: str) -> bool:
        """Whether this revalidation is of a lone key of its prefix (counted): few of the
        prefix were wanted within the last TTL."""
        at = (handle.id, prefix_of(key))
        now = self._wall()
        recent = self._recent.get(at)
        if recent is None:
            recent = deque()
            self._recent.put(at, recent)
        while recent and recent[0] < now - handle.ttl:
            recent.popleft()
        recent.append(now)
        return len(recent) <= LONE

    async def _list(self, handle: MountHandle, key: str) -> None:
        """A listing that spans the key: the one in flight that will span it (begun at or
        before it), else the page from its edge (`ListedVersions.edge`); where no page began
        at that edge yet, one from the key itself while the pages are walked to it."""
        prefix = prefix_of(key)
        for after, done in self._listing_now.get((handle.id, prefix), ()):
            if after < key:
                await asyncio.shield(done)
                if self.lookup(handle, key) is not None:
                    return
                break
        start, known = self.listed.edge(handle.id, prefix, key)
        if known:
            await self._listing(handle, prefix, start, True)
        else:
            self._walk(handle, prefix, key)
            await self._listing(handle, prefix, after_for(key), False)

    def _walk(self, handle: MountHandle, prefix: str, key: str) -> None:
        """List the prefix's pages one after another from its start, where none began yet, up
        to `key` (or the furthest key wanted meanwhile), in the background: from the next TTL
        on, every key of the prefix has an edge to be listed from, each page once."""
        at = (handle.id, prefix)
        self._wanted[at] = max(self._wanted.get(at, ""), key)
        if at not in self._walks:
            self._walks[at] = asyncio.get_running_loop().create_task(self._walking(handle, prefix))

    async def _walking(self, handle: MountHandle, prefix: str) -> None:
        at = (handle.id, prefix)
        try:
            while True:
                gap = self.listed.edges(handle.id, prefix).gap()
                if gap is None or gap >= self._wanted.get(at, ""):
                    return
                await self._listing(handle, prefix, gap, True)
        except Exception as exc:  # a hint only: readers list from their keys meanwhile
            log.debug("revalidation: pages of %s not walked: %r", prefix, exc)
        finally:
            self._wanted.pop(at, None)
            # Wound up in the same step as the last look at what is wanted, so that a key
            # wanted after it starts a walk of its own (a done callback, run later, left a
            # window in which _walk() found this one running and its wish was lost).
            if self._walks.get(at) is asyncio.current_task():
                del self._walks[at]

    async def _listing(self, handle: MountHandle, prefix: str, after: str, chained: bool) -> None:
        """One listing of the prefix after `after`, recorded; joins one in flight from the
        same place."""
        at = (handle.id, prefix)
        flying = self._listing_now.setdefault(at, [])
        for begun, done in flying:
            if begun == after:
                await asyncio.shield(done)
                return
        done = asyncio.get_running_loop().create_future()
        entry = (after, done)
        flying.append(entry)
        try:
            await self._page(handle, prefix, after, chained)
        finally:
            flying.remove(entry)
            if not flying:
                self._listing_now.pop(at, None)
            done.set_result(None)

    async def _page(self, handle: MountHandle, prefix: str, after: str, chained: bool) -> None:
        asked = self._wall()
        with store_errors(prefix):
            page = await handle.store.list_page(
                prefix, "/", None, max(after, prefix), self._page_keys
            )
        entries = [(o.key, o.etag, o.size) for o in page.objects]
        hi: str | None = None
        if page.next_token is not None:
            hi = max([e[0] for e in entries[-1:]] + page.common_prefixes[-1:], default=after)
        self.listed.record(handle.id, prefix, after, hi, asked, entries, chained)
        if not chained:
            # Listed from a key, ahead of the pages walked: walk as far as this page went.
            self._walk(handle, prefix, prefix + END if hi is None else hi)
        counters.revalidation_listing(handle.kind, len(entries))
