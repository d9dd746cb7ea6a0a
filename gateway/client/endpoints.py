"""Which node a client process sends its requests to: the endpoints it was given, in their
order, then the nodes it learnt from the fleet's placement. The one in use is kept while it
answers; when it stops answering, the next that answers its health check takes its place,
and a node that failed is passed over for `down_for` seconds (docs/client.md, "Several
endpoints").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

DOWN_FOR = 30.0  # seconds a node that did not answer is passed over


class Endpoints:
    """The endpoint in use, and the nodes that did not answer lately. Thread-safe.

    `healthy(url)` asks a node whether it serves (its /healthz); `learnt()` gives the S3 URLs
    of the fleet's nodes as the client last learnt them (no request); `moved(old, new)` is
    told of each move from the endpoint in use to another."""

    def __init__(
        self,
        listed: list[str],
        healthy: Callable[[str], bool],
        learnt: Callable[[], list[str]] = list,
        moved: Callable[[str, str], None] = lambda old, new: None,
        clock: Callable[[], float] = time.monotonic,
        down_for: float = DOWN_FOR,
    ) -> None:
        if not listed:
            raise ValueError("no endpoint")
        self.listed = listed
        self._healthy = healthy
        self._learnt = learnt
        self._moved = moved
        self._clock = clock
        self._down_for = down_for
        self._down: dict[str, float] = {}  # url -> when it may be tried again
        self._current: str | None = None
        self._lock = threading.Lock()

    def current(self) -> str:
        """The endpoint in use; on first use, the first that answers (else the first listed:
        the error then comes with the first request)."""
        with self._lock:
            if self._current is None:
                single = len(self.listed) == 1
                self._current = (None if single else self._choose()) or self.listed[0]
            return self._current

    def is_down(self, url: str) -> bool:
        """Whether `url` did not answer within the last `down_for` seconds."""
        until = self._down.get(url)
        return until is not None and self._clock() < until

    def failed(self, url: str) -> str | None:
        """`url` did not answer (refused, reset, timed out): it is passed over for a while.
        The endpoint to use now: the one in use if that is another (a caller has moved on
        already), else the next that answers; None when none does."""
        with self._lock:
            self._down[url] = self._clock() + self._down_for
            if self._current not in (url, None):
                return self._current
            chosen = self._choose()
            if chosen is not None:
                self._current = chosen
                self._moved(url, chosen)
            return chosen

    def _choose(self) -> str | None:
        """The first node, listed ones first, that has not failed lately and answers."""
        candidates = list(self.listed)
        candidates += [u for u in self._learnt() if u not in candidates]
        now = self._clock()
        for url in candidates:
            if now >= self._down.get(url, -float("inf")) and self._healthy(url):
                return url
        return None
