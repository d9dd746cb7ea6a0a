"""A map-style dataset of gateway objects for PyTorch's DataLoader (or anything that indexes):
item i is the bytes of the i-th key, through `transform` if one is given.

Safe with `DataLoader(num_workers=N)` under fork and spawn: what a worker needs travels as
options, and each worker makes its own filesystem (its own HTTP connections, its own
short-circuit connection; leases of a forked parent stay usable). torch is not imported
here: the DataLoader takes any object with __len__ and __getitem__.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from gateway.client.fs import GatewayFileSystem

log = logging.getLogger(__name__)


LEASE_AHEAD = 256  # objects leased with each batch beyond the batch's own, while there is room


class GatewayDataset:
    """`source`: "bucket/prefix" (every object beneath it, in key order) or a list of
    "bucket/key" paths. Options as GatewayFileSystem takes them.

    With short-circuit reads, each batch (`__getitems__`) leases its objects in one request,
    and with them up to `lease_ahead` more of the dataset, in its order, while the process's
    descriptor budget has room: in a shuffled epoch any object may come next, so a
    persistent worker soon holds leases of the whole dataset (if it fits), and later epochs
    read with no request to the node at all."""

    def __init__(
        self,
        source: str | Sequence[str],
        transform: Callable[[bytes], Any] | None = None,
        lease_ahead: int = LEASE_AHEAD,
        **options: Any,
    ) -> None:
        self.options = options
        self.transform = transform
        self.lease_ahead = lease_ahead
        self._ahead = 0  # the next object of the dataset to lease ahead
        self._fs: GatewayFileSystem | None = None
        self._pid = -1
        if isinstance(source, str):
            prefix = GatewayFileSystem._strip_protocol(source)
            found = self.fs.find(prefix)
            self.paths = sorted(found)
        else:
            self.paths = [GatewayFileSystem._strip_protocol(p) for p in source]

    @property
    def fs(self) -> GatewayFileSystem:
        if self._fs is None or self._pid != os.getpid():
            self._fs = GatewayFileSystem(skip_instance_cache=True, **self.options)
            self._pid = os.getpid()
            self._ahead = 0
        return self._fs

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> Any:
        if index == 0 and self._fs is not None:
            log.debug("gateway client, one epoch: %s", self._fs.stats)
        data = self.fs.cat_file(self.paths[index])
        return self.transform(data) if self.transform is not None else data

    def __getitems__(self, indices: list[int]) -> list[Any]:
        """A batch (PyTorch's DataLoader asks for a worker's batch whole): the leases of its
        objects (and of the next ones of the dataset, see the class) from the node on this
        host in one request, then each read."""
        self.prefetch(indices)
        return [self[i] for i in indices]

    def prefetch(self, indices: list[int]) -> None:
        """Lease the objects at `indices` (to be read next) in one request, with up to
        `lease_ahead` more of the dataset while the descriptor budget has room."""
        fs = self.fs
        wanted = [self.paths[i] for i in indices]
        room = fs.lease_room() - len(wanted)
        paths = self.paths
        while self._ahead < len(paths) and room > self.lease_ahead:
            extra = [p for p in paths[self._ahead : self._ahead + self.lease_ahead]
                     if not fs.leased(p)]  # fmt: skip
            self._ahead += self.lease_ahead
            wanted += extra
            room -= len(extra)
            if extra:
                break
        fs.prefetch(wanted)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_fs"], state["_pid"], state["_ahead"] = None, -1, 0
        return state
