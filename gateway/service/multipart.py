"""Multipart uploads: the parts go to the under-store's own multipart (S3 multipart, staged
files for file://), the upload's state lives in the metadata tables, so that any node can
list, continue, complete or abort it."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

from gateway import decimals, errors
from gateway.meta import MetaUnavailable, PartRecord, UploadGone, UploadRecord
from gateway.meta.uploads import OWNER as LEASE_OWNER
from gateway.service.inputs import CopySource, UploadsQuery
from gateway.service.namespace import MountHandle
from gateway.service.shared import Reads, Shared
from gateway.service.store_errors import meta_unavailable, store_errors
from gateway.service.writes import (
    ObjectWriter,
    WriteConditions,
    as_stored,
    from_source,
    one_writer,
    precondition_answer,
    resolved,
)
from gateway.stores import ObjectInfo, PartInfo, StoreError, WriteAttrs

log = logging.getLogger(__name__)

MAX_PARTS = 10_000
MAX_PART_SIZE = 5 << 30
MIN_PART_SIZE = 5 << 20  # every part but the last
# Uploads this node completed, kept to answer a retried CompleteMultipartUpload (an SDK sends
# it again when the first answer was lost) with the same result.
_COMPLETED_KEPT = 4096


@dataclass(frozen=True, slots=True)
class UploadListing:
    uploads: list[UploadRecord]
    prefixes: list[str]
    truncated: bool


@dataclass(frozen=True, slots=True)
class PartListing:
    initiated_at: datetime  # of the upload
    parts: list[PartRecord]
    truncated: bool


def check_part_number(value: str | int) -> int:
    number = value if isinstance(value, int) else decimals.parse(value, MAX_PARTS)
    if number is None or not 1 <= number <= MAX_PARTS:
        raise errors.InvalidArgument(
            "Part number must be an integer between 1 and 10000, inclusive",
            ArgumentName="partNumber",
            ArgumentValue=str(value),
        )
    return number


def _attrs_of(record: UploadRecord) -> WriteAttrs:
    return WriteAttrs(**record.attrs)


class Multipart:
    """The multipart operations, and the janitor of what uploads leave behind; `reads` gives
    UploadPartCopy its source, `writer` makes a completed upload the key's new version."""

    def __init__(self, shared: Shared, reads: Reads, writer: ObjectWriter, max_age: float) -> None:
        self.shared = shared
        self.reads = reads
        self.writer = writer
        self.max_age = max_age
        # upload id -> (mount id, key, the parts as listed, the object made)
        self._completed: OrderedDict[str, tuple[int, str, list[tuple[int, str]], ObjectInfo]] = (
            OrderedDict()
        )
        # Completes in progress here: one sent again meanwhile waits for the first's result
        # instead of completing the store's upload a second time.
        self._completing: dict[str, tuple[asyncio.Lock, list[int]]] = {}  # lock, users

    async def create(self, bucket: str, key: str, attrs: WriteAttrs, access_key: str | None) -> str:
        handle = self.shared.writable(bucket)
        attrs = as_stored(attrs)
        with store_errors(key):
            store_id = await handle.store.create_multipart(key, attrs)
        upload_id = secrets.token_urlsafe(32)
        try:
            await self.shared.meta.create_upload(
                upload_id, handle.id, key, store_id, asdict(attrs), access_key
            )
        except MetaUnavailable as exc:
            await self._abort_quietly(handle, key, store_id)
            raise meta_unavailable(exc) from None
        return upload_id

    async def _upload(
        self, bucket: str, key: str, upload_id: str
    ) -> tuple[MountHandle, UploadRecord]:
        handle = self.shared.writable(bucket)
        try:
            record = await self.shared.meta.get_upload(upload_id)
        except MetaUnavailable as exc:
            raise meta_unavailable(exc) from None
        if record is None or record.mount_id != handle.id or record.key != key:
            raise errors.NoSuchUpload(UploadId=upload_id)
        return handle, record

    async def upload_part(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        part_number: int,
        body: AsyncIterator[bytes],
        size: int,
    ) -> PartInfo:
        if size > MAX_PART_SIZE:
            raise errors.EntityTooLarge(MaxSizeAllowed=str(MAX_PART_SIZE))
        handle, record = await self._upload(bucket, key, upload_id)
        with store_errors(key):
            part = await handle.store.upload_part(
                key, record.store_upload_id, part_number, body, size
            )
        try:
            await self.shared.meta.put_part(upload_id, part_number, part.etag, part.size)
        except UploadGone:
            raise errors.NoSuchUpload(UploadId=upload_id) from None
        except MetaUnavailable as exc:
            raise meta_unavailable(exc) from None
        return part

    async def upload_part_copy(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        part_number: int,
        source: CopySource,
    ) -> tuple[ObjectInfo, PartInfo]:
        src_range = source.range

        async def copy_part(src: MountHandle, info: ObjectInfo) -> PartInfo:
            start, end = src_range if src_range is not None else (0, info.size)
            if not 0 <= start < end <= info.size and src_range is not None:
                raise errors.InvalidRange(
                    f"Range specified is not valid for source object of size: {info.size}",
                    RangeRequested=f"bytes={start}-{end - 1}",
                    ActualObjectSize=str(info.size),
                )
            # Overwritten meanwhile, the part is copied again from the new version (a part
            # uploaded again under its number replaces the old one).
            body = await self.reads.open_body(src, info, start, end)
            try:
                return await self.upload_part(
                    bucket, key, upload_id, part_number, body, end - start
                )
            finally:
                await body.aclose()

        return await from_source(self.shared, self.reads, source, copy_part)

    async def all_parts(self, upload_id: str) -> list[PartRecord]:
        parts: list[PartRecord] = []
        while True:
            page = await self.shared.meta.list_parts(
                upload_id, parts[-1].part_number if parts else 0
            )
            parts.extend(page)
            if len(page) < 1000:
                return parts

    async def complete(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        requested: list[tuple[int, str]],
        cond: WriteConditions = WriteConditions(),  # noqa: B008 - frozen, so shared safely
    ) -> ObjectInfo:
        lock, users = self._completing.setdefault(upload_id, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                return await self._complete(bucket, key, upload_id, requested, cond)
        finally:
            users[0] -= 1
            if not users[0]:
                del self._completing[upload_id]

    async def _complete(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        requested: list[tuple[int, str]],
        cond: WriteConditions,
    ) -> ObjectInfo:
        try:
            handle, record = await self._upload(bucket, key, upload_id)
        except errors.NoSuchUpload:
            done = await self._completed_before(bucket, key, upload_id, requested)
            if done is None:
                raise
            return done
        if upload_id in self._completed:
            # Completed here, and its rows left behind (the transaction that removes them
            # failed): a retry gets the first answer, not a second complete at the store.
            done = await self._completed_before(bucket, key, upload_id, requested)
            if done is None:
                raise errors.NoSuchUpload(UploadId=upload_id)
            return done
        if not requested:
            raise errors.MalformedXML("You must specify at least one part.")
        numbers = [n for n, _ in requested]
        if numbers != sorted(numbers) or len(set(numbers)) != len(numbers):
            raise errors.InvalidPartOrder()
        try:
            stored = {p.part_number: p for p in await self.all_parts(upload_id)}
        except MetaUnavailable as exc:
            raise meta_unavailable(exc) from None
        chosen: list[PartInfo] = []
        for number, etag in requested:
            part = stored.get(number)
            if part is None or part.etag.strip('"') != etag.strip().strip('"'):
                raise errors.InvalidPart(PartNumber=str(number), ETag=etag)
            chosen.append(PartInfo(number, part.etag, part.size))
        for small in chosen[:-1]:
            if small.size < MIN_PART_SIZE:
                raise errors.EntityTooSmall(
                    PartNumber=str(small.part_number),
                    ProposedSize=str(small.size),
                    MinSizeAllowed=str(MIN_PART_SIZE),
                )
        conditional = cond.if_match is not None or cond.if_none_match
        try:
            # Every complete of the key, one at a time in the fleet: a conditional one checks
            # against what the others made.
            async with one_writer(self.shared, handle, key, conditional):
                cond = await resolved(handle, key, cond)
                ticket = self.shared.versions.ticket(handle, key)
                with store_errors(key):
                    info = await handle.store.complete_multipart(
                        key,
                        record.store_upload_id,
                        chosen,
                        _attrs_of(record),
                        if_match=cond.if_match,
                        if_none_match=cond.if_none_match,
                    )
        except errors.PreconditionFailed as exc:
            raise await precondition_answer(handle, key, cond, exc) from None
        except (errors.InvalidPart, errors.NoSuchUpload):
            # Completed meanwhile by another worker or node, which took the parts once its
            # object was in place: the answer a retry would get, not an error.
            done = await self._completed_before(bucket, key, upload_id, requested)
            if done is None:
                raise
            return done
        self._completed[upload_id] = (handle.id, key, _listed(requested), info)
        if len(self._completed) > _COMPLETED_KEPT:
            self._completed.popitem(last=False)
        # The upload's rows go in the transaction of the object's own (objects, catalog). If
        # it fails, the object is complete and visible all the same; the upload's rows are left
        # behind, and the janitor removes them once the database answers again.
        removal = self.shared.meta.upload_removal(upload_id)
        await self.writer.written(handle, key, info, ticket, also=[removal])
        return info

    async def _completed_before(
        self, bucket: str, key: str, upload_id: str, requested: list[tuple[int, str]]
    ) -> ObjectInfo | None:
        """The result of an upload already completed, for a retried complete: this node's
        answer if it completed it, else the key's object when its ETag is the one these
        parts make (S3's multipart ETag: any node, after a restart too). None otherwise."""
        handle = self.shared.writable(bucket)
        done = self._completed.get(upload_id)
        if done is not None:
            same = (handle.id, key, _listed(requested))
            return done[3] if done[:3] == same else None
        expected = _multipart_etag([etag for _, etag in requested])
        if expected is None:
            return None
        try:
            with store_errors(key):  # the store's word, not a version trusted for a TTL
                current = await handle.store.stat(key)
        except errors.NoSuchKey:
            return None
        return current if current.etag.strip('"') == expected else None

    async def abort(self, bucket: str, key: str, upload_id: str) -> None:
        handle, record = await self._upload(bucket, key, upload_id)
        with store_errors(key):
            await handle.store.abort_multipart(key, record.store_upload_id)
        try:
            await self.shared.meta.delete_upload(upload_id)
        except MetaUnavailable as exc:
            raise meta_unavailable(exc) from None

    async def list_parts(
        self, bucket: str, key: str, upload_id: str, marker: int, max_parts: int
    ) -> PartListing:
        _, record = await self._upload(bucket, key, upload_id)
        try:
            parts = await self.shared.meta.list_parts(upload_id, marker, max_parts + 1)
        except MetaUnavailable as exc:
            raise meta_unavailable(exc) from None
        return PartListing(record.initiated_at, parts[:max_parts], len(parts) > max_parts)

    async def list_uploads(self, bucket: str, q: UploadsQuery) -> UploadListing:
        handle = self.shared.mount(bucket)
        prefix, delimiter, max_uploads = q.prefix, q.delimiter, q.max_uploads
        key_marker, upload_id_marker = q.key_marker, q.upload_id_marker  # moved as pages come
        uploads: list[UploadRecord] = []
        prefixes: list[str] = []
        truncated = False
        try:
            while len(uploads) + len(prefixes) < max_uploads:
                page = await self.shared.meta.list_uploads(
                    handle.id, prefix, key_marker, upload_id_marker, 1000
                )
                for u in page:
                    key_marker, upload_id_marker = u.key, u.upload_id
                    rolled = _rollup(u.key, prefix, delimiter)
                    if rolled is not None:
                        if prefixes and prefixes[-1] == rolled:
                            continue
                        if len(uploads) + len(prefixes) >= max_uploads:
                            truncated = True
                            break
                        prefixes.append(rolled)
                        # Skip the rest of this common prefix in one step.
                        key_marker, upload_id_marker = rolled + "\U0010ffff", ""
                        continue
                    if len(uploads) + len(prefixes) >= max_uploads:
                        truncated = True
                        break
                    uploads.append(u)
                if truncated or len(page) < 1000:
                    break
        except MetaUnavailable as exc:
            raise meta_unavailable(exc) from None
        return UploadListing(uploads, prefixes, truncated)

    async def clean_stale(self) -> int:
        """Abort uploads older than max_age (abandoned by their clients)."""
        cutoff = datetime.now(UTC) - timedelta(seconds=self.max_age)
        cleaned = 0
        for record in await self.shared.meta.stale_uploads(cutoff):
            handle = self.shared.namespace.by_id(record.mount_id)
            if handle is not None:
                await self._abort_quietly(handle, record.key, record.store_upload_id)
            await self.shared.meta.delete_upload(record.upload_id)
            cleaned += 1
        return cleaned

    async def run_janitor(self, interval: float) -> None:
        """At start and every half write lease: what writers that died left in the stores
        (sweep_leftovers); every `interval`: uploads their clients abandoned (clean_stale)."""
        loop = asyncio.get_running_loop()
        stale_due = loop.time() + interval
        while True:
            try:
                await self.sweep_leftovers()
            except MetaUnavailable as exc:
                log.warning("sweep of leftovers: metadata store unavailable: %s", exc)
            except Exception:
                log.exception("sweep of leftovers failed")
            if loop.time() >= stale_due:
                stale_due = loop.time() + interval
                try:
                    cleaned = await self.clean_stale()
                    if cleaned:
                        log.info("aborted %d abandoned multipart uploads", cleaned)
                except MetaUnavailable as exc:
                    log.warning("multipart janitor: metadata store unavailable: %s", exc)
                except Exception:
                    log.exception("multipart janitor failed")
            await asyncio.sleep(min(interval, self.shared.namespace.write_lease / 2))

    async def sweep_leftovers(self) -> None:
        """Abort the store uploads whose holder's lease ran out, remove the key locks of
        writers that died, and let each store remove the files of writers that died; never
        what a live writer, of any node, holds."""
        lease = self.shared.namespace.write_lease
        for record in await self.shared.meta.claim_lapsed_store_uploads(LEASE_OWNER, lease):
            handle = self.shared.namespace.by_id(record.mount_id)
            if handle is None:
                continue  # not served here: claimed for a lease, left to a node that serves it
            try:
                await handle.store.abort_multipart(record.key, record.store_upload_id)
            except StoreError as exc:
                log.warning("upload %s of %s/%s not aborted yet: %s", record.store_upload_id,
                            handle.bucket, record.key, exc)  # fmt: skip
                continue  # tried again once this janitor's claim runs out
            await self.shared.meta.close_store_upload(record.id)
            log.info("aborted upload %s of %s/%s left by %s, whose lease ran out",
                     record.store_upload_id, handle.bucket, record.key, record.owner)  # fmt: skip
        pruned = await self.shared.meta.key_locks.prune()
        if pruned:
            log.info("removed %d key locks of writers that died", pruned)
        for handle in self.shared.namespace.mounts():
            try:
                swept = await handle.store.sweep()
            except StoreError as exc:
                log.warning("sweep of %s failed: %s", handle.bucket, exc)
                continue
            if swept.files:
                log.info("removed %d files (%d bytes) left in %s by writers that died",
                         swept.files, swept.size, handle.bucket)  # fmt: skip

    @staticmethod
    async def _abort_quietly(handle: MountHandle, key: str, store_id: str) -> None:
        try:
            await handle.store.abort_multipart(key, store_id)
        except Exception as exc:
            log.warning("abort of store upload %s for %s failed: %s", store_id, key, exc)


def _listed(requested: list[tuple[int, str]]) -> list[tuple[int, str]]:
    return [(number, etag.strip().strip('"')) for number, etag in requested]


def _multipart_etag(etags: list[str]) -> str | None:
    """S3's ETag of an object made of parts with these ETags (unquoted), or None when one of
    them is no MD5."""
    try:
        digests = [bytes.fromhex(e.strip().strip('"')) for e in etags]
    except ValueError:
        return None
    if not digests or any(len(d) != 16 for d in digests):
        return None
    md5 = hashlib.md5(b"".join(digests), usedforsecurity=False)
    return f"{md5.hexdigest()}-{len(digests)}"


def _rollup(key: str, prefix: str, delimiter: str | None) -> str | None:
    if not delimiter:
        return None
    cut = key.find(delimiter, len(prefix))
    return None if cut < 0 else key[: cut + len(delimiter)]
