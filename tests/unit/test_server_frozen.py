"""A worker of the node's own server keeps what its imports and start-up made out of the
cyclic collector's full passes (gc.freeze once the lifespan has started): in an epoch over
distinct objects each full pass walked ~145,000 objects, a 60-140 ms pause of every
connection every few seconds (docs/performance.md); and it collects its youngest generation
every YOUNG_PASS new objects, not every 700. A real process serves a small ASGI
application over loopback and says what its collector holds."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request

from tests.support.net import eventually, free_port

_SERVER = """
import gc, json, socket, sys
from gateway.edge import EdgeLimits
from gateway.server import ServerConfig
from gateway.server.workers import serve_process

KEPT = []

async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    # What a burst of cold misses leaves behind: objects that live on.
    passes = gc.get_stats()[0]["collections"]
    KEPT.extend([[] for _ in range(5_000)])
    passes = gc.get_stats()[0]["collections"] - passes
    body = json.dumps(
        {"frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects()), "passes": passes}
    )
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body.encode()})

sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", int(sys.argv[1])))
sock.listen()
serve_process(app, ServerConfig(EdgeLimits(), graceful_timeout=1.0), [sock])
"""


def test_a_worker_freezes_what_its_start_up_made_before_it_serves() -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(port)])
    try:

        def ask() -> dict[str, int] | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
                    got: dict[str, int] = json.loads(r.read())
                    return got
            except OSError:
                return None

        said = eventually(ask, timeout=30)
        # The imports (the server, asyncio, uvloop) and start-up are frozen; what the
        # collector still walks is what serving made, a small part of it.
        assert said["frozen"] > 5_000, said
        assert said["tracked"] < said["frozen"] / 4, said
        # 5,000 new objects that live on make no pass of the youngest generation (CPython's
        # default threshold, 700, made seven, each moving them on to be walked again).
        assert said["passes"] == 0, said
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
