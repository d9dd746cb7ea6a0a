"""What the write tests of every store share: attributes to write, bodies that arrive or fail
the way a client's upload does, and the checks on what came back."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from typing import Any

from gateway.stores import ObjectInfo, PartInfo, Store, WriteAttrs

MIB = 1 << 20
ATTRS = WriteAttrs(
    content_type="application/json",
    content_encoding="identity",
    content_disposition='attachment; filename="a.json"',
    content_language="de",
    cache_control="max-age=60",
    expires="Wed, 21 Oct 2037 07:28:00 GMT",
    metadata={"owner": "team-a", "build": "42"},
)


class ClientGone(Exception):
    """What a body iterator raises when the client's upload fails (disconnect, bad checksum)."""


async def body(data: bytes, step: int = 256 * 1024) -> AsyncIterator[bytes]:
    for at in range(0, len(data), step):
        yield data[at : at + step]


async def failing(data: bytes, fail_at: int, step: int = 256 * 1024) -> AsyncIterator[bytes]:
    """`data` up to fail_at (all of it if fail_at >= len), then the client is gone."""
    async for chunk in body(data[:fail_at], step):
        yield chunk
    raise ClientGone("the client went away")


def md5_etag(data: bytes) -> str:
    return f'"{hashlib.md5(data).hexdigest()}"'


class HasStore:
    store: Store


async def put(
    o: HasStore, key: str, data: bytes, attrs: WriteAttrs = ATTRS, **kw: Any
) -> ObjectInfo:
    return await o.store.put(key, body(data), len(data), attrs, **kw)


async def upload(o: HasStore, key: str, upload_id: str, number: int, data: bytes) -> PartInfo:
    """One part of a multipart upload, sent in MiB chunks."""
    return await o.store.upload_part(key, upload_id, number, body(data, MIB), len(data))


def same_attrs(info: ObjectInfo, attrs: WriteAttrs) -> None:
    got = WriteAttrs.of(info)
    for name in ("content_type", "content_encoding", "content_disposition", "content_language",
                 "cache_control", "expires"):  # fmt: skip
        assert getattr(got, name) == getattr(attrs, name), name
    assert dict(got.metadata) == dict(attrs.metadata)
