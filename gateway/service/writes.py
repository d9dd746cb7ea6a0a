"""Writes through the gateway: PUT, copy and delete, written through to the under-store
before the client hears success, and entered into the cache on the way (write-through).

A write invalidates the previous version in this node's metadata and cache at once, never
after a TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, replace
from email.errors import HeaderParseError
from email.header import decode_header, make_header
from typing import TypeVar

from sqlalchemy import Executable

from gateway import errors
from gateway.cache import BlockWriter, FillFailed
from gateway.meta import KeyBusy, MetaError
from gateway.service.conditions import check_conditions
from gateway.service.inputs import CopySource, DeleteEntry, Deletion
from gateway.service.namespace import MountHandle
from gateway.service.shared import Reads, Shared
from gateway.service.store_errors import WithheldDetail, store_errors
from gateway.stores import ObjectInfo, VersionChanged, VersionDeleted, WriteAttrs

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_PUT_SIZE = 5 << 30
DELETE_CONCURRENCY = 16
# How long a conditional write waits for another writer of its key (KEY_WAIT) before it is
# answered 409 ConditionalRequestConflict, as S3 answers such a conflict: within the time
# SDKs wait for an answer.
KEY_WAIT = 30.0


def as_stored(attrs: WriteAttrs) -> WriteAttrs:
    """A client's attributes as S3 keeps them: RFC 2047 words in user metadata values are
    decoded before storing (S3 answers a value that is not ASCII encoded again). Every store
    then keeps the same text, whatever its own way of carrying it."""
    if not any("=?" in value for value in attrs.metadata.values()):
        return attrs
    return replace(attrs, metadata={k: _decoded(v) for k, v in attrs.metadata.items()})


def _decoded(value: str) -> str:
    if "=?" not in value:
        return value
    try:
        return str(make_header(decode_header(value)))
    except (HeaderParseError, LookupError, UnicodeDecodeError):
        return value  # not well-formed words: kept as the text it is, as S3 does


# Where a client asked for each kind of encryption (the header S3's NotImplemented names).
_ENCRYPTION_HEADERS = {
    "algorithm": "x-amz-server-side-encryption",
    "customer_algorithm": "x-amz-server-side-encryption-customer-algorithm",
    "customer_key": "x-amz-server-side-encryption-customer-key",
}


def check_encryption(handle: MountHandle, encryption: Mapping[str, str]) -> None:
    """Refuse server-side encryption a mount's store cannot do: the object would be kept in
    plaintext by a store that was asked to encrypt it (S3's answer for a header it does not
    implement: 501 NotImplemented, naming the header)."""
    if not encryption or handle.store.encrypts:
        return
    header = next((h for n, h in _ENCRYPTION_HEADERS.items() if n in encryption), None)
    raise errors.NotImplementedError_(
        "A header you provided implies functionality that is not implemented: this bucket's"
        f" store ({handle.store.scheme}://) does not encrypt objects.",
        Header=header or "x-amz-server-side-encryption",
    )


def customer_keyed(attrs: WriteAttrs) -> bool:
    """Encrypted with the client's own key (SSE-C): never cached, readable only with it."""
    return "customer_key" in attrs.encryption


@dataclass(frozen=True, slots=True)
class WriteConditions:
    if_match: str | None = None
    if_none_match: bool = False  # If-None-Match: * (the only form S3 accepts on writes)


async def _current(handle: MountHandle, key: str) -> ObjectInfo | None:
    """The key's version at the store, None when there is none."""
    try:
        with store_errors(key):
            return await handle.store.stat(key)
    except errors.NoSuchKey:
        return None


async def resolved(handle: MountHandle, key: str, cond: WriteConditions) -> WriteConditions:
    """If-Match: * (any version) as the ETag the stores compare: the key's current one, so
    the write still fails if it changes meanwhile; NoSuchKey when there is none, as S3."""
    if cond.if_match is None or cond.if_match.strip() != "*":
        return cond
    info = await _current(handle, key)
    if info is None:
        raise errors.NoSuchKey(Key=key)
    return replace(cond, if_match=info.etag)


