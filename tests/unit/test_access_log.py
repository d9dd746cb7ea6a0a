"""The access log's lines (gateway/logs.py): a line made of parts rendered once (a cache hit
at the edge) is byte for byte the line write() makes of the same fields."""

from __future__ import annotations

import asyncio
import io
import re
from typing import Any

import pytest

from gateway.logs import AccessLog, fields


def _lines(write: Any) -> list[bytes]:
    stream = io.BytesIO()
    text = io.TextIOWrapper(stream, encoding="utf-8", errors="backslashreplace")

    async def run() -> None:
        log = AccessLog(text)
        write(log)
        log.flush()

    asyncio.run(run())
    # The time is each line's own: the rest is compared.
    return [re.sub(rb'^\{"ts":"[^"]+"', b'{"ts":"T"', x) for x in stream.getvalue().splitlines()]


@pytest.mark.parametrize(
    ("key", "access_key", "ms"),
    [
        ("plain/key.bin", "GKEY0001", 0.0),
        ('a "quoted" key\\with\nnewline', None, 12.3456789),
        ("ünïcödé/日本語", "GK\u00e9", 1234.5),
    ],
)
def test_a_line_of_parts_is_the_line_of_its_fields(
    key: str, access_key: str | None, ms: float
) -> None:
    before = {"op": "GetObject", "method": "GET", "bucket": "b", "key": key, "status": 200}
    before["bytes"] = 4096
    after = {"cache": "hit", "access_key": access_key, "store_ms": 0}
    whole = {"request_id": "ABCDEF0123456789", **before, "ms": round(ms, 3), **after}
    parts_before, parts_after = fields(before), fields(after)
    assert parts_before is not None and parts_after is not None
    made = _lines(lambda log: log.write_parts(b"ABCDEF0123456789", parts_before, ms, parts_after))
    assert made == _lines(lambda log: log.write(whole))
    assert len(made) == 1 and made[0].startswith(b'{"ts":"T","level":"info","logger":')


def test_fields_json_alone_can_write_are_left_to_write() -> None:
    # A lone surrogate (a key of undecodable bytes): orjson refuses it, json writes the line.
    assert fields({"key": "a\udc80b"}) is None
    (line,) = _lines(lambda log: log.write({"request_id": "R", "key": "a\udc80b"}))
    assert b'"key": "a\\udc80b"' in line
