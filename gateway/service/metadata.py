"""In-process object metadata with per-mount TTL: what keeps a hot hit off store and database.

What a worker remembers of a key holds only while the key's change counter (generations.py)
holds the value it held *before* the version was asked for: each answer is put with the
`ticket` its asker took before sending the question, so that an answer that left the store
before a write or delete through any worker of the node, and arrives after it, is never
trusted. And what one worker learns, the others find in the node's shared record (learnt.py)
when they do not know the key themselves: a version is asked of the store once per node, not
per worker.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable

from gateway.generations import Counters
from gateway.service.learnt import LearntVersions
from gateway.stores.base import ObjectInfo

# Asked of a version past its TTL (its ETag and size): seconds since a listing told it, or None.
Confirm = Callable[[str, int], float | None]

# A version the shared record could not take is published again this often by shared(),
# pausing SHARE_PAUSE seconds before the first try (doubling, at most 50 ms): ~0.4 s in all.
SHARE_TRIES = 8
SHARE_PAUSE = 0.002
_UNSHARED_MAX = 65_536  # versions kept for published() at most
_RESHARE_MAX = 64  # versions refused earlier published again with a put's, at most


class MetadataCache:
    """(mount id, key) -> (ObjectInfo, time checked, generation), LRU-bounded by entry count.
    `generations`: the node's change counters (shared by its workers through a file, or a
    process's own with one worker); `learnt`: the versions its workers share (None: one
    worker). `wall`: the clock the shared records are stamped with (the TTL counts from
    learning, which is when the version was asked for); `mono`: the clock of the `now`s
    given (time.monotonic)."""

    def __init__(
        self,
        generations: Counters,
        max_entries: int = 1_000_000,
        learnt: LearntVersions | None = None,
        wall: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max = max_entries
        self._items: OrderedDict[tuple[int, str], tuple[ObjectInfo, float, int]] = OrderedDict()
        self._generations = generations
        if learnt is not None and not learnt.shared:
            learnt.close()  # the node's file could not be opened: this worker keeps to itself
            learnt = None
        self._learnt = learnt
        self._wall = wall
        self._mono = mono  # the clock of the `now`s given (put's: when a version was asked)
        # Versions requests named by id, by key: (info, the key's generation when asked). A
        # version never changes; it is forgotten with its key (a write or delete of it).
        self._versions: OrderedDict[tuple[int, str], dict[str, tuple[ObjectInfo, int]]] = (
            OrderedDict()
        )
        # Versions put here that the node's shared record was too busy to take: (info, wall
        # time learnt, generation), published again by published().
        self._unshared: dict[tuple[int, str], tuple[ObjectInfo, float, int]] = {}

    def ticket(self, mount_id: int, key: str) -> int:
        """The key's change counter now: what a question about the key asked next (of the
        store, a peer, the database) is put() under, taken before the question is sent."""
        gens = self._generations
        return gens.current(gens.slot(mount_id, key))

    def fresh(
        self, mount_id: int, key: str, ttl: float, now: float, listed: Confirm | None = None
    ) -> ObjectInfo | None:
        """The version known within the TTL, or None. `listed`: asked of a version past its TTL
        (this worker's, or the node's shared record's), how many seconds ago a listing within
        the TTL told it (None: none did); the version is fresh again from then."""
        item = self._items.get((mount_id, key))
        if item is not None:
            info, checked, generation = item
            if self.ticket(mount_id, key) != generation:
                pass  # changed since it was asked (kept as a hint for peek())
            elif ttl < 0 or now - checked < ttl:
                self._items.move_to_end((mount_id, key))
                return info
            elif listed is not None and (age := listed(info.etag, info.size)) is not None:
                # Confirmed by a listing asked after it was learnt (the TTL has run out since).
                self._items[(mount_id, key)] = (info, now - age, generation)
                self._items.move_to_end((mount_id, key))
                return info
        shared = self._shared(mount_id, key, now)
        if shared is None:
            return None
        if ttl < 0 or now - shared[1] < ttl:
            return shared[0]
        if listed is not None and (age := listed(shared[0].etag, shared[0].size)) is not None:
            item = self._items.get((mount_id, key))  # taken in by _shared(), if still trusted
            if item is not None and item[0] is shared[0]:
                self._items[(mount_id, key)] = (shared[0], now - age, item[2])
                return shared[0]
        return None

    def age(self, mount_id: int, key: str, now: float) -> float | None:
        """Seconds since the version remembered of the key was learnt (None: none)."""
        item = self._items.get((mount_id, key))
        return None if item is None else max(0.0, now - item[1])

    def holds(self, mount_id: int, key: str) -> bool:
        """Whether this worker remembers a version of the key (trusted or not); no I/O."""
        return (mount_id, key) in self._items

    def peek(self, mount_id: int, key: str) -> ObjectInfo | None:
        """The last version known, however old: a hint (the read checks it with the store)."""
        item = self._items.get((mount_id, key))
        if item is None:
            shared = self._shared(mount_id, key)
            return None if shared is None else shared[0]
        return item[0]

    def _shared(
        self, mount_id: int, key: str, now: float | None = None
    ) -> tuple[ObjectInfo, float] | None:
        """The version a sibling worker learnt, if no change of the key has been heard of
        since it asked; with `now`, taken into this worker's memory as learnt when the sibling
        learnt it (in the clock of `now`)."""
        learnt = self._learnt
        if learnt is None:
            return None
        generation = self.ticket(mount_id, key)
        found = learnt.lookup(mount_id, key)
        if found is None or found[2] != generation:
            return None
        info, at, _ = found
        if now is None:
            return info, at
        checked = now - max(0.0, self._wall() - at)
        self._items[(mount_id, key)] = (info, checked, generation)
        self._items.move_to_end((mount_id, key))
        return info, checked

    def put(self, mount_id: int, key: str, info: ObjectInfo, now: float, ticket: int) -> bool:
        """Remember the key's version, learnt now by a question asked under `ticket` (see
        ticket()), and share it with the node's other workers (a record the shared file could
        not take now is kept for published()). False when the key changed after the question
        was asked: the answer is kept as a hint only (peek), trusted by no read."""
        self._items[(mount_id, key)] = (info, now, ticket)
        self._items.move_to_end((mount_id, key))
        while len(self._items) > self._max:
            self._items.popitem(last=False)
        if self.ticket(mount_id, key) != ticket:
            return False
        if self._learnt is not None:
            generation = ticket
            # Learnt as of `now` (when it was asked), in the shared record's clock: siblings
            # count the TTL from there too, not from when the answer came.
            at = self._wall() - max(0.0, self._mono() - now)
            if self._learnt.publish(mount_id, key, info, at, generation):
                self._unshared.pop((mount_id, key), None)
                if self._unshared:  # the file is free now: those refused earlier, with it
                    self._share_unshared()
            else:
                if len(self._unshared) >= _UNSHARED_MAX:
                    self._unshared.clear()  # those not waited for by published(): hints lost
                self._unshared[(mount_id, key)] = (info, at, generation)
        return True

    def _share_unshared(self) -> None:
        """Publish up to _RESHARE_MAX of the versions the shared record refused (a sibling's
        write held it), in one write. Each carries the generation it was learnt under: one
        whose key changed since is published but trusted by no sibling (its generation is
        not the key's), and a key put again since was taken out of them by that put."""
        learnt = self._learnt
        assert learnt is not None
        keys = list(itertools.islice(self._unshared, _RESHARE_MAX))
        rows = [(m, k, *self._unshared[(m, k)]) for m, k in keys]
        if learnt.publish_many(rows):
            for key in keys:
                del self._unshared[key]

    def put_many(self, mount_id: int, learnt: list[tuple[str, ObjectInfo, float, int]]) -> None:
        """put() of many (key, version, now, ticket), shared with the other workers in one
        write: a lease renewal's thousand keys confirmed by one listing."""
        wall, mono = self._wall(), self._mono()
        shared = []
        for key, info, now, ticket in learnt:
            self._items[(mount_id, key)] = (info, now, ticket)
            self._items.move_to_end((mount_id, key))
            if self.ticket(mount_id, key) == ticket:
                shared.append((mount_id, key, info, wall - max(0.0, mono - now), ticket))
        while len(self._items) > self._max:
            self._items.popitem(last=False)
        if self._learnt is not None and shared and self._learnt.publish_many(shared):
            for _, key, *_ in shared:
                self._unshared.pop((mount_id, key), None)

    async def published(self, mount_id: int, key: str) -> bool:
        """Wait until the key's version put here is in the node's shared record, publishing
        it again (SHARE_TRIES, pausing between) if a sibling's write kept the file busy: a
        sibling waiting on this worker's open of the key finds it there, rather than open
        the key again. False when it could not be shared (the siblings then ask themselves)."""
        pause = SHARE_PAUSE
        for _ in range(SHARE_TRIES):
            record = self._unshared.get((mount_id, key))
            if record is None or self._learnt is None:
                return record is None
            await asyncio.sleep(pause)
            if self._unshared.get((mount_id, key)) is not record:
                continue  # put again meanwhile: that put published (or kept) its own
            if self._learnt.publish(mount_id, key, *record):
                del self._unshared[(mount_id, key)]
                return True
            pause = min(pause * 2, 0.05)
        self._unshared.pop((mount_id, key), None)
        return False

    def version(self, mount_id: int, key: str, version_id: str) -> ObjectInfo | None:
        """A version of the key named by id, as put_version kept it, unless the key changed
        since (through any worker)."""
        versions = self._versions.get((mount_id, key))
        item = None if versions is None else versions.get(version_id)
        if item is None:
            return None
        if item[1] != self.ticket(mount_id, key):
            del self._versions[(mount_id, key)]
            return None
        self._versions.move_to_end((mount_id, key))
        return item[0]

    def put_version(self, mount_id: int, key: str, info: ObjectInfo, generation: int) -> None:
        """Keep a version of the key named by id (info.version_id), as the store told it when
        the key's change counter was `generation`."""
        assert info.version_id is not None
        self._versions.setdefault((mount_id, key), {})[info.version_id] = (info, generation)
        self._versions.move_to_end((mount_id, key))
        while len(self._versions) > self._max // 16:
            self._versions.popitem(last=False)

    def forget(self, mount_id: int, key: str) -> int:
        """Drop the key here (its versions named by id too), and tell the node's other
        workers it changed: every answer about it asked before now is a hint from here on.
        The key's change counter after this change."""
        self._items.pop((mount_id, key), None)
        self._versions.pop((mount_id, key), None)
        self._unshared.pop((mount_id, key), None)
        if self._learnt is not None:
            self._learnt.forget(mount_id, key)
        gens = self._generations
        return gens.bump(gens.slot(mount_id, key))

    def close(self) -> None:
        if self._learnt is not None:
            self._learnt.close()
            self._learnt = None

    def __len__(self) -> int:
        return len(self._items)
