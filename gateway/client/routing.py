"""Owner routing: the client sends each block read straight to the node that owns the block,
found with the nodes' own placement function (gateway/cluster/placement.py) over the fleet's
placement as any node describes it (`GET /_gateway/placement`, signed). A node that does not
answer costs a retry through the endpoint node and a fresh look at the placement, never an
error; a placement older than `refresh` seconds is asked for again, and only rebuilt when
its version changed.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.cluster.placement import Node, Placement, owner_key


@dataclass(frozen=True)
class _Mount:
    id: int
    block_size: int
    replicas: int
    cache: bool


class Routing:
    """Where to send a read of one block: a node's S3 URL, or None for the endpoint node."""

    def __init__(
        self,
        fetch: Callable[[], bytes],
        refresh: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch  # the placement document, from the endpoint node
        self._refresh = refresh
        self._clock = clock
        self._lock = threading.Lock()
        self._version: str | None = None
        self._placement: Placement | None = None
        self._mounts: dict[str, _Mount] = {}
        self._urls: dict[str, str] = {}
        self._checked = -float("inf")

    def block_size(self, bucket: str) -> int | None:
        self._current()
        mount = self._mounts.get(bucket)
        return mount.block_size if mount is not None and mount.cache else None

    def owner(self, bucket: str, key: str, etag: str, index: int) -> str | None:
        """The S3 URL of the node that owns block `index` of this version (None: ask the
        endpoint node; for block 0 the version does not matter)."""
        placement = self._current()
        mount = self._mounts.get(bucket)
        if placement is None or mount is None or not mount.cache:
            return None
        owners = placement.owners(owner_key(mount.id, key, etag, index), 1)
        return self._urls.get(owners[0].id) if owners else None

    def urls(self) -> list[str]:
        """The S3 URLs of the fleet's nodes as last learnt (no request): where a client whose
        endpoints do not answer may go."""
        with self._lock:
            return list(self._urls.values())

    def stale(self) -> None:
        """A node did not answer: look at the placement again before the next read."""
        with self._lock:
            self._checked = -float("inf")

    def _current(self) -> Placement | None:
        now = self._clock()
        with self._lock:
            if now - self._checked < self._refresh:
                return self._placement
            self._checked = now
        try:
            doc: dict[str, Any] = json.loads(self._fetch())
        except Exception:  # no placement: every read goes to the endpoint node
            return self._placement
        with self._lock:
            if doc.get("version") != self._version:
                nodes = [
                    Node(n["id"], n.get("s3") or "", float(n["weight"]), n.get("zone", ""))
                    for n in doc["nodes"]
                ]
                self._placement = Placement(nodes, doc["partitions"], doc["max_replicas"])
                self._urls = {n["id"]: n["s3"] for n in doc["nodes"] if n.get("s3")}
                self._mounts = {
                    bucket: _Mount(m["id"], m["block_size"], m["replicas"], m["cache"])
                    for bucket, m in doc["mounts"].items()
                }
                self._version = doc.get("version")
            return self._placement
