"""A limit on failed console sign-ins: after MAX_FAILURES wrong keys or secrets for one access
key, or from one client address, within WINDOW seconds, that key and that address may not try
again (429) until the oldest of those failures is WINDOW old; while limited, even the right
secret is refused (it is not looked at).

Kept in the process's memory: each node (each worker process) counts on its own, so a fleet
of N nodes lets N times as many tries through, and a restart forgets. The client address is
the TCP peer's as the node sees it: behind a proxy, the proxy's, shared by everyone behind it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

MAX_FAILURES = 5  # failed sign-ins of one key, or from one address, ...
WINDOW = 300.0  # ... within this many seconds
MAX_TRACKED = 50_000  # keys and addresses remembered at most (the oldest are forgotten first)
_KEY_CHARS = 128  # an access key is at most this long (access_keys.access_key)


class SignInLimits:
    """Failed sign-ins per access key and per client address; `clock` gives seconds (any
    epoch: tests move it on instead of sleeping)."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        max_failures: int = MAX_FAILURES,
        window: float = WINDOW,
        max_tracked: int = MAX_TRACKED,
    ) -> None:
        self._clock = clock
        self._max = max_failures
        self._window = window
        self._max_tracked = max_tracked
        # ("key", access key) or ("ip", address) -> the times of its last failures, oldest first
        self._failures: dict[tuple[str, str], deque[float]] = {}

    def retry_after(self, access_key: str, client: str | None) -> float:
        """Seconds until a sign-in with this key from this address may be tried; 0: now."""
        now = self._clock()
        wait = 0.0
        for subject in _subjects(access_key, client):
            times = self._failures.get(subject)
            if times is not None and len(times) >= self._max:
                wait = max(wait, times[0] + self._window - now)
        return wait

    def failed(self, access_key: str, client: str | None) -> None:
        """Count a failed sign-in (a wrong key or secret) against the key and the address."""
        now = self._clock()
        for subject in _subjects(access_key, client):
            times = self._failures.pop(subject, None)  # re-inserted: the newest last
            if times is None:
                times = deque(maxlen=self._max)
            times.append(now)
            self._failures[subject] = times
        if len(self._failures) > self._max_tracked:
            self._forget(now)

    def _forget(self, now: float) -> None:
        """Drop what no longer limits anyone; if still too many, the least recently failed."""
        old = now - self._window
        for subject in [s for s, times in self._failures.items() if times[-1] <= old]:
            del self._failures[subject]
        while len(self._failures) > self._max_tracked:
            del self._failures[next(iter(self._failures))]


def _subjects(access_key: str, client: str | None) -> list[tuple[str, str]]:
    subjects = [("ip", client)] if client else []
    if access_key:
        subjects.append(("key", access_key[:_KEY_CHARS]))
    return subjects
