"""`gateway serve --server uvicorn`: the plain-ASGI fallback. uvicorn's httptools protocol with
the edge's limits (gateway/edge.py) and its answers to plain hits, and uvicorn's supervisor
for the workers. It leans on uvicorn's protocol class and attributes (`cycle`, `pipeline`,
`flow`, `server_state`): the node's own server (gateway/server/) is the default and needs
none of them; this one is kept working and tested as the fallback.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import socket
from collections import Counter
from collections.abc import Callable
from typing import Any

import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from gateway import errors
from gateway.edge import (
    EdgeLimits,
    FastAnswer,
    FastReply,
    HeadGuard,
    fast_path,
    write_fast_answer,
)

log = logging.getLogger(__name__)


class EdgeConfig(uvicorn.Config):
    """uvicorn's configuration with the edge's limits; it travels to worker processes whole
    (pickled), so each worker's protocol finds the limits where it finds the rest."""

    def __init__(self, app: Any, limits: EdgeLimits, **kwargs: Any) -> None:
        super().__init__(
            app,
            http=EdgeProtocol,
            ws="none",
            timeout_keep_alive=limits.keepalive_timeout,
            **kwargs,
        )
        self.limits = limits
        # Connections open in this process, per listening port (the fleet's port has its
        # own count, so a flood of clients cannot crowd out the peers).
        self.open_connections: Counter[int] = Counter()


