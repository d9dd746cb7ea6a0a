"""The node's own HTTP/1.1 server (the default; uvicorn stays available as the plain-ASGI
fallback, `gateway serve --server uvicorn`, gateway/edge_uvicorn.py): the protocol over
httptools' parser on uvloop with plain hits answered at the edge (`protocol.py`), the ASGI
exchanges (`exchange.py`), the send side of each connection, fair across connections
(`sends.py`), and the worker processes (`workers.py`)."""

from gateway.server.exchange import ZEROCOPY
from gateway.server.protocol import BODY_HIGH_WATER, Server, ServerConfig
from gateway.server.sends import SLICE
from gateway.server.workers import NOT_STARTED, run_workers, serve_process

__all__ = [
    "BODY_HIGH_WATER", "NOT_STARTED", "SLICE", "ZEROCOPY", "Server", "ServerConfig",
    "run_workers", "serve_process",
]  # fmt: skip
