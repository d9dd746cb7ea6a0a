"""Who this node is in the fleet: its id (kept across restarts), address, weight and zone."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import tempfile
import uuid
from pathlib import Path

from gateway.config import Settings

from .placement import Node

log = logging.getLogger(__name__)

NODE_ID_FILE = "node-id"
_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})
_GIB = float(1 << 30)


def local_node(settings: Settings) -> Node:
    """This node as its peers see it, from the fleet settings (see docs/fleet.md)."""
    host = settings.advertise_host or settings.host
    if host in _WILDCARD_HOSTS:
        # Listening everywhere says nothing of how peers reach us; the host name usually does
        # (a container's name, a pod's), and advertise_host is there when it does not.
        host = socket.gethostname()
        log.warning(
            "advertise_host is not set and host is a wildcard; advertising the host name",
            extra={"advertise_host": host},
        )
    port = settings.internal_port or settings.port + 1
    weight = settings.node_weight or settings.cache_capacity / _GIB
    return Node(
        id=node_id(settings.data_dir, settings.node_id),
        address=f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
        weight=weight,
        zone=settings.zone,
    )


def node_id(data_dir: Path, configured: str | None = None) -> str:
    """`configured` if given, else the id kept in <data_dir>/node-id, made once at first start.

    Kept with the data rather than derived from the host name: the id names the cache, so a
    node that comes back with its disk keeps owning what it has, wherever it is scheduled.
    """
    if configured:
        return configured
    path = data_dir / NODE_ID_FILE
    if not path.exists():
        _create_once(path, uuid.uuid4().hex)
    text = path.read_text(encoding="utf-8").strip()
    if not text:
        raise ValueError(f"{path} is empty: delete it to get a new node id, or set node_id")
    return text


def _create_once(path: Path, content: str) -> None:
    """Write `content` to a new file at `path`, atomically; if another process wins, keep theirs.

    Written under a temporary name and linked into place: a reader never sees a partial id,
    and link() lets exactly one of two racing processes (workers of one node) win.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(content + "\n")
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
