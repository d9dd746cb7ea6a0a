"""The read plan: which blocks a read of a byte range touches, which bytes of each, which
blocks are fetched ahead of it, and who holds each (a pure function of its inputs)."""

from __future__ import annotations

from datetime import UTC, datetime

from gateway.cache import BlockKey
from gateway.cluster.placement import Node
from gateway.service.plan import plan
from gateway.stores import ObjectInfo

KiB = 1024
PEER = (Node("peer", "127.0.0.1:1"),)


def info(size: int) -> ObjectInfo:
    return ObjectInfo("k", size, '"e"', datetime(2026, 1, 1, tzinfo=UTC))


def here(index: int, bkey: BlockKey) -> tuple[Node, ...]:
    return ()


def cut(size: int, start: int, end: int, ahead: int = -1) -> list[tuple[int, int, int, int]]:
    return [
        (s.index, s.length, s.start, s.end)
        for s in plan(1, info(size), 4 * KiB, start, end, ahead, here)
    ]


def test_a_range_inside_one_block_is_one_span() -> None:
    assert cut(10 * KiB, 5000, 6000) == [(1, 4096, 904, 1904)]


def test_a_range_across_blocks_takes_the_parts_of_each() -> None:
    assert cut(10 * KiB, 4000, 9000) == [
        (0, 4096, 4000, 4096),
        (1, 4096, 0, 4096),
        (2, 2048, 0, 808),
    ]


def test_the_last_block_is_short() -> None:
    assert cut(10 * KiB, 0, 10 * KiB)[-1] == (2, 2048, 0, 2048)


def test_blocks_ahead_of_the_read_have_nothing_to_read_and_stop_at_the_object_end() -> None:
    spans = list(plan(1, info(10 * KiB), 4 * KiB, 0, 100, 5, here))
    assert [(s.index, s.wanted) for s in spans] == [(0, True), (1, False), (2, False)]


def test_each_span_names_its_block_and_its_holders() -> None:
    def place(index: int, bkey: BlockKey) -> tuple[Node, ...]:
        return PEER if index % 2 else ()

    spans = list(plan(7, info(16 * KiB), 4 * KiB, 0, 16 * KiB, -1, place))
    assert [s.owners for s in spans] == [(), PEER, (), PEER]
    assert [s.key for s in spans] == [BlockKey(7, "k", '"e"', 4 * KiB, i) for i in range(4)]
    assert [s.offset for s in spans] == [0, 4096, 8192, 12288]


def test_the_plan_is_made_as_it_is_read() -> None:
    asked: list[int] = []

    def place(index: int, bkey: BlockKey) -> tuple[Node, ...]:
        asked.append(index)
        return ()

    spans = plan(1, info(1 << 40), 4 * KiB, 0, 1 << 40, -1, place)
    assert [next(spans).index for _ in range(3)] == [0, 1, 2]
    assert asked == [0, 1, 2]
