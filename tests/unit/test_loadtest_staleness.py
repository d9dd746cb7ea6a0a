"""loadtest.staleness's arithmetic: a body is one version or none, and a read's lag counts from
the first overwrite acknowledged before the read started."""

from __future__ import annotations

from loadtest.staleness import Writes, body, parse


def test_a_body_is_exactly_one_version_of_its_key() -> None:
    data = body("k0001", 42, 4096)
    assert len(data) == 4096 and parse("k0001", data, 4096) == 42
    assert parse("k0002", data, 4096) is None  # another key's
    mixed = data[:2048] + body("k0001", 43, 4096)[2048:]  # torn between two versions
    assert parse("k0001", mixed, 4096) is None
    assert parse("k0001", data[:-1], 4096) is None  # short


def test_a_read_is_behind_from_the_first_overwrite_acknowledged_before_it_started() -> None:
    writes = Writes()
    writes.add("k", 0, 10.0)
    writes.add("k", 1, 20.0)
    writes.add("k", 2, 30.0)
    assert writes.lag("k", 2, 35.0) == 0.0  # the newest
    assert writes.lag("k", 1, 25.0) == 0.0  # version 2 was not acknowledged yet
    assert writes.lag("k", 1, 36.5) == 6.5  # version 2 was, 6.5 s before
    assert writes.lag("k", 0, 36.5) == 16.5  # from version 1's acknowledgement
    assert writes.lag("k", 0, 20.0) == 0.0  # acknowledged at the read's very start: not before