class EdgeServer(uvicorn.Server):
    """uvicorn's server for one process, which says when it serves as the node's own server's
    workers do ("worker PID started"): operators and tests read one log for both servers."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            log.info("worker %d started", os.getpid())


def run_workers(
    config: EdgeConfig, sockets: list[socket.socket], started: Callable[[], None]
) -> None:
    """Serve with `config.workers` worker processes under uvicorn's supervisor, each forked
    from this process, which has imported the gateway already (gunicorn's "preload"): a
    worker is ready in a fraction of a second where a spawned one imports it all again
    (~2.5 s of CPU each on a small machine, for every worker of every node started). This
    process must have no other thread when it forks: `started` runs once the first workers
    are, and the supervisor itself runs none. The supervisor forks again to replace a worker
    that dies, from the same quiet state."""
    from uvicorn import _subprocess
    from uvicorn.supervisors import multiprocess
    from uvicorn.supervisors.multiprocess import Multiprocess, Process

    class Worker(Process):
        @property
        def server(self) -> uvicorn.Server:
            if self._server is None:
                self._server = EdgeServer(config=self.config)
            return self._server

    class Supervisor(Multiprocess):
        ever_started = False  # whether a worker has served: then the node runs, come what may

        def init_processes(self) -> None:
            super().init_processes()
            started()

        def keep_subprocess_alive(self) -> None:
            """uvicorn's, but as the node's own server does it (gateway/server/): a worker
            that exits before it serves stops the node only if none has served yet (the app,
            TLS or the socket is broken). Once the node has served, a replacement that cannot
            start (its database down, say) is replaced in turn until one can: uvicorn's own
            would stop the whole node, every worker and the listening sockets with it."""
            if self.should_exit.is_set():
                return
            for idx, process in enumerate(self.processes):
                if process.process.is_alive():
                    # None: no answer in time (hung); else whether its server has started.
                    answer = process._healthcheck(self.config.timeout_worker_healthcheck)
                    if answer is not None:
                        self.ever_started = self.ever_started or answer
                        continue
                process.kill()  # hung, or gone
                process.join()
                if process.exitcode == STARTUP_FAILURE and not self.ever_started:
                    log.error("the node's workers could not start")
                    self.should_exit.set()
                    return
                if self.should_exit.is_set():
                    return
                log.warning("a worker died; starting another")
                replacement = Worker(self.config, self.sockets)
                replacement.start()
                self.processes[idx] = replacement

    if "fork" in multiprocessing.get_all_start_methods() and hasattr(_subprocess, "spawn"):
        # uvicorn spawns its workers through this context (uvicorn/_subprocess.py).
        setattr(_subprocess, "spawn", multiprocessing.get_context("fork"))  # noqa: B010
    # The supervisor makes its workers (at start, and to replace one that died) by this name.
    setattr(multiprocess, "Process", Worker)  # noqa: B010
    Supervisor(config, sockets=sockets).run()


class EdgeProtocol(HeadGuard, HttpToolsProtocol):
    """One HTTP/1.1 connection, as uvicorn serves it, with the edge's limits."""

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        if not isinstance(config, EdgeConfig):
            raise TypeError("EdgeProtocol needs an EdgeConfig")
        self.guard_init(config.limits)
        self._open = config.open_connections
        self._port: int | None = None  # the listening port this connection is counted on
        self._fast: FastAnswer | None = None  # this port's answer to plain hits, if any
        self._fast_answer: FastReply | None = None  # to the request parsed
        self._fast_keep_alive = True
        # Requests taken up by uvicorn's cycles and not yet answered: the one running and
        # those pipelined behind it (a refusal is sent once they are).
        self._unanswered = 0

    # -- connection ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        port = _local_port(transport)
        if self._open[port] >= self._limits.max_connections:
            self.transport = transport
            self.refuse(
                errors.SlowDown("The node has reached its limit of open connections."),
                "connection_limit",
            )
            return
        self._open[port] += 1
        self._port = port
        self._fast = fast_path(port)
        super().connection_made(transport)
        self.guard_start()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._port is not None:
            self._open[self._port] -= 1
            self._port = None
        self.guard_stop()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._answered:
            self._unset_keepalive_if_required()
        self.feed(data)

    # -- parser callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.message_begun()

    def on_url(self, url: bytes) -> None:
        self.url += url
        self.count_url(len(self.url))

    def on_header(self, name: bytes, value: bytes) -> None:
        # uvicorn's own on_header, inlined with the counting: called ~10 times a request.
        self.count_header(name, value, len(self.headers))
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.head_done()
        fast = self._fast
        if (
            fast is not None
            and (self.cycle is None or self.cycle.response_complete)
            and not self.pipeline
            and not self.flow.write_paused  # a client that does not read gets no more
        ):
            parser = self.parser
            keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive()
            # No body from a file: uvicorn's transport is written to whole, by uvicorn too.
            answer = fast(
                parser.get_method(), self.url, self.headers, keep_alive,
                self.server_state.default_headers, False,
            )  # fmt: skip
            if answer is not None:
                self._fast_answer = answer
                self._fast_keep_alive = keep_alive
                return
        super().on_headers_complete()
        self._unanswered += 1

    def on_body(self, body: bytes) -> None:
        self.progress = True
        super().on_body(body)

    def on_message_complete(self) -> None:
        self.progress = True
        answer = self._fast_answer
        if answer is None:
            super().on_message_complete()
            return
        # Answered at the edge, then on as uvicorn goes on after a response.
        self._fast_answer = None
        if not write_fast_answer(self.transport, answer, self._fast_keep_alive):
            return
        self._unset_keepalive_if_required()
        HttpToolsProtocol.on_response_complete(self)

    def on_response_complete(self) -> None:
        """A cycle's answer is complete (uvicorn calls it): the next pipelined request
        starts, or the refusal that waited for the answers goes out."""
        self._unanswered = max(0, self._unanswered - 1)
        super().on_response_complete()
        if self._refusal is not None and not self._unanswered:
            self.send_refusal()

    # -- the edge's refusals (HeadGuard) ------------------------------------------------

    def answering(self) -> bool:
        return self._unanswered > 0

    def rejecting(self) -> None:
        cycle = self.cycle
        if cycle is None or not cycle.more_body or cycle.response_complete:
            return  # what is wrong is a request's head: nothing of it was taken up
        # What is wrong is the body of the request uvicorn parsed last.
        for i, (queued, _app) in enumerate(self.pipeline):
            if queued is cycle:
                del self.pipeline[i]  # never run
                self._unanswered -= 1
                return
        if cycle.response_started:
            self._refusal = b""  # it answered already: the connection closes after it
            return
        # Running: the application is told its client went away, and answers nothing.
        cycle.disconnected = True
        cycle.message_event.set()
        self._unanswered -= 1

    def default_headers(self) -> list[tuple[bytes, bytes]]:
        return self.server_state.default_headers


def _local_port(transport: asyncio.BaseTransport) -> int:
    name = transport.get_extra_info("sockname")
    return int(name[1]) if isinstance(name, tuple) else 0
