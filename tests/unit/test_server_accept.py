"""gateway.server.accept.Loads: each worker's count of connections, shared by the node's
workers, and whether one is ahead of the least loaded of the others."""

from __future__ import annotations

import os

from gateway.server.accept import SLACK, Loads


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
