"""gateway.server.accept.Loads: each worker's count of connections, shared by the node's
workers, and whether one is ahead of the least loaded of the others."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable

import pytest

from gateway.server.accept import SLACK, Acceptor, Loads

pytestmark = pytest.mark.anyio


def test_a_worker_is_ahead_past_the_least_loaded_sibling_by_more_than_the_slack() -> None:
    loads = Loads(3)
    assert not loads.ahead(0, 50)  # no sibling counted yet: nobody to leave it to
    loads.set(1, 4)
    loads.set(2, 9)
    assert not loads.ahead(0, 4 + SLACK)
    assert loads.ahead(0, 5 + SLACK)  # the least loaded (4) is who takes the next


def test_a_vacated_slot_is_not_compared() -> None:
    loads = Loads(2)
    loads.set(0, 7)
    loads.set(1, 0)
    assert loads.ahead(0, 7)
    loads.vacate(1)  # its worker died: a live worker takes every connection again
    assert not loads.ahead(0, 7)


def test_the_counts_are_shared_with_a_forked_worker() -> None:
    loads = Loads(2)
    pid = os.fork()
    if pid == 0:  # the worker: its count, seen by the parent
        loads.set(1, 42)
        os._exit(0)
    os.waitpid(pid, 0)
    assert loads.counts() == [-1, 42]


class _Counts:
    """A worker's Counted, as its server keeps it: accepted connections count at once."""

    changed = asyncio.Event()  # set at each accept (of any worker: the test's one loop)

    def __init__(self, loads: Loads, slot: int) -> None:
        self.open = 0
        self.loads, self.slot = loads, slot

    def ahead(self) -> bool:
        return self.loads.ahead(self.slot, self.open)

    def load(self) -> int:
        return self.open

    def accepted(self) -> None:
        self.open += 1
        _Counts.changed.set()

    @staticmethod
    async def until(holds: Callable[[], bool]) -> None:
        while not holds():
            _Counts.changed.clear()
            await asyncio.wait_for(_Counts.changed.wait(), 10)

    def begun(self) -> None:
        pass


class _Quiet(asyncio.Protocol):
    pass


async def test_a_worker_ahead_leaves_waiting_connections_to_a_sibling_and_starves_none() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    loads = Loads(2)
    mine, theirs = _Counts(loads, 0), _Counts(loads, 1)
    mine.open = 5  # five ahead of a sibling with none
    loads.set(0, mine.open)
    loads.set(1, 0)
    ahead = Acceptor(listener, _Quiet, mine)
    ahead.start()
    clients = []
    try:
        # The sibling is counted but takes nothing (busy, or stuck): the worker ahead still
        # takes each waiting connection after leaving it to the sibling for DEFER.
        for n in range(1, 4):
            clients.append(socket.create_connection(("127.0.0.1", port)))
            await _Counts.until(lambda n=n: mine.open == 5 + n)
        # The sibling takes connections now: those that come are left to it.
        sibling = Acceptor(listener, _Quiet, theirs)
        sibling.start()
        for _ in range(4):
            clients.append(socket.create_connection(("127.0.0.1", port)))
        await _Counts.until(lambda: mine.open + theirs.open == 5 + 3 + 4)
        assert (mine.open, theirs.open) == (8, 4)
        sibling.close()
    finally:
        ahead.close()
        for client in clients:
            client.close()
        listener.close()
