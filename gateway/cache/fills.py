"""Fills: blocks on their way from the store into the page store, one fetch per block on the
node however many readers want it.

`Fills` is the cache's manager over the page store (pages.py), which keeps storage only: the
memory tier, the block files, what this process has checked, the journal. A read looks in
memory, joins a fill in flight in this process, or reads the block's file; a miss starts one
fill: the filler claims inflight/<name> (blockfile.claim), streams the bytes from the store to
every reader as they arrive while writing them, and commits the finished file. A reader in
another process follows the in-flight file as it grows.

A fill never fails its readers for the cache's sake: when the disk cannot take the block (full,
failing), or another process's fill of it ends without it, the bytes come from the store and
the block is not kept. Only the store's own failures reach a reader.

Sub-blocks (subblocks.py): a non-sequential reader's small range that misses fills only the
sub-blocks that hold it, each an entry of its own (claim, single flight, commit); a block fill
later takes those on disk and fetches only the rest, then drops them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Protocol

from gateway.cache import blockfile, subblocks
from gateway.cache.layout import PIECE, Checksums
from gateway.cache.pages import BlockKey, Entry, FillFailed, PageStore, key_name
from gateway.cache.subblocks import SubKey

log = logging.getLogger(__name__)

_FROM_BLOCK = "from block"  # a sub-block claim given up: its bytes come from the block
WRITE_BATCH = 1 << 20  # a fill writes to its file in batches of this size
FOLLOW_POLL = 0.005  # seconds between looks at another process's fill that has no new bytes
FOLLOW_STALL = 120.0  # a fill that shows no progress this long is given up on
_SETTLE_TRIES = 3  # a block found committed, then gone, is claimed this often before streaming


class Fetch(Protocol):
    """The block's bytes [skip, stop) from the store (`stop` None: to the block's end)."""

    def __call__(self, skip: int, stop: int | None = None, /) -> AsyncGenerator[bytes, None]: ...


class Arrival(Protocol):
    """A fill's first bytes, as a reader that reads ahead awaits them (Fills.ahead)."""

    async def started(self) -> BaseException | None: ...


