"""A limit on failed console sign-ins, by source and key together: after MAX_FAILURES wrong
secrets for one access key from one client address within WINDOW seconds, that address may
not try that key again (429) until the oldest of those failures is WINDOW old; after
MAX_FROM_SOURCE failures from one address, whatever the keys, that address may not try any.

A key alone is never limited: access keys are not secret (every signed request and presigned
URL shows one), so a limit by key would let anyone lock the admin out. The admin signing in
from another address is not slowed by someone else's failures; one behind the same proxy (the
node sees the proxy's address) is, for at most WINDOW.

The failures are kept in a file of the node's cache dir (`path`) that its worker processes
share under a lock, so a node counts once whichever worker answers; each node of a fleet
counts on its own, and a restart keeps the count.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

MAX_FAILURES = 5  # failed sign-ins of one key from one address, ...
MAX_FROM_SOURCE = 20  # ... or of any keys from one address, ...
WINDOW = 300.0  # ... within this many seconds
MAX_TRACKED = 10_000  # pairs and addresses remembered at most (the oldest forgotten first)
_KEY_CHARS = 128  # an access key is at most this long (access_keys.access_key)

T = TypeVar("T")
Failures = dict[str, list[float]]  # subject -> the times of its last failures, oldest first


class SignInLimits:
    """Failed sign-ins per (address, key) and per address; `clock` gives seconds (any epoch:
    tests move it on instead of sleeping); `path`: the file the node's workers share (None:
    this process's memory alone)."""

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        path: str | None = None,
        max_failures: int = MAX_FAILURES,
        max_from_source: int = MAX_FROM_SOURCE,
        window: float = WINDOW,
        max_tracked: int = MAX_TRACKED,
    ) -> None:
        self._clock = clock
        self._path = path
        self._limits = {"pair": max_failures, "source": max_from_source}
        self._window = window
        self._max_tracked = max_tracked
        self._memory: Failures = {}

    async def retry_after(self, access_key: str, client: str | None) -> float:
        """Seconds until a sign-in with this key from this address may be tried; 0: now."""
        return await self._hop(self._retry_after, access_key, client)

    async def failed(self, access_key: str, client: str | None) -> None:
        """Count a failed sign-in (a wrong key or secret) from this address for this key."""
        await self._hop(self._failed, access_key, client)

    async def succeeded(self, access_key: str, client: str | None) -> None:
        """The right secret: this address's failures for this key no longer count."""
        await self._hop(self._succeeded, access_key, client)

    async def _hop(self, work: Callable[[str, str | None], T], key: str, client: str | None) -> T:
        """The work on the event loop in memory; in a thread over the shared file."""
        if self._path is None:
            return work(key, client)
        return await asyncio.to_thread(work, key, client)

    def _retry_after(self, access_key: str, client: str | None) -> float:
        now = self._clock()
        wait = 0.0
        with self._state(write=False) as failures:
            for subject, kind in _subjects(access_key, client):
                times = [t for t in failures.get(subject, ()) if t > now - self._window]
                if len(times) >= self._limits[kind]:
                    wait = max(wait, times[-self._limits[kind]] + self._window - now)
        return wait

    def _failed(self, access_key: str, client: str | None) -> None:
        now = self._clock()
        with self._state(write=True) as failures:
            for subject, kind in _subjects(access_key, client):
                times = failures.pop(subject, [])  # put back last: the newest last
                failures[subject] = [*times, now][-self._limits[kind] :]
            if len(failures) > self._max_tracked:
                self._forget(failures, now)

    def _succeeded(self, access_key: str, client: str | None) -> None:
        with self._state(write=True) as failures:
            for subject, kind in _subjects(access_key, client):
                if kind == "pair":
                    failures.pop(subject, None)

    def _forget(self, failures: Failures, now: float) -> None:
        """Drop what no longer limits anyone; if still too many, the least recently failed."""
        old = now - self._window
        for subject in [s for s, times in failures.items() if times[-1] <= old]:
            del failures[subject]
        while len(failures) > self._max_tracked:
            del failures[next(iter(failures))]

    @contextlib.contextmanager
    def _state(self, write: bool) -> Iterator[Failures]:
        if self._path is None:
            yield self._memory
            return
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "r+", encoding="utf-8") as f:
            fcntl.flock(fd, fcntl.LOCK_EX if write else fcntl.LOCK_SH)
            try:
                failures: Failures = json.loads(f.read() or "{}")
            except ValueError:
                failures = {}  # a file torn by a crash: the counts start again
            yield failures
            if write:
                f.seek(0)
                f.truncate()
                f.write(json.dumps(failures, separators=(",", ":")))
                f.flush()


def _subjects(access_key: str, client: str | None) -> list[tuple[str, str]]:
    source = client or "-"
    return [
        (f"pair {source} {access_key[:_KEY_CHARS]}", "pair"),
        (f"source {source}", "source"),
    ]