async def precondition_answer(
    handle: MountHandle, key: str, cond: WriteConditions, failed: errors.S3Error
) -> errors.S3Error:
    """What S3 answers a write whose condition failed: If-Match of a key that is not there
    is 404 NoSuchKey, anything else 412 PreconditionFailed."""
    if cond.if_match is not None and await _current(handle, key) is None:
        return errors.NoSuchKey(Key=key)
    return failed


@contextlib.asynccontextmanager
async def one_writer(
    shared: Shared, handle: MountHandle, key: str, conditional: bool = True
) -> AsyncIterator[None]:
    """The key held against every other writer of it that holds it too, on any node or
    worker of the fleet (the database's key lock), from the check of a condition to the
    store's answer: of two conditional writes of one key, the second checks its condition
    against what the first wrote, also at an origin whose own check is not atomic (moto's).

    A conditional write that waited KEY_WAIT for the key is answered 409
    ConditionalRequestConflict; an unconditional one goes on without it. A database that
    cannot be asked leaves the write to the store's own check, said in the log."""
    try:
        held = await shared.meta.key_locks.take(
            handle.id, key, shared.namespace.write_lease, KEY_WAIT
        )
    except KeyBusy:
        if conditional:
            raise errors.ConditionalRequestConflict() from None
        log.warning("%s/%s written without its key lock: held past %s s", handle.bucket, key,
                    KEY_WAIT)  # fmt: skip
        held = None
    except MetaError as exc:  # MetaUnavailable too
        log.warning("%s/%s written without its key lock: %s", handle.bucket, key, exc)
        held = None
    try:
        yield
    finally:
        if held is not None:
            await held.release()


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


async def from_source(
    shared: Shared,
    reads: Reads,
    source: CopySource,
    use: Callable[[MountHandle, ObjectInfo], Awaitable[T]],
) -> tuple[ObjectInfo, T]:
    """What `use` makes of a copy's source: its current version, the copy conditions checked
    (they fail with 412, never 304). Overwritten meanwhile, the source is copied in its new
    version (its conditions checked again), as a GET would serve it; once. A version named by
    id is that version, or an error: never the current one instead."""
    src = shared.mount(source.bucket)
    if source.version_id is not None and (source.version_id != "null" or src.store.versions):
        return await _from_version(shared, src, source, source.version_id, use)
    for attempt in range(2):
        info = await reads.stat(src, source.key)
        try:
            check_conditions(source.conditions, info)
        except errors.NotModified:
            raise errors.PreconditionFailed(Condition="x-amz-copy-source-if-none-match") from None
        try:
            return info, await use(src, info)
        except VersionChanged:
            await shared.versions.doubt(src, source.key)
            if attempt:
                raise errors.ServiceUnavailable(
                    "The source object changed while it was copied."
                ) from None
        except FillFailed as exc:
            raise errors.ServiceUnavailable(f"The source's store cut its answer: {exc}") from None
    raise AssertionError("unreachable")


async def _from_version(
    shared: Shared,
    src: MountHandle,
    source: CopySource,
    version_id: str,
    use: Callable[[MountHandle, ObjectInfo], Awaitable[T]],
) -> tuple[ObjectInfo, T]:
    """from_source of a version named by id (Versions.addressed: NoSuchVersion, a delete
    marker refused as S3 refuses it, InvalidArgument where the store keeps one version)."""
    try:
        info = await shared.versions.addressed(src, source.key, version_id)
    except errors.MethodNotAllowed:
        raise errors.InvalidRequest(
            "The source of a copy request may not specifically refer to a delete marker by"
            " version id."
        ) from None
    try:
        check_conditions(source.conditions, info)
    except errors.NotModified:
        raise errors.PreconditionFailed(Condition="x-amz-copy-source-if-none-match") from None
    try:
        return info, await use(src, info)
    except VersionChanged:
        # The store holds other bytes under the id than it said: asked again next time.
        shared.versions.forget(src.id, source.key)
        raise errors.ServiceUnavailable("The source version changed while it was copied.") from None
    except FillFailed as exc:
        raise errors.ServiceUnavailable(f"The source's store cut its answer: {exc}") from None


