"""The processes of the node's own server: `Serving` runs the application's lifespan around
one process's listening sockets; `run_workers` forks the node's worker processes from this one
(which has imported the gateway already), replaces a worker that dies, and stops them all on
SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import selectors
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from gateway.server.accept import Acceptor, Loads
from gateway.server.protocol import ASGI_VERSION, App, Server, ServerConfig

log = logging.getLogger(__name__)

# -- one process ---------------------------------------------------------------------------


class Serving:
    """One process's server: the lifespan around its listening sockets."""

    def __init__(
        self,
        app: App,
        config: ServerConfig,
        sockets: list[socket.socket],
        loads: Loads | None = None,
        slot: int = 0,
    ) -> None:
        self.server = Server(app, config)
        self.server.loads, self.server.slot = loads, slot
        self.sockets = sockets
        self.started = False
        self._stop = asyncio.Event()
        self._lifespan: _Lifespan | None = None

    def stop(self) -> None:
        self._stop.set()

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self.stop)
        lifespan = self._lifespan = _Lifespan(self.server.app, self.server.state)
        if not await lifespan.startup():
            return
        _freeze_start_up()
        config, server = self.server.config, self.server
        if server.loads is not None:
            server.loads.set(server.slot, 0)  # here now: compared from now on
        listeners = [
            Acceptor(
                sock, server.protocol, server,
                ssl=config.ssl, ssl_handshake_timeout=config.limits.head_timeout,
            )
            for sock in self.sockets
        ]  # fmt: skip
        for listener in listeners:
            listener.start()
        self.started = True
        log.info("worker %d started", os.getpid())
        await self._stop.wait()
        for listener in listeners:
            listener.close()
        if server.loads is not None:
            # Stopping: new connections go to the others, and this one's count, falling as its
            # connections close, is not told (a sibling would leave connections to it).
            server.loads.vacate(server.slot)
            server.loads = None
        await self.server.drain()
        await lifespan.shutdown()


class _Lifespan:
    """The ASGI lifespan protocol, as the server's side of it."""

    def __init__(self, app: App, state: dict[str, Any]) -> None:
        self._app = app
        self._state = state
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._answers: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        scope = {"type": "lifespan", "asgi": ASGI_VERSION, "state": self._state}
        try:
            await self._app(scope, self._inbox.get, self._answers.put)
        except BaseException as exc:
            await self._answers.put({"type": "failed", "message": repr(exc)})
            if not isinstance(exc, Exception):
                raise

    async def startup(self) -> bool:
        self._task = asyncio.create_task(self._run())
        await self._inbox.put({"type": "lifespan.startup"})
        answer = await self._answers.get()
        if answer["type"] != "lifespan.startup.complete":
            log.error("the node did not start: %s", answer.get("message", answer["type"]))
            return False
        return True

    async def shutdown(self) -> None:
        await self._inbox.put({"type": "lifespan.shutdown"})
        answer = await self._answers.get()
        if answer["type"] != "lifespan.shutdown.complete":
            log.error("the node did not stop cleanly: %s", answer.get("message", answer["type"]))
        if self._task is not None:
            with contextlib.suppress(BaseException):
                await self._task


# New container objects (net of those freed) between two passes of the cyclic collector over
# the youngest generation; CPython's default is 700.
YOUNG_PASS = 20_000


def _freeze_start_up() -> None:
    """Keep what the imports and the node's start-up made (~110,000 objects: modules,
    functions, types, the stores' clients) out of the cyclic collector's full passes: they
    live as long as the process, and each full pass walked them all (60-140 ms at ~145,000
    objects, a pause every few seconds of an epoch over distinct objects; ~15-40 ms for what
    serving makes, after). Start-up's garbage is collected first, so none of it is kept. A
    frozen object that becomes garbage in a cycle (a store client of a mount removed) is not
    collected: a few per mount change.

    The young generation is collected every YOUNG_PASS new objects rather than 700: a cold
    miss leaves ~100 (its version, block keys, memos), so the default passed every few
    misses and moved what they left to the older generations, whose passes walk all of it
    again (a full pass every ~750 misses, 40-65 ms each). A request's own objects are freed
    by their counts, not by the collector, so a rarer pass has less to look at, not more;
    what it costs is cyclic garbage kept a little longer (docs/performance.md, "The cyclic
    collector": ~30 % of the loop's CPU a cold miss)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_PASS, older, oldest)


def serve_process(
    app: App,
    config: ServerConfig,
    sockets: list[socket.socket],
    loads: Loads | None = None,
    slot: int = 0,
) -> bool:
    """Serve in this process until SIGINT or SIGTERM; False when the node did not start.
    `loads`, `slot`: the node's workers' counts of connections, and this worker's (accept.py)."""
    serving = Serving(app, config, sockets, loads, slot)
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(serving.serve())
    return serving.started


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
        return None
    return uvloop.new_event_loop