class _Fill:
    """A block on its way in: its bytes so far, shared with every reader in this process."""

    __slots__ = (
        "_event", "chunks", "deciding", "done", "error", "length", "name", "received", "subs",
        "task",
    )  # fmt: skip

    def __init__(self, name: str, length: int) -> None:
        self.name = name
        self.length = length
        # A block's fill: whether it may still take sub-blocks being filled in this process
        # (it has not looked yet), and which it takes (their fills it then waits for).
        self.deciding = True
        self.subs: list[bool] | None = None
        self.chunks: list[bytes] = []
        self.received = 0
        self.done = False
        self.error: BaseException | None = None
        self._event = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def append(self, data: bytes) -> None:
        if data:
            self.chunks.append(data)
            self.received += len(data)
            self._wake()

    def finish(self, error: BaseException | None = None) -> None:
        if not self.done:
            if error is None and self.received != self.length:
                error = FillFailed(f"block fill got {self.received} of {self.length} bytes")
            self.done, self.error = True, error
            self._wake()

    def _wake(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def started(self) -> BaseException | None:
        """Wait for the first bytes or the end; the error of a fill that ended without any."""
        while not self.received and not self.done:
            await self._event.wait()
        return self.error if not self.received else None

    async def read(self, start: int, end: int) -> AsyncGenerator[bytes, None]:
        """Bytes [start, end) of the block as they arrive."""
        index = pos = 0
        while pos < end:
            chunks = self.chunks
            while index < len(chunks) and pos < end:
                chunk = chunks[index]
                index += 1
                lo, hi = pos, pos + len(chunk)
                pos = hi
                if hi <= start:
                    continue
                if lo >= start and hi <= end:
                    yield chunk
                else:
                    yield chunk[max(start, lo) - lo : min(end, hi) - lo]
            if pos >= end:
                return
            if self.done:
                if self.error is not None:
                    raise self.error
                return
            await self._event.wait()


class Fills:
    """The fills of one process over its page store `pages`: reads that may miss, read-ahead
    within `fill_concurrency` slots, and sub-blocks of `sub_block_size` (0: none)."""

    def __init__(
        self, pages: PageStore, *, fill_concurrency: int = 16, sub_block_size: int = 0
    ) -> None:
        if sub_block_size and sub_block_size < PIECE:
            raise ValueError(f"a sub-block is at least {PIECE} bytes (0: none)")
        self.pages = pages
        self.stats = pages.stats
        self.sub_size = sub_block_size  # 0: reads of a few random bytes fill whole blocks
        # The entries being filled (or followed) in this process, by name: this class's own
        # table. The page store asks of it only whether a name is in it (its reads that must
        # not wait leave those entries alone); the dict's own bound __contains__, so that the
        # question opens no Python frame (about 30 ns more than the dict lookup it replaced).
        self._fills: dict[str, _Fill] = {}
        pages.set_filling(self._fills.__contains__)
        self._fill_ended: asyncio.Future[None] | None = None  # for waiters on any fill's end
        self._prefetch_slots = max(1, fill_concurrency)
        self._prefetching = 0

    async def close(self) -> None:
        """Cancel the fills in flight and wait (briefly) for them to end."""
        for fill in list(self._fills.values()):
            if fill.task is not None:
                fill.task.cancel()
        pending = {f.task for f in self._fills.values() if f.task is not None}
        if pending:
            await asyncio.wait(pending, timeout=5)

    @property
    def in_flight(self) -> int:
        return len(self._fills)

    async def any_ended(self) -> None:
        """Wait until a fill in flight in this process ends (at once if there is none)."""
        if not self._fills:
            return
        if self._fill_ended is None:
            self._fill_ended = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._fill_ended)

    async def settle(self) -> None:
        """Wait until no fill and no file task (a retirement, a removal) is in flight in this
        process: the blocks read are on disk, the invalidated ones moved."""
        while True:
            tasks = {f.task for f in self._fills.values() if f.task is not None}
            if tasks:
                await asyncio.wait(tasks)
                continue
            await self.pages.settle()  # what the fills left to do (a sub-blocks' removal)
            if not self._fills:
                return

    def filling(self, bkey: BlockKey) -> bool:
        """Whether the block is being fetched (or followed) in this process."""
        return bkey.name in self._fills

    async def fill_ended(self, bkey: BlockKey) -> None:
        """Wait until this process's fill of the block, if one is in flight, has ended (kept
        or not): its readers may have all its bytes before it is committed."""
        fill = self._fills.get(bkey.name)
        if fill is not None and fill.task is not None:
            await asyncio.wait([fill.task])

    async def block_file(self, bkey: BlockKey) -> str | None:
        """The path of the block's committed file, if it is there now (it may go at any time:
        a descriptor opened on it stays readable); a fill of it in flight is waited for."""
        await self.fill_ended(bkey)
        return await self.pages.block_file(bkey)

    def sparse(self, length: int, start: int, end: int) -> bool:
        """Whether a sparse read of bytes [start, end) of a block of `length` bytes that misses
        fills sub-blocks rather than the block (subblocks.applies)."""
        return subblocks.applies(length, start, end, self.sub_size)

    def known_range(self, bkey: BlockKey, length: int, start: int, end: int) -> bool:
        """pages.known() of the block, or of every sub-block holding bytes [start, end) of it
        (and none of them still filling)."""
        if self.pages.known(bkey):
            return True
        if not self.sparse(length, start, end):
            return False
        for index in subblocks.covering(start, end, self.sub_size):
            sub = _sub_key(bkey.mount_id, bkey.digest, index)
            if sub.name in self._fills or not self.pages.known(sub):
                return False
        return True

    # -- reads ----------------------------------------------------------------------------------

    async def read(
        self,
        bkey: BlockKey,
        length: int,
        start: int,
        end: int,
        fetch: Fetch,
        *,
        pinned: bool = False,
        retired_ok: bool = False,
        cold: bool = False,
        sparse: bool = False,
        preload: bool = False,
    ) -> AsyncGenerator[bytes, None]:
        """Bytes [start, end) of the block (`length` bytes in all), from the cache or, on a
        miss, from `fetch` (the block from the store), caching it on the way.

        `sparse`: the reader is not sequential, so a miss of a range covering at most half the
        block fills only the sub-blocks that hold it (subblocks.applies), unless the block is
        being filled already, here or in another process.

        `retired_ok`: the caller has begun sending this version, so a retired block of it (the
        version was invalidated since) is good, and better than the store's new version.
        `cold`: the block is very likely not on disk (its version was just learnt from the
        store): no read of the disk first; the fill's claim finds a block that is there, and
        reads it (one thread hop a miss fewer).
        `preload`: a preload job reads (gateway/jobs): its hits and fills are counted apart
        from the clients' hits and misses."""
        pages = self.pages
        data = pages.peek(bkey, pinned, preload)
        if data is not None:
            yield data if (start, end) == (0, length) else data[start:end]
            return
        if retired_ok and pages.retired(bkey.version):
            data = await pages.read_retired(bkey, length, start, end, preload)
            if data is not None:
                yield data
                return
        fill = self._fills.get(bkey.name)
        if fill is None:
            if sparse and not cold and self.sparse(length, start, end):
                # The block's file and the sub-blocks' files looked for in one hop.
                async with aclosing(
                    self._read_subs(bkey, length, start, end, fetch, pinned)
                ) as subs:
                    async for chunk in subs:
                        yield chunk
                return
            if not cold:
                data = await pages.read_disk(bkey, length, start, end, pinned, preload)
                if data is not None:
                    yield data
                    return
                fill = self._fills.get(bkey.name)
            if fill is None:
                fill = self._start_fill(bkey, length, fetch, pinned)
            else:
                self.stats.joins += 1
        else:
            self.stats.joins += 1
        self.stats.miss(bkey.mount_id, preload)
        sent = False
        try:
            async for chunk in fill.read(start, end):
                sent = True
                yield chunk
        except Exception:
            # The store no longer has the version (another process invalidated it): its
            # retired block, if still there.
            if sent or not retired_ok:
                raise
            data = await pages.read_retired(bkey, length, start, end)
            if data is None:
                raise
            yield data

    async def read_hit(
        self, bkey: BlockKey, length: int, start: int, end: int, *, pinned: bool = False,
        preload: bool = False,
    ) -> bytes | None:  # fmt: skip
        """Bytes [start, end) if the block is cached (memory or disk), else None: no fetch."""
        data = self.pages.peek(bkey, pinned, preload)
        if data is not None:
            return data if (start, end) == (0, length) else data[start:end]
        if bkey.name in self._fills:
            return None
        return await self.pages.read_disk(bkey, length, start, end, pinned, preload)

    def prefetch(self, bkey: BlockKey, length: int, fetch: Fetch, *, pinned: bool = False) -> bool:
        """Start filling a block a reader will want soon, if a prefetch slot is free and it is
        neither in memory nor in flight. Returns whether a fill was started."""
        name = bkey.name
        if (
            name in self._fills
            or name in self.pages.memory
            or self._prefetching >= self._prefetch_slots
        ):
            return False
        if self.pages.retired(bkey.version):
            return False  # gone from the store: its readers take it from retired/
        self._prefetching += 1
        self.stats.prefetches += 1
        fill = self._start_fill(bkey, length, fetch, pinned, prefetch=True)
        assert fill.task is not None
        fill.task.add_done_callback(self._prefetch_done)
        return True

    def _prefetch_done(self, _: asyncio.Task[None]) -> None:
        self._prefetching -= 1

    def ahead(
        self, bkey: BlockKey, length: int, fetch: Fetch, *, pinned: bool = False
    ) -> Arrival | None:
        """Start filling a block a reader will want soon (prefetch), and return the fill in
        flight for it in this process, started now or before: its reader awaits its first
        bytes, or the error of a fill that ended without any (the store's answer: gone,
        changed...), even once it has ended and left. None when no fill is in flight (the
        block is in memory, retired, or no prefetch slot is free)."""
        self.prefetch(bkey, length, fetch, pinned=pinned)
        return self._fills.get(bkey.name)

    # -- fills ----------------------------------------------------------------------------------

    def _start_fill(
        self, bkey: BlockKey, length: int, fetch: Fetch, pinned: bool, prefetch: bool = False
    ) -> _Fill:
        fill = _Fill(bkey.name, length)
        self._fills[bkey.name] = fill
        fill.task = asyncio.create_task(self._fill(fill, bkey, fetch, pinned, prefetch))
        return fill

    def _ended(self) -> None:
        ended, self._fill_ended = self._fill_ended, None
        if ended is not None and not ended.done():
            ended.set_result(None)

    async def _fill(
        self, fill: _Fill, bkey: BlockKey, fetch: Fetch, pinned: bool, prefetch: bool
    ) -> None:
        try:
            try:
                await self._bring(fill, bkey, fetch, pinned)
            except Exception:
                # The store failed before the first byte: if the block was committed meanwhile
                # (a write-through, another process), it is as good.
                if fill.received or not await self._from_disk(fill, bkey, pinned):
                    raise
        except BaseException as exc:
            self.stats.fill_failures += 1
            fill.finish(exc)
            if not isinstance(exc, Exception):
                raise
            if prefetch:
                log.info("cache: prefetch of block %s failed: %s", bkey.name, exc)
        finally:
            if self._fills.get(bkey.name) is fill:
                del self._fills[bkey.name]
            self._ended()

    async def _bring(self, fill: _Fill, bkey: BlockKey, fetch: Fetch, pinned: bool) -> None:
        """The block's bytes into `fill`: from its file if it is committed, following another
        process's fill, or fetched and kept; fetched and not kept when the disk fails."""
        pages = self.pages
        for _ in range(_SETTLE_TRIES):
            try:
                # Claimed on the loop where that waits for nothing (a spare at hand): a thread
                # hop here held a cold miss's bytes back by ~5 ms, the wake-up of the loop
                # behind the other threads' commits (docs/performance.md); else on a thread.
                how, fd = blockfile.claim(
                    pages.root, bkey.mount_id, bkey.name, pages.spares, at_once=True
                )
                if how == blockfile.LATER:
                    self.stats.thread_claims += 1
                    how, fd = await pages.hop(
                        blockfile.claim, pages.root, bkey.mount_id, bkey.name, pages.spares
                    )
            except OSError as exc:
                pages.disk_trouble(f"could not claim block {bkey.name}", exc)
                break
            if how == blockfile.PRESENT:
                # Committed by another process: read for whoever joined this fill (a prefetch
                # too: a reader may have joined it). Gone again (dropped as damaged, evicted,
                # invalidated): claim it anew.
                if await self._from_disk(fill, bkey, pinned):
                    if isinstance(bkey, BlockKey):
                        pages.keep_record(bkey)  # one a killed process did not write
                    return
                continue
            assert fd is not None
            if how == blockfile.FOLLOW:
                fill.deciding = False
                await self._follow(fill, fd, fetch)
                return
            present = await self._subs_present(bkey, fill.length, fd)
            fill.subs, fill.deciding = present, False
            if present is None:
                await self._lead(fill, bkey, fd, fetch, pinned)
                return
            assembled = self._assembled(bkey, fill.length, fetch, present, pinned)
            if await self._lead(fill, bkey, fd, assembled, pinned):
                subs = self._subs(bkey, range(len(present)))
                pages.spawn(pages.remove_entries([s for s in subs if present[s.index]]))
            return
        fill.deciding = False
        self.stats.unkept += 1
        await self._stream(fill, fetch)

    async def _from_disk(self, fill: _Fill, bkey: Entry, pinned: bool) -> bool:
        fill.deciding = False
        data = await self.pages.read_disk(bkey, fill.length, 0, fill.length, pinned)
        if data is None:
            return False
        fill.append(data)
        fill.finish()
        return True

    async def _lead(self, fill: _Fill, bkey: Entry, fd: int, fetch: Fetch, pinned: bool) -> bool:
        """Fetch the entry from `fetch(0)` into `fill` and its claimed file `fd`, and commit it;
        whether it was kept."""
        pages = self.pages
        owned: int | None = fd  # ours to write, until committed or given up
        kept = False
        try:
            sums = Checksums()
            batch: list[bytes] = []
            batched = 0
            # A block of several batches has its first bytes in its file at once: a reader in
            # another process follows the file, and waits for a block's first bytes (its
            # version confirmed by the store) before it answers; a slow store would otherwise
            # keep it waiting for a whole batch.
            flush_at = 1 if fill.length > WRITE_BATCH else WRITE_BATCH
            async with aclosing(fetch(0)) as source:
                async for chunk in source:
                    if fill.received + len(chunk) > fill.length:
                        raise FillFailed(f"the store sent more than {fill.length} bytes")
                    fill.append(chunk)
                    if owned is None:
                        continue
                    sums.update(chunk)
                    batch.append(chunk)
                    batched += len(chunk)
                    if batched >= flush_at:
                        flush_at = WRITE_BATCH
                        data, batch, batched = b"".join(batch), [], 0
                        try:
                            await pages.hop(blockfile.write_all, owned, data)
                        except OSError as exc:
                            # The readers go on from the store; the block is not kept.
                            pages.disk_trouble(f"could not write block {bkey.name}", exc)
                            await pages.give_up(bkey, owned)
                            owned = None
            if fill.received != fill.length:
                raise FillFailed(f"the store sent {fill.received} of {fill.length} bytes")
            rest = b"".join(batch)  # a block for the memory tier is all in it (< WRITE_BATCH)
            if isinstance(bkey, BlockKey) and pages.memory.accepts(fill.length):
                # At once: the next read of a small block is a hit, not a join of this fill
                # while its file is written.
                whole = rest if len(rest) == fill.length else b"".join(fill.chunks)
                pages.memory.put(bkey.name, whole)
            if owned is not None:
                committing, owned = owned, None  # commit closes it whatever happens
                record = (
                    key_name(bkey.mount_id, bkey.key)
                    if isinstance(bkey, BlockKey) and bkey.index == 0
                    else None
                )
                kept = await pages.commit(bkey, committing, rest, sums, fill.length, pinned, record)
        finally:
            if owned is not None:
                await pages.give_up(bkey, owned)
        fill.finish()
        if not kept:
            self.stats.unkept += 1
            return False
        self.stats.fills += 1
        return True

    async def _stream(self, fill: _Fill, fetch: Fetch) -> None:
        """The rest of the block from the store, into `fill` only: nothing is kept."""
        async with aclosing(fetch(fill.received)) as source:
            async for chunk in source:
                if fill.received + len(chunk) > fill.length:
                    raise FillFailed(f"the store sent more than {fill.length} bytes")
                fill.append(chunk)
        if fill.received != fill.length:
            raise FillFailed(f"the store sent {fill.received} of {fill.length} bytes")
        fill.finish()

    async def _follow(self, fill: _Fill, fd: int, fetch: Fetch) -> None:
        """Tail another process's fill of this block until it has all the bytes; if that fill
        ends without them (its filler died, its disk failed), fetch the rest itself."""
        loop = asyncio.get_running_loop()
        hop = self.pages.hop
        try:
            idle_since = loop.time()
            while fill.received < fill.length:
                want = min(fill.length - fill.received, WRITE_BATCH)
                data, alive = await hop(blockfile.follow, fd, fill.received, want)
                if data:
                    fill.append(data)
                    idle_since = loop.time()
                    continue
                if not alive:
                    # Its filler died or gave up: one last look, the lock goes after the write.
                    data, _ = await hop(blockfile.follow, fd, fill.received, want)
                    if not data:
                        break
                    fill.append(data)
                    continue
                if loop.time() - idle_since > FOLLOW_STALL:
                    break
                await asyncio.sleep(FOLLOW_POLL)
        finally:
            await asyncio.shield(hop(blockfile.close, fd))
        if fill.received < fill.length:
            log.info("cache: the fill of block %s in another process ended short", fill.name)
            await self._stream(fill, fetch)
        else:
            fill.finish()

    # -- sub-blocks -----------------------------------------------------------------------------

    def _subs(self, bkey: BlockKey, indices: range | list[int]) -> list[SubKey]:
        return [_sub_key(bkey.mount_id, bkey.digest, i) for i in indices]

    async def _read_subs(
        self, bkey: BlockKey, length: int, start: int, end: int, fetch: Fetch, pinned: bool
    ) -> AsyncGenerator[bytes, None]:
        """Bytes [start, end) of the block: from its file if it is there, else from the
        sub-blocks that hold them (both looked for in one hop): those on disk read, those in
        flight here joined, the others filled (one store request per run of them, one fill for
        concurrent readers)."""
        size = self.sub_size
        subs = self._subs(bkey, subblocks.covering(start, end, size))
        cut = []  # (sub-block, [a, b) of it that the range wants)
        for sub in subs:
            lo, hi = subblocks.bounds(length, size, sub.index)
            cut.append((sub, hi - lo, max(start, lo) - lo, min(end, hi) - lo))
        todo = [c for c in cut if c[0].name not in self._fills]
        reads: list[tuple[Entry, int, int, int]] = [(bkey, length, start, end - start)]
        reads += [(s, n, a, b - a) for s, n, a, b in todo]
        found = await self.pages.read_entries(reads, pinned)
        got_block = found.pop(0)
        if got_block is not None:
            yield got_block
            return
        data: dict[int, bytes] = {}
        for (sub, _, _, _), got in zip(todo, found, strict=True):
            if got is not None:
                data[sub.index] = got
        fills: dict[int, _Fill] = {}
        new = []
        for sub in subs:
            if sub.index in data:
                continue
            fill = self._fills.get(sub.name)
            if fill is None:
                new.append(sub)
            else:
                fills[sub.index] = fill
                self.stats.joins += 1
        if new:
            fills.update(self._start_subs(bkey, length, new, fetch, pinned))
        if fills:
            self.stats.miss(bkey.mount_id, False)
        # Every fill these bytes need has begun to arrive before the first of them goes out
        # (a fill asks for all its runs at once first): a version gone from the store fails
        # the read before it has sent anything, not after its first sub-block.
        for fill in fills.values():
            error = await fill.started()
            if error is not None:
                raise error
        for sub, _, a, b in cut:
            held = data.get(sub.index)
            if held is not None:
                yield held
                continue
            async for chunk in fills[sub.index].read(a, b):
                yield chunk

    def _start_subs(
        self,
        bkey: BlockKey,
        length: int,
        subs: list[SubKey],
        fetch: Fetch,
        pinned: bool,
        in_block: bool = False,
    ) -> dict[int, _Fill]:
        """One task filling these sub-blocks (in order); `in_block`: for the block's own fill,
        which must not wait for itself."""
        fills = {}
        for sub in subs:
            lo, hi = subblocks.bounds(length, self.sub_size, sub.index)
            fill = fills[sub.index] = self._fills[sub.name] = _Fill(sub.name, hi - lo)
        task = asyncio.create_task(
            self._fill_subs(bkey, length, subs, fills, fetch, pinned, in_block)
        )
        for fill in fills.values():
            fill.task = task
        return fills

    async def _fill_subs(
        self,
        bkey: BlockKey,
        length: int,
        subs: list[SubKey],
        fills: dict[int, _Fill],
        fetch: Fetch,
        pinned: bool,
        in_block: bool,
    ) -> None:
        """Claim the sub-blocks on the node; follow those another process fills, read those
        committed meanwhile, fetch the rest with one store request per run and commit each. If
        the block itself is being filled (or is there), give the claims up and read it."""
        pages = self.pages
        names = [sub.name for sub in subs]
        claims: list[tuple[str, int | None]] = []
        size = self.sub_size
        from_block: asyncio.Task[None] | None = None

        def part(index: int) -> Fetch:
            lo, hi = subblocks.bounds(length, size, index)

            def rest(skip: int, stop: int | None = None) -> AsyncGenerator[bytes, None]:
                return fetch(lo + skip, hi if stop is None else lo + stop)

            return rest

        try:
            try:
                claims, busy = await pages.hop(
                    blockfile.claim_all, pages.root, bkey.mount_id, names,
                    None if in_block else bkey.name, pages.spares, bkey.name,
                )  # fmt: skip
            except OSError as exc:
                pages.disk_trouble(f"could not claim sub-blocks of {bkey.name}", exc)
                for sub in subs:
                    self.stats.unkept += 1
                    await self._stream(fills[sub.index], part(sub.index))
                return
            if busy:
                # The block is being filled (or is there). A fill of it in this process that
                # takes (or may still take) one of these sub-blocks waits for its fill here:
                # those are led here as claimed. The others are given up and read from the
                # block, their fills out of reach of a block fill that starts later (which
                # would wait for them while they wait for it).
                block = self._fills.get(bkey.name)
                off = []
                for i, sub in enumerate(subs):
                    if block is None or not (
                        block.deciding or (block.subs is not None and block.subs[sub.index])
                    ):
                        off.append(i)
                if off:
                    await pages.hop(
                        blockfile.release_all, pages.root, [names[i] for i in off],
                        [claims[i] for i in off],
                    )  # fmt: skip
                    for i in off:
                        claims[i] = (_FROM_BLOCK, None)
                        if self._fills.get(names[i]) is fills[subs[i].index]:
                            del self._fills[names[i]]
                    # Apart from the claimed ones' fills, which a block fill may wait for.
                    from_block = asyncio.create_task(
                        self._from_block(bkey, length, [subs[i] for i in off], fills, fetch, pinned)
                    )
            runs = _claimed_runs(subs, claims)
            if runs:
                # One store request a run, all asked for (and their first bytes in) before
                # the first run's bytes go out: a version the store no longer has fails
                # these fills before any reader has sent a byte of them.
                early = _Opened(fetch)
                await early.open(
                    [
                        (
                            subblocks.bounds(length, size, subs[i].index)[0],
                            subblocks.bounds(length, size, subs[j - 1].index)[1],
                        )
                        for i, j in runs
                    ]
                )
                fetch = early
            i = 0
            while i < len(subs):
                sub, (how, fd) = subs[i], claims[i]
                fill = fills[sub.index]
                if how == blockfile.CLAIMED:
                    j = i + 1
                    while (
                        j < len(subs)
                        and claims[j][0] == blockfile.CLAIMED
                        and subs[j].index == subs[j - 1].index + 1
                    ):
                        j += 1
                    await self._lead_run(subs[i:j], claims, i, fills, fetch, length, pinned)
                    i = j
                    continue
                claims[i] = (how, None)  # handed on
                if how == _FROM_BLOCK:
                    pass  # by the task reading the block
                elif how == blockfile.FOLLOW:
                    assert fd is not None
                    await self._follow(fill, fd, part(sub.index))
                elif not await self._from_disk(fill, sub, pinned):
                    self.stats.unkept += 1  # committed, then gone at once: from the store
                    await self._stream(fill, part(sub.index))
                i += 1
            if from_block is not None:
                await from_block
        except BaseException as exc:
            if from_block is not None and not from_block.done():
                from_block.cancel()
            for fill in fills.values():
                if not fill.done:
                    self.stats.fill_failures += 1
                    fill.finish(exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            if isinstance(fetch, _Opened):
                await fetch.aclose()
            if any(fd is not None for _, fd in claims):
                await asyncio.shield(pages.hop(blockfile.release_all, pages.root, names, claims))
            for sub in subs:
                if self._fills.get(sub.name) is fills[sub.index]:
                    del self._fills[sub.name]
            self._ended()

    async def _from_block(
        self,
        bkey: BlockKey,
        length: int,
        subs: list[SubKey],
        fills: dict[int, _Fill],
        fetch: Fetch,
        pinned: bool,
    ) -> None:
        """Sub-blocks whose claims were given up for the block being filled: their bytes from
        it (joined, followed or read)."""
        try:
            for sub in subs:
                lo, hi = subblocks.bounds(length, self.sub_size, sub.index)
                fill = fills[sub.index]
                got = self.read(bkey, length, lo, hi, fetch, pinned=pinned)
                async with aclosing(got):
                    async for chunk in got:
                        fill.append(chunk)
                fill.finish()
        except BaseException as exc:
            for sub in subs:
                if not fills[sub.index].done:
                    fills[sub.index].finish(exc)
            raise

    async def _lead_run(
        self,
        run: list[SubKey],
        claims: list[tuple[str, int | None]],
        at: int,
        fills: dict[int, _Fill],
        fetch: Fetch,
        length: int,
        pinned: bool,
    ) -> None:
        """Consecutive sub-blocks claimed by this process (claims[at:at + len(run)]): one store
        request for all of them, cut at their bounds, each committed as its bytes end while
        the next one's arrive."""
        lo = subblocks.bounds(length, self.sub_size, run[0].index)[0]
        hi = subblocks.bounds(length, self.sub_size, run[-1].index)[1]
        source = fetch(lo, hi)
        split = _Split(source)

        async def lead(sub: SubKey, fd: int, part: Fetch) -> None:
            try:
                await self._lead(fills[sub.index], sub, fd, part, pinned)
            except BaseException:
                split.break_()
                raise

        leads = []
        for k, sub in enumerate(run):
            fd = claims[at + k][1]
            claims[at + k] = (blockfile.CLAIMED, None)  # the lead owns it now
            assert fd is not None
            leads.append(lead(sub, fd, split.fetch(fills[sub.index].length)))
        try:
            done = await asyncio.gather(*leads, return_exceptions=True)
        finally:
            await source.aclose()
        for result in done:
            if isinstance(result, BaseException):
                raise result

    async def _subs_present(self, bkey: BlockKey, length: int, fd: int) -> list[bool] | None:
        """Which sub-blocks of the block (claimed by this process: `fd`) are committed or being
        filled, here or in another process; None when none is (the common case)."""
        if not subblocks.applies(length, 0, 1, self.sub_size):
            return None
        pages = self.pages
        subs = self._subs(bkey, range(subblocks.count(length, self.sub_size)))
        try:
            present = await pages.hop(
                blockfile.present_all, pages.root, bkey.mount_id, [s.name for s in subs]
            )
        except OSError:
            return None  # the disk's trouble shows at the block's own write
        except BaseException:
            await pages.give_up(bkey, fd)
            raise
        present = [p or s.name in self._fills for p, s in zip(present, subs, strict=True)]
        return present if any(present) else None

    def _assembled(
        self, bkey: BlockKey, length: int, fetch: Fetch, present: list[bool], pinned: bool
    ) -> Fetch:
        """The block's bytes from its sub-blocks where they are (on disk, or joined, or followed
        while they are filled) and from the store for the runs between them.

        The store's first run is asked for, and its first bytes are in, before any byte of a
        sub-block goes out: the store's answer (the version gone or changed since the
        sub-blocks were kept) fails the fill before its first byte, as a fetch of the whole
        block would, so that a reader waiting for the fill's first bytes (Arrival), or a peer
        served this block, learns it before it has sent anything."""
        size = self.sub_size
        n = len(present)

        def run(i: int) -> tuple[int, int, int]:
            """The run of sub-blocks not held that begins at `i`: its bytes, and its end."""
            j = i
            while j < n and not present[j]:
                j += 1
            return subblocks.bounds(length, size, i)[0], subblocks.bounds(length, size, j - 1)[1], j

        async def whole() -> AsyncGenerator[bytes, None]:
            # Everything the block is made of is in hand, or asked for with its first bytes
            # in, before its first byte goes out: the sub-blocks held (read whole; one gone
            # meanwhile is fetched with the block's version), and every run between them.
            held: dict[int, bytes] = {}
            gaps = []
            i = 0
            while i < n:
                if not present[i]:
                    lo, stop, i = run(i)
                    gaps.append((lo, stop))
                    continue
                lo, hi = subblocks.bounds(length, size, i)
                sub = _sub_key(bkey.mount_id, bkey.digest, i)
                async with aclosing(
                    self._sub_bytes(bkey, length, sub, hi - lo, fetch, pinned)
                ) as got:
                    held[i] = b"".join([chunk async for chunk in got])
                i += 1
            early = _Opened(fetch)
            await early.open(gaps)
            try:
                i = 0
                while i < n:
                    if present[i]:
                        yield held.pop(i)
                        i += 1
                        continue
                    lo, stop, j = run(i)
                    async with aclosing(early(lo, stop)) as chunks:
                        async for chunk in chunks:
                            yield chunk
                    i = j
            finally:
                await early.aclose()

        def assembled(skip: int, stop: int | None = None) -> AsyncGenerator[bytes, None]:
            if skip == 0 and stop in (None, length):
                return whole()
            return fetch(skip, stop)

        return assembled

    async def _sub_bytes(
        self, bkey: BlockKey, length: int, sub: SubKey, n: int, fetch: Fetch, pinned: bool
    ) -> AsyncGenerator[bytes, None]:
        """All of a sub-block, for its block's fill: joined, read, or claimed and filled."""
        fill = self._fills.get(sub.name)
        if fill is None:
            data = await self.pages.read_disk(sub, n, 0, n, pinned)
            if data is not None:
                yield data
                return
            fill = self._fills.get(sub.name)
            if fill is None:
                fill = self._start_subs(bkey, length, [sub], fetch, pinned, in_block=True)[
                    sub.index
                ]
        async for chunk in fill.read(0, n):
            yield chunk


def _claimed_runs(
    subs: list[SubKey], claims: list[tuple[str, int | None]]
) -> list[tuple[int, int]]:
    """The runs [i, j) of consecutive sub-blocks claimed by this process."""
    runs = []
    i = 0
    while i < len(subs):
        if claims[i][0] != blockfile.CLAIMED:
            i += 1
            continue
        j = i + 1
        while (
            j < len(subs)
            and claims[j][0] == blockfile.CLAIMED
            and subs[j].index == subs[j - 1].index + 1
        ):
            j += 1
        runs.append((i, j))
        i = j
    return runs


class _Opened:
    """A fill's store requests for several runs of a block, all asked for and their first
    bytes awaited together before the fill hands on any byte (open); then each taken in turn
    by the fetch of its exact run (a Fetch), the first bytes first. Any other fetch goes to the
    store as it comes."""

    __slots__ = ("_fetch", "_open")

    def __init__(self, fetch: Fetch) -> None:
        self._fetch = fetch
        self._open: dict[tuple[int, int], tuple[AsyncGenerator[bytes, None], bytes]] = {}

    async def open(self, runs: list[tuple[int, int]]) -> None:
        async def one(lo: int, hi: int) -> None:
            stream = self._fetch(lo, hi)
            try:
                first = await anext(stream)
            except StopAsyncIteration:
                first = b""  # short: the fill says so
            except BaseException:
                await stream.aclose()
                raise
            self._open[(lo, hi)] = (stream, first)

        done = await asyncio.gather(*(one(lo, hi) for lo, hi in runs), return_exceptions=True)
        for result in done:
            if isinstance(result, BaseException):
                await self.aclose()
                raise result

    def __call__(self, skip: int, stop: int | None = None, /) -> AsyncGenerator[bytes, None]:
        opened = None if stop is None else self._open.pop((skip, stop), None)
        if opened is None:
            return self._fetch(skip, stop)
        return _resumed(*opened)

    async def aclose(self) -> None:
        left, self._open = self._open, {}
        for stream, _ in left.values():
            await stream.aclose()


async def _resumed(
    stream: AsyncGenerator[bytes, None], first: bytes
) -> AsyncGenerator[bytes, None]:
    async with aclosing(stream) as chunks:
        if first:
            yield first
        async for chunk in chunks:
            yield chunk


@functools.lru_cache(maxsize=1 << 16)
def _sub_key(mount_id: int, block: bytes, index: int) -> SubKey:
    """A sub-block's key, hashed once while it is hot (as reads.block_key does for blocks)."""
    return SubKey(mount_id, block, index)


class _Split:
    """One stream of bytes handed out in consecutive parts of given lengths, each part read by
    its own consumer when the one before it has had its bytes (so that one part is committed
    while the next one arrives). A part left unread, or read short, breaks the split: the
    parts after it end at once, short (their fills fail), never misaligned."""

    __slots__ = ("_broken", "_moved", "_parts", "_rest", "_source", "_turn")

    def __init__(self, source: AsyncGenerator[bytes, None]) -> None:
        self._source = source
        self._rest = b""
        self._parts = 0
        self._turn = 0
        self._broken = False
        self._moved = asyncio.Event()

    def fetch(self, n: int) -> Fetch:
        """The next part, of `n` bytes."""
        k = self._parts
        self._parts += 1

        def take(skip: int, stop: int | None = None) -> AsyncGenerator[bytes, None]:
            return self._take(k, n)

        return take

    def break_(self) -> None:
        self._broken = True
        self._wake()

    def _wake(self) -> None:
        moved, self._moved = self._moved, asyncio.Event()
        moved.set()

    async def _take(self, k: int, n: int) -> AsyncGenerator[bytes, None]:
        while self._turn != k and not self._broken:
            await self._moved.wait()
        try:
            while n > 0 and not self._broken:
                if not self._rest:
                    try:
                        self._rest = await self._source.__anext__()
                    except StopAsyncIteration:
                        break  # short: the fill says so
                    continue
                chunk, self._rest = self._rest[:n], self._rest[n:]
                n -= len(chunk)
                yield chunk
        finally:
            if n > 0:
                self._broken = True
            self._turn = k + 1
            self._wake()