class ObjectWriter:
    """PUT, copy and delete; `reads` gives a copy its source."""

    def __init__(self, shared: Shared, reads: Reads) -> None:
        self.shared = shared
        self.reads = reads

    async def put(
        self,
        bucket: str,
        key: str,
        body: AsyncIterator[bytes],
        size: int,
        attrs: WriteAttrs,
        cond: WriteConditions,
    ) -> ObjectInfo:
        handle = self.shared.writable(bucket)
        if size > MAX_PUT_SIZE:
            raise errors.EntityTooLarge(MaxSizeAllowed=str(MAX_PUT_SIZE))
        return await self.put_to(handle, key, body, size, as_stored(attrs), cond)

    async def put_to(
        self,
        handle: MountHandle,
        key: str,
        body: AsyncIterator[bytes],
        size: int,
        attrs: WriteAttrs,
        cond: WriteConditions = WriteConditions(),  # noqa: B008 - frozen, so shared safely
    ) -> ObjectInfo:
        check_encryption(handle, attrs.encryption)
        keyed = customer_keyed(attrs)
        cacheable = not keyed and handle.cache_enabled and size <= self.shared.pages.capacity // 4
        tee = _CacheTee(
            self.shared.pages.begin_write(handle.id, handle.block_size, size, handle.pinned(key))
            if cacheable
            else None
        )
        conditional = cond.if_match is not None or cond.if_none_match
        try:
            async with (
                one_writer(self.shared, handle, key) if conditional else contextlib.nullcontext()
            ):
                cond = await resolved(handle, key, cond)
                # Once the key is held: what another writer did meanwhile is before it.
                ticket = self.shared.versions.ticket(handle, key)
                with store_errors(key):
                    info = await handle.store.put(
                        key,
                        tee.wrap(body),
                        size,
                        attrs,
                        if_match=cond.if_match,
                        if_none_match=cond.if_none_match,
                    )
        except errors.PreconditionFailed as exc:
            await tee.abort()
            raise await precondition_answer(handle, key, cond, exc) from None
        except BaseException:
            await tee.abort()
            raise
        await self.written(handle, key, info, ticket, remember=not keyed)
        if tee.fill is not None:
            try:
                await tee.fill.commit(key, info.etag)
            except Exception as exc:
                await tee.abort()
                log.warning("write-through of %s/%s not cached: %s", handle.bucket, key, exc)
        return info

    async def written(
        self,
        handle: MountHandle,
        key: str,
        info: ObjectInfo | None,
        ticket: int | None,
        remember: bool = True,
        also: Sequence[Executable] = (),
    ) -> None:
        """A new version (or, with None, no version) of key, written after `ticket` was taken
        (Versions.ticket; None: the new version is not trusted by reads): forget the old one
        at once.
        remember=False keeps the new version's metadata out of every cache (SSE-C: a HEAD
        without the key must reach the store, which refuses it). `also`: the write's own
        bookkeeping statements (a completed upload's removal).

        The write's database bookkeeping (its version's row on a TTL -1 or a catalog=on
        mount, `also`) is one transaction, committed before the client hears success
        (versions.Versions.written); a failure of it is logged, not the client's (the store
        has the write)."""
        shared = self.shared
        if info is not None and info.version_id is not None:
            # The key's current version: read by its ETag, as any (a version id is for reads
            # that name it).
            info = replace(info, version_id=None)
        await shared.versions.written(handle, key, info, ticket, remember, also)
        if shared.fleet is not None:
            # Before the client hears success: a read through any node then sees the new version.
            await shared.fleet.invalidate(handle.id, key)

    def _forget(self, handle: MountHandle, key: str) -> None:
        """Drop this node's version of key, and the blocks of its old version; the node's
        other workers hear of it."""
        self.shared.versions.forget(handle.id, key, handle)

    async def delete(self, bucket: str, key: str) -> VersionDeleted | None:
        """DeleteObject; on a store that keeps versions, the delete marker it made, if any."""
        handle = self.shared.writable(bucket)
        return await self.delete_from(handle, key)

    async def delete_from(self, handle: MountHandle, key: str) -> VersionDeleted | None:
        # Forgotten before the store is asked and whatever it answers: a delete that failed
        # part way may have removed the object, and a removed object must never be served
        # from the cache again (the next read asks the store). The key's row follows only a
        # delete the store acknowledged.
        self._forget(handle, key)
        try:
            with store_errors(key):
                done = await handle.store.delete(key)
        except BaseException:
            self._forget(handle, key)  # a read meanwhile may have learnt it again
            if self.shared.fleet is not None:
                with contextlib.suppress(Exception):
                    await self.shared.fleet.invalidate(handle.id, key)
            raise
        await self.written(handle, key, None, None)
        return done

    async def delete_version(self, bucket: str, key: str, version_id: str) -> VersionDeleted | None:
        """DeleteObject of a version named by id."""
        return await self.delete_version_from(self.shared.writable(bucket), key, version_id)

    async def delete_version_from(
        self, handle: MountHandle, key: str, version_id: str
    ) -> VersionDeleted | None:
        """In a store that keeps versions, that version removed for good. The key's current
        version may change with it (the latest removed, or a delete marker), so the key is
        forgotten as by a delete, before and after the store's answer; the catalog doubts its
        row rather than drop it (older versions may remain). A store that keeps one version
        has only "null", the key's one version (deleted as by DeleteObject); any other id is
        InvalidArgument, as S3 answers it for a bucket never versioned, and nothing is
        deleted."""
        if not handle.store.versions:
            if version_id != "null":
                raise errors.InvalidArgument(
                    "Invalid version id specified", ArgumentName="versionId",
                    ArgumentValue=version_id,
                )  # fmt: skip
            return await self.delete_from(handle, key)
        self._forget(handle, key)
        try:
            with store_errors(key):
                deleted = await handle.store.delete_version(key, version_id)
        finally:
            self._forget(handle, key)
            if self.shared.fleet is not None:
                with contextlib.suppress(Exception):
                    await self.shared.fleet.invalidate(handle.id, key)
        await self.shared.versions.doubt(handle, key)
        return deleted

    async def delete_many(self, bucket: str, entries: list[DeleteEntry]) -> list[Deletion]:
        """DeleteObjects: every entry tried as DeleteObject would do it (its version named by
        id removed, never the current object instead), each with its own outcome, in the
        request's order. Keys are deleted side by side; the entries of one key one after the
        other, in the request's order (an origin may not keep a key's versions straight under
        concurrent deletes of them: moto left one of three behind)."""
        handle = self.shared.writable(bucket)
        slots = asyncio.Semaphore(DELETE_CONCURRENCY)
        by_key: dict[str, list[int]] = {}
        for i, entry in enumerate(entries):
            by_key.setdefault(entry.key, []).append(i)
        done: list[Deletion | None] = [None] * len(entries)

        async def one(entry: DeleteEntry) -> Deletion:
            key, version_id = entry.key, entry.version_id
            try:
                if version_id is None:
                    deleted = await self.delete_from(handle, key)
                else:
                    deleted = await self.delete_version_from(handle, key, version_id)
            except errors.S3Error as exc:
                if isinstance(exc, WithheldDetail):  # rendered in the result, not alone
                    log.warning("DeleteObjects %s/%s: %s", handle.bucket, key, exc)
                return Deletion(entry, error=exc)
            return Deletion(entry, deleted)

        async def key_s(indexes: list[int]) -> None:
            async with slots:
                for i in indexes:
                    done[i] = await one(entries[i])

        await asyncio.gather(*(key_s(indexes) for indexes in by_key.values()))
        return [d for d in done if d is not None]

    async def copy(
        self,
        source: CopySource,
        dst_bucket: str,
        dst_key: str,
        attrs: WriteAttrs | None,
        tags: dict[str, str] | None = None,
        encryption: dict[str, str] | None = None,
    ) -> tuple[ObjectInfo, ObjectInfo]:
        """CopyObject; attrs None keeps the source's (directive COPY), tags None the source's
        tags (x-amz-tagging-directive COPY); encryption asked of the copy. (source, new)."""
        dst = self.shared.writable(dst_bucket)
        attrs = None if attrs is None else as_stored(attrs)
        check_encryption(dst, encryption or {})

        async def copy_version(src: MountHandle, info: ObjectInfo) -> ObjectInfo:
            # A version named by id may be copied onto its own key as it is: that makes it
            # the current version again, as S3 has it.
            itself = src.id == dst.id and source.key == dst_key and info.version_id is None
            if itself and attrs is None and not encryption:
                raise errors.InvalidRequest(
                    "This copy request is illegal because it is trying to copy an object to"
                    " itself without changing the object's metadata, storage class, website"
                    " redirect location or encryption attributes."
                )
            chosen = attrs
            if chosen is not None or tags is not None or encryption:
                # Whatever is not given is the source's, the tags included.
                chosen = chosen or WriteAttrs.of(info)
                kept = tags
                if kept is None:
                    kept = dict(info.tags) if info.tags is not None else {}
                    if info.tags is None:
                        with store_errors(info.key):
                            kept = await src.store.get_tags(info.key, info.version_id)
                chosen = replace(chosen, tags=kept, encryption=encryption or {})
            return await self._copy_version(src, info, dst, dst_key, chosen)

        return await from_source(self.shared, self.reads, source, copy_version)

    async def _copy_version(
        self,
        src: MountHandle,
        info: ObjectInfo,
        dst: MountHandle,
        dst_key: str,
        attrs: WriteAttrs | None,
    ) -> ObjectInfo:
        if src.id == dst.id:
            ticket = self.shared.versions.ticket(dst, dst_key)
            with store_errors(info.key):
                new = await dst.store.copy(
                    info.key, dst_key, attrs, if_match=info.etag, version_id=info.version_id
                )
            await self.written(dst, dst_key, new, ticket)
            return new
        if attrs is None:
            attrs = WriteAttrs.of(info)
            if info.tags is None:  # the stat did not tell them: the source's store does
                with store_errors(info.key):
                    tags = await src.store.get_tags(info.key, info.version_id)
                attrs = replace(attrs, tags=tags)
        body = await self.reads.open_body(src, info, 0, info.size)
        async with aclosing(body):
            return await self.put_to(dst, dst_key, body, info.size, attrs)

    # -- tags ----------------------------------------------------------------------------------

    async def get_tags(
        self, bucket: str, key: str, version_id: str | None = None
    ) -> dict[str, str]:
        """The tags of the key's current version, or of the version named by id."""
        handle = self.shared.mount(bucket)
        version_id = await self._tagged(handle, key, version_id)
        with store_errors(key):
            return await handle.store.get_tags(key, version_id)

    async def put_tags(
        self, bucket: str, key: str, tags: dict[str, str], version_id: str | None = None
    ) -> None:
        """Replace the tags (empty: remove them) of the key's current version, or of the
        version named by id; its bytes stay the same, and the tag count the nodes hand out
        with the key's current version is the new one at once."""
        handle = self.shared.writable(bucket)
        version_id = await self._tagged(handle, key, version_id)
        ticket = self.shared.versions.ticket(handle, key)
        with store_errors(key):
            await handle.store.put_tags(key, tags, version_id)
        try:
            with store_errors(key):
                info: ObjectInfo | None = await handle.store.stat(key)
        except errors.NoSuchKey:
            info = None  # a version named by id, under a delete marker (or deleted meanwhile)
        await self.written(handle, key, info, ticket)

    async def _tagged(self, handle: MountHandle, key: str, version_id: str | None) -> str | None:
        """The version id a tagging request passes to the store: the one named, once the
        store has said it has it (Versions.addressed: NoSuchVersion, a delete marker 405);
        None for the current version. A store that keeps one version has only "null"."""
        if version_id is None:
            return None
        if not handle.store.versions:
            if version_id != "null":
                raise errors.InvalidArgument(
                    "Invalid version id specified", ArgumentName="versionId",
                    ArgumentValue=version_id,
                )  # fmt: skip
            return None
        await self.shared.versions.addressed(handle, key, version_id)
        return version_id
