"""Writes through the gateway: PUT, copy and delete, written through to the under-store
before the client hears success, and entered into the cache on the way (write-through).

A write invalidates the previous version in this node's metadata and cache at once, never
after a TTL.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway import errors
from gateway.cache import BlockWriter
from gateway.service.conditions import Conditions, check_conditions
from gateway.service.namespace import MountHandle
from gateway.service.store_errors import store_errors
from gateway.stores import ObjectInfo, WriteAttrs

if TYPE_CHECKING:
    from gateway.service.gateway import Gateway

log = logging.getLogger("gateway.writes")

MAX_PUT_SIZE = 5 << 30
DELETE_CONCURRENCY = 16


@dataclass(frozen=True, slots=True)
class WriteConditions:
    if_match: str | None = None
    if_none_match: bool = False  # If-None-Match: * (the only form S3 accepts on writes)


class _CacheTee:
    """Copies a body into the page store as it passes; a cache failure never fails the write."""

    def __init__(self, fill: BlockWriter | None) -> None:
        self.fill = fill

    async def wrap(self, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        async for chunk in body:
            if self.fill is not None:
                try:
                    await self.fill.write(chunk)
                except Exception as exc:
                    log.warning("write-through to the cache dropped: %s", exc)
                    await self.fill.abort()
                    self.fill = None
            yield chunk

    async def abort(self) -> None:
        if self.fill is not None:
            await self.fill.abort()


class ObjectWriter:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway

    def writable(self, bucket: str) -> MountHandle:
        handle = self.gw.mount(bucket)
        if handle.read_only:
            raise errors.AccessDenied("The bucket is mounted read-only.")
        return handle

    async def put(
        self,
        bucket: str,
        key: str,
        body: AsyncIterator[bytes],
        size: int,
        attrs: WriteAttrs,
        cond: WriteConditions,
    ) -> ObjectInfo:
        handle = self.writable(bucket)
        if size > MAX_PUT_SIZE:
            raise errors.EntityTooLarge(MaxSizeAllowed=str(MAX_PUT_SIZE))
        return await self.put_to(handle, key, body, size, attrs, cond)

    async def put_to(
        self,
        handle: MountHandle,
        key: str,
        body: AsyncIterator[bytes],
        size: int,
        attrs: WriteAttrs,
        cond: WriteConditions = WriteConditions(),  # noqa: B008 - frozen, so shared safely
    ) -> ObjectInfo:
        cacheable = handle.cache_enabled and size <= self.gw.pages.capacity // 4
        tee = _CacheTee(
            self.gw.pages.begin_write(handle.id, handle.block_size, size, handle.pinned(key))
            if cacheable
            else None
        )
        try:
            with store_errors(key):
                info = await handle.store.put(
                    key,
                    tee.wrap(body),
                    size,
                    attrs,
                    if_match=cond.if_match,
                    if_none_match=cond.if_none_match,
                )
        except BaseException:
            await tee.abort()
            raise
        await self.written(handle, key, info)
        if tee.fill is not None:
            try:
                await tee.fill.commit(key, info.etag)
            except Exception as exc:
                await tee.abort()
                log.warning("write-through of %s/%s not cached: %s", handle.bucket, key, exc)
        return info

    async def written(self, handle: MountHandle, key: str, info: ObjectInfo | None) -> None:
        """A new version (or, with None, no version) of key: forget the old one at once."""
        previous = self.gw.metadata.peek(handle.id, key)
        if previous is not None and (info is None or previous.etag != info.etag):
            self.gw.invalidate(handle, previous)
        if info is None:
            self.gw.metadata.forget(handle.id, key)
        else:
            self.gw.metadata.put(handle.id, key, info, time.monotonic())
        if handle.ttl < 0:
            self.gw.recorder.record(handle.id, key, info)
        if self.gw.fleet is not None:
            # Before the client hears success: a read through any node then sees the new version.
            await self.gw.fleet.invalidate(handle.id, key)

    async def delete(self, bucket: str, key: str) -> None:
        handle = self.writable(bucket)
        await self.delete_from(handle, key)

    async def delete_from(self, handle: MountHandle, key: str) -> None:
        with store_errors(key):
            await handle.store.delete(key)
        await self.written(handle, key, None)

    async def delete_many(
        self, bucket: str, keys: list[str]
    ) -> list[tuple[str, errors.S3Error | None]]:
        """DeleteObjects: every key tried, each with its own outcome, in the request's order."""
        handle = self.writable(bucket)
        slots = asyncio.Semaphore(DELETE_CONCURRENCY)

        async def one(key: str) -> tuple[str, errors.S3Error | None]:
            async with slots:
                try:
                    await self.delete_from(handle, key)
                except errors.S3Error as exc:
                    return key, exc
                return key, None

        return list(await asyncio.gather(*(one(k) for k in keys)))

    async def copy(
        self,
        src_bucket: str,
        src_key: str,
        dst_bucket: str,
        dst_key: str,
        attrs: WriteAttrs | None,
        src_cond: Conditions,
    ) -> tuple[ObjectInfo, ObjectInfo]:
        """CopyObject; attrs None keeps the source's (directive COPY). (source, new) infos."""
        src = self.gw.mount(src_bucket)
        dst = self.writable(dst_bucket)
        info = await self.gw.stat(src, src_key)
        try:
            check_conditions(src_cond, info)
        except errors.NotModified:  # copy conditions fail with 412, never 304
            raise errors.PreconditionFailed(Condition="x-amz-copy-source-if-none-match") from None
        if src.id == dst.id and src_key == dst_key and attrs is None:
            raise errors.InvalidRequest(
                "This copy request is illegal because it is trying to copy an object to itself"
                " without changing the object's metadata, storage class, website redirect"
                " location or encryption attributes."
            )
        if src.id == dst.id:
            with store_errors(src_key):
                new = await dst.store.copy(src_key, dst_key, attrs, if_match=info.etag)
            await self.written(dst, dst_key, new)
            return info, new
        body = await self.gw.open_body(src, info, 0, info.size)
        async with aclosing(body):
            new = await self.put_to(dst, dst_key, body, info.size, attrs or WriteAttrs.of(info))
        return info, new
