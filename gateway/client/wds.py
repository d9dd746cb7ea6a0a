"""WebDataset tar shards through the gateway, in one line:

    gateway.client.wds.register()  # once per process; options as GatewayFileSystem takes them
    dataset = webdataset.WebDataset("gw://datasets/train/shard-{000000..000099}.tar")

`register` puts a `gw` entry in webdataset's table of URL schemes (`gopen_schemes`); each
shard is then opened through this process's GatewayFileSystem (short-circuit reads of the
node's block files with `local_socket`, else ranged GETs), read ahead in large pieces as a
tar is read: front to back. Options not given come from the environment as for the
filesystem (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, GATEWAY_LOCAL_SOCKET).
DataLoader workers (fork or spawn) each make their own filesystem on first use.
"""

from __future__ import annotations

import importlib
import os
import threading
from typing import IO, Any

from gateway.client.fs import GatewayFileSystem

READ_AHEAD = 8 << 20  # bytes of a shard asked for at once

_options: dict[str, Any] = {}
_lock = threading.Lock()
_made: tuple[int, GatewayFileSystem] | None = None


def register(**options: Any) -> None:
    """Open `gw://` URLs in webdataset through the gateway (`options`: GatewayFileSystem's)."""
    global _made
    # The module: the package exports a function of the same name.
    gopen = importlib.import_module("webdataset.gopen")
    with _lock:
        _options.clear()
        _options.update(options)
        _made = None
    gopen.gopen_schemes["gw"] = gopen_gw


def filesystem() -> GatewayFileSystem:
    """This process's filesystem for shards (made again in a forked or spawned worker)."""
    global _made
    with _lock:
        if _made is None or _made[0] != os.getpid():
            fs = GatewayFileSystem(skip_instance_cache=True, **_options)
            _made = (os.getpid(), fs)
        return _made[1]


def gopen_gw(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> IO[bytes]:
    """webdataset's opener for `gw://bucket/key`: the shard as a file read front to back."""
    del bufsize, kw  # webdataset's buffer size is for its own pipes
    if mode != "rb":
        raise ValueError(f"gw:// shards are opened for reading ('rb'), not {mode!r}")
    opened: IO[bytes] = filesystem().open(url, "rb", block_size=READ_AHEAD, cache_type="readahead")
    return opened
