"""How a node's workers take new connections: one at a time, and from the least loaded.

The workers share their listening sockets (forked with them). An event loop's server accepts
every connection waiting when the socket becomes readable (uvloop until EAGAIN, asyncio up to
its backlog), so a burst of connections, such as a training job's loader opening its
keep-alive connections, went mostly to whichever worker woke first: 16 connections to a
node of two workers split 13/3, 11/5 and 8/8 in three tries, and the busier worker then bounds
the job's reads for as long as they stay open while its sibling idles.

Here each worker accepts one connection per readiness (nginx's default, `multi_accept off`),
and a worker holding more than SLACK connections above the least loaded of its siblings
stops reading the socket for DEFER seconds, leaving what waits to them; then it takes one
connection if one still waits (so none waits much longer than DEFER when the siblings are
busy or stuck) and looks again. A connection is counted from its accept, before it begins.
The counts live in memory shared by the workers (`Loads`: an anonymous shared mapping made
before they are forked, a slot each); a slot without a worker (not started yet, stopping or
dead) is not compared. Connections stay where they were accepted: 16 opened at once by one
client now split 8/8 or 7/9 (tests/e2e/test_workers.py).
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import socket
import ssl as ssl_module
import struct
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

SLACK = 1  # connections a worker may hold above its least loaded sibling and still accept
DEFER = 0.005  # seconds a worker ahead leaves a waiting connection to its siblings
BACKLOG = 2048  # connections the kernel queues for the workers to accept
_ACCEPT_PAUSE = 1.0  # seconds without accepting after running out of descriptors or memory
_SLOT = struct.Struct("q")
_EMPTY = -1  # a slot with no worker


class Loads:
    """The open connections of each of a node's workers, one slot a worker, in memory the
    workers share (made before they are forked). Each slot has one writer, its worker; a
    read of another's may be a moment old, which only shifts which worker accepts next."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._map = mmap.mmap(-1, _SLOT.size * workers)  # MAP_SHARED: shared after fork
        for slot in range(workers):
            self.vacate(slot)

    def set(self, slot: int, count: int) -> None:
        _SLOT.pack_into(self._map, _SLOT.size * slot, count)

    def vacate(self, slot: int) -> None:
        """The slot's worker is gone: its count is compared no more."""
        self.set(slot, _EMPTY)

    def counts(self) -> list[int]:
        return [_SLOT.unpack_from(self._map, _SLOT.size * i)[0] for i in range(self.workers)]

    def ahead(self, slot: int, mine: int) -> bool:
        """Whether a worker holding `mine` connections should leave the next to a sibling."""
        others = [n for i, n in enumerate(self.counts()) if i != slot and n != _EMPTY]
        return bool(others) and mine > min(others) + SLACK


class Counted(Protocol):
    """A worker's connections as its acceptors count them (the server's)."""

    def load(self) -> int:
        """Connections open, and accepted but not yet begun."""

    def accepted(self) -> None:
        """One more accepted: it begins (or fails) soon."""

    def begun(self) -> None:
        """One accepted has begun (counted open by then) or failed."""

    def ahead(self) -> bool:
        """Whether the next connection is better left to a sibling (Loads.ahead)."""


class Acceptor:
    """One listening socket of one worker (see the module's docstring)."""

    def __init__(
        self,
        sock: socket.socket,
        protocol: Callable[[], asyncio.Protocol],
        counted: Counted,
        *,
        ssl: ssl_module.SSLContext | None = None,
        ssl_handshake_timeout: float | None = None,
    ) -> None:
        self._sock = sock
        self._protocol = protocol
        self._counted = counted
        self._ssl = ssl
        self._handshake_timeout = ssl_handshake_timeout if ssl is not None else None
        self._loop = asyncio.get_running_loop()
        self._reading = False
        self._closed = False
        self._resume: asyncio.TimerHandle | None = None
        self._starting: set[asyncio.Task[object]] = set()

    def start(self) -> None:
        self._sock.setblocking(False)
        self._sock.listen(BACKLOG)  # bound, not yet listening, by the node's first process
        self._read()

    def close(self) -> None:
        """Accept no more (the socket stays open: the node's other workers listen on it)."""
        self._closed = True
        if self._resume is not None:
            self._resume.cancel()
        self._unread()

    def _read(self) -> None:
        if not self._reading and not self._closed:
            self._loop.add_reader(self._sock.fileno(), self._ready)
            self._reading = True

    def _unread(self) -> None:
        if self._reading:
            self._loop.remove_reader(self._sock.fileno())
            self._reading = False

    def _pause(self, seconds: float, take_one: bool) -> None:
        self._unread()
        self._resume = self._loop.call_later(seconds, self._resumed, take_one)

    def _resumed(self, take_one: bool) -> None:
        self._resume = None
        if take_one:
            # A connection left to the siblings for DEFER and still waiting: taken now (one:
            # the next is left to them again while this worker stays ahead).
            self._accept()
        if self._resume is None:  # not paused again by the accept (out of descriptors)
            self._read()

    def _ready(self) -> None:
        if self._counted.ahead():
            self._pause(DEFER, take_one=True)
            return
        self._accept()

    def _accept(self) -> None:
        try:
            conn, _ = self._sock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return  # a sibling took it, or the client gave up
        except OSError as exc:
            # Out of descriptors or memory (or anything else the socket says): asked again in
            # a second, not at every turn of the loop while the connection waits.
            log.warning("could not accept a connection (%s): accepting again in 1 s", exc)
            self._pause(_ACCEPT_PAUSE, take_one=False)
            return
        conn.setblocking(False)
        self._counted.accepted()  # counted at once: the next readiness may come before it begins
        task = self._loop.create_task(self._connect(conn))
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    async def _connect(self, conn: socket.socket) -> object:
        try:
            return await self._loop.connect_accepted_socket(
                self._protocol,
                conn,
                ssl=self._ssl,
                ssl_handshake_timeout=self._handshake_timeout,
            )
        except (OSError, TimeoutError) as exc:  # SSLError is an OSError
            conn.close()
            log.debug("a connection ended before it began: %s", exc)
            return None
        finally:
            self._counted.begun()