# -- the node's workers --------------------------------------------------------------------

# Exit status of a worker whose node did not start (its lifespan failed).
NOT_STARTED = 3


def run_workers(
    make_app: Callable[[], App],
    config: ServerConfig,
    sockets: list[socket.socket],
    workers: int,
    started: Callable[[], None],
) -> int:
    """Fork `workers` processes serving `sockets`, each building its app with `make_app`;
    replace a worker that dies; on SIGINT or SIGTERM stop them (each drains gracefully) and
    return. This process must have no other thread when it forks: `started` runs after the
    first forks. The exit status: 0, or NOT_STARTED when no worker's node ever started."""
    supervisor = _Supervisor(make_app, config, sockets, workers)
    return supervisor.run(started)


class _Supervisor:
    def __init__(
        self,
        make_app: Callable[[], App],
        config: ServerConfig,
        sockets: list[socket.socket],
        workers: int,
    ) -> None:
        self._make_app = make_app
        self._config = config
        self._sockets = sockets
        self._workers = workers
        self._children: dict[int, int] = {}  # pid -> the read end of its "started" pipe
        self._loads = Loads(workers)  # made before the forks: shared with every worker
        self._slots: dict[int, int] = {}  # pid -> its slot in _loads
        self._ever_started = False
        self._stopping: int | None = None  # the signal that stops the node

    def _fork(self) -> None:
        slot = min(set(range(self._workers)) - set(self._slots.values()))
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                os.close(read)
                for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
                    signal.signal(signum, signal.SIG_DFL)
                signal.set_wakeup_fd(-1)
                code = _worker(
                    self._make_app, self._config, self._sockets, write, self._loads, slot
                )
            except BaseException:
                log.exception("worker %d failed", os.getpid())
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        os.close(write)
        os.set_blocking(read, False)
        self._children[pid] = read
        self._slots[pid] = slot

    def run(self, started: Callable[[], None]) -> int:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        old_wakeup = signal.set_wakeup_fd(wake_w)
        handlers = {}

        def stop(signum: int, _frame: Any) -> None:
            if self._stopping is None:
                self._stopping = signum

        for signum in (signal.SIGINT, signal.SIGTERM):
            handlers[signum] = signal.signal(signum, stop)
        handlers[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda *_: None)
        try:
            for _ in range(self._workers):
                self._fork()
            started()
            return self._supervise(wake_r)
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
            os.close(wake_r)
            os.close(wake_w)

    def _supervise(self, wake: int) -> int:
        selector = selectors.DefaultSelector()
        selector.register(wake, selectors.EVENT_READ)
        try:
            while True:
                self._note_started()
                if self._stopping is not None:
                    return self._stop_all()
                failed_start = self._reap()
                if failed_start and not self._ever_started:
                    log.error("the node's workers could not start")
                    self._stopping = signal.SIGTERM
                    self._stop_all()
                    return NOT_STARTED
                for _ in range(self._workers - len(self._children)):
                    if self._stopping is None:
                        log.warning("a worker died; starting another")
                        self._fork()
                selector.select(timeout=1.0)
                with contextlib.suppress(BlockingIOError):
                    os.read(wake, 512)
        finally:
            selector.close()

    def _note_started(self) -> None:
        for read in self._children.values():
            with contextlib.suppress(BlockingIOError, OSError):
                if os.read(read, 1):
                    self._ever_started = True

    def _reap(self) -> bool:
        """Collect dead workers; True when one of them exited without having started."""
        failed = False
        while self._children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            read = self._children.pop(pid, None)
            if read is None:
                continue
            self._loads.vacate(self._slots.pop(pid))  # a dead worker takes no connection
            with contextlib.suppress(BlockingIOError, OSError):
                if os.read(read, 1):
                    self._ever_started = True
            os.close(read)
            if os.waitstatus_to_exitcode(status) == NOT_STARTED:
                failed = True
        return failed

    def _stop_all(self) -> int:
        for pid in self._children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + self._config.graceful_timeout + 10.0
        while self._children and time.monotonic() < deadline:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.05)
                continue
            read = self._children.pop(pid, None)
            if read is not None:
                os.close(read)
        for pid in self._children:  # past the deadline
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self._children.clear()
        return 0 if self._ever_started else NOT_STARTED


def _worker(
    make_app: Callable[[], App],
    config: ServerConfig,
    sockets: list[socket.socket],
    tell: int,
    loads: Loads,
    slot: int,
) -> int:
    app = make_app()

    async def told_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return

        async def send_and_tell(message: dict[str, Any]) -> None:
            if message["type"] == "lifespan.startup.complete":
                with contextlib.suppress(OSError):
                    os.write(tell, b"1")
            await send(message)

        await app(scope, receive, send_and_tell)

    ok = serve_process(told_app, config, sockets, loads, slot)
    return 0 if ok else NOT_STARTED
