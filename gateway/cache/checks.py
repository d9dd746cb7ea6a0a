"""When a block's whole data was last checked against its CRC32C (or written) by any process
of this node: what a zero-copy send asks before it sends a block's file unread.

A zero-copy send may skip reading a block it sends only when its whole data was checked
within `zero_copy_recheck` seconds (docs/cache.md, "Zero-copy sends"). Each worker kept that
in a dict of its own, so a block another worker filled or checked was read and checked again
by each worker at its first send: with the default two workers about half of a warm epoch's
first disk hits, with N workers (N-1)/N of them. Here the node's workers share one table, in
an anonymous shared mapping made before they are forked (as the connection counts of
gateway/server/accept.py): a check by one counts for all, as it would within one process.

- A block has two slots (2^20 in all, 8 MiB: the pair chosen by the first 19 bits of its
  name, a SHA-256 in hex), and its check is in one of them: one 64-bit word of 32 more bits of
  the name, the check's second (CLOCK_MONOTONIC, shared by the node's processes, from the
  table's making) and a check byte of both. A block checked takes its own word, else an empty
  one, else the one of the older check: that block is then checked again at its next send, as
  if never checked here (a miss of the table only costs a read). With one slot a block, a warm
  pass over 20,000 blocks read 1.2 % of them again (~n/2^21 of n blocks: 13 % of the 300,000
  blocks a worker could send in a window); with two, a block is lost only to two later blocks
  of its pair (random names, all checked: 0.02-0.03 % of 20,000 lost, 4.1 % of 300,000).
- A word is written in one aligned 8-byte store; the check byte makes a word that a reader
  could see half-written (or any other garbage) say nothing, never a wrong check.
- The second is floored when written, so the age a reader finds is never less than the true
  one: a window is never stretched (it may end up to a second early).
- The table is the only record of checks: a worker keeps none of its own beside it (it did,
  and the two said the same thing twice), so its own blocks lose their check only to two
  later blocks of their pair, as its siblings' do.
- A block found damaged is cleared by the process that found it (`forget`): its siblings'
  next sends read it again (and drop it, or find the new fill's bytes).
- Nothing survives the node: after a restart every block is checked again at its first send.

A process not forked from a node that prepared a table (one worker, `--workers 1`; a test's
store) makes one of its own: the same rules within that process.
"""

from __future__ import annotations

import mmap
import time
from collections.abc import Callable

SLOTS = 1 << 20
_SLOT_BITS = 20
_TAG_BITS = 32
_TAG_MASK = (1 << _TAG_BITS) - 1
_HEAD_DIGITS = (_SLOT_BITS + _TAG_BITS) // 4  # of the name: its slot and tag
_SECONDS = (1 << 24) - 1  # ~194 days of a node's life; older checks count as none

_shared: Checks | None = None


class Checks:
    """The table (see the module's docstring). `clock`: CLOCK_MONOTONIC's seconds, or a
    test's."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._map = mmap.mmap(-1, SLOTS * 8)  # anonymous, MAP_SHARED: shared after a fork
        self._words = memoryview(self._map).cast("Q")
        self._clock = clock
        self._base = clock()

    def checked_now(self, name: str) -> None:
        """The block `name` (its hex name) was checked whole, or written, just now."""
        seconds = int(self._clock() - self._base)
        if seconds > _SECONDS:
            return
        slot, tag = _place(name)
        words = self._words
        first, second = words[slot], words[slot + 1]
        if first >> 32 == tag:
            pass  # its own word
        elif second >> 32 == tag:
            slot += 1
        else:  # an empty (or torn) word, else the older check of the two
            older = _second(first)
            newer = _second(second)
            if older is not None and (newer is None or newer < older):
                slot += 1
        words[slot] = _word(tag, seconds)

    def age(self, name: str) -> float | None:
        """Seconds since the block's last check by a process of the node, at least (the
        check's second floored), or None: not known to be checked."""
        # Every zero-copy send asks: _place() and _second() written out (a third of the time).
        head = int(name[:_HEAD_DIGITS], 16)
        slot, tag = (head >> _TAG_BITS) & ~1, head & _TAG_MASK
        words = self._words
        newest = -1
        word = words[slot]
        if word >> 32 == tag and word:
            second = (word >> 8) & _SECONDS
            if word == _word(tag, second):
                newest = second
        word = words[slot + 1]
        if word >> 32 == tag and word:
            second = (word >> 8) & _SECONDS
            if second > newest and word == _word(tag, second):
                newest = second
        return None if newest < 0 else self._clock() - self._base - newest

    def forget(self, name: str) -> None:
        """The block is no longer taken as checked (found damaged, or gone)."""
        slot, tag = _place(name)
        for way in (slot, slot + 1):
            if self._words[way] >> 32 == tag:
                self._words[way] = 0


def _place(name: str) -> tuple[int, int]:
    """The block's first slot (even: the second is the next) and its tag."""
    head = int(name[:_HEAD_DIGITS], 16)
    return (head >> _TAG_BITS) & ~1, head & _TAG_MASK


def _second(word: int) -> int | None:
    """The second of a whole word's check, or None (empty, torn or stray: its check byte)."""
    second = (word >> 8) & _SECONDS
    return second if word and word == _word(word >> 32, second) else None


def _word(tag: int, seconds: int) -> int:
    mix = tag ^ (tag >> 8) ^ (tag >> 16) ^ (tag >> 24) ^ seconds ^ (seconds >> 8)
    mix ^= seconds >> 16
    # 0 is no word: a tag and second whose word would be 0 cannot occur (the check byte of
    # an all-zero tag and second is 0x5a).
    return (tag << 32) | (seconds << 8) | ((mix ^ 0x5A) & 0xFF)


def share() -> None:
    """Make the table the processes forked from this one from now on share (a node's workers:
    the server calls this before it forks them)."""
    global _shared
    _shared = Checks()


def table() -> Checks:
    """The table this process uses: the one its node shares (share()), else its own."""
    return _shared if _shared is not None else Checks()
