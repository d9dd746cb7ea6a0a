"""Multipart uploads: the parts go to the under-store's own multipart (S3 multipart, staged
files for file://), the upload's state lives in the metadata tables, so that any node can
list, continue, complete or abort it."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from gateway import errors
from gateway.meta import MetaUnavailable, PartRecord, UploadGone, UploadRecord
from gateway.service.conditions import Conditions, check_conditions
from gateway.service.namespace import MountHandle
from gateway.service.store_errors import store_errors
from gateway.stores import ObjectInfo, PartInfo, WriteAttrs

if TYPE_CHECKING:
    from gateway.service.gateway import Gateway

log = logging.getLogger("gateway.multipart")

MAX_PARTS = 10_000
MAX_PART_SIZE = 5 << 30
MIN_PART_SIZE = 5 << 20  # every part but the last


@dataclass(frozen=True, slots=True)
class UploadListing:
    uploads: list[UploadRecord]
    prefixes: list[str]
    truncated: bool


def check_part_number(value: str | int) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not 1 <= number <= MAX_PARTS:
        raise errors.InvalidArgument(
            "Part number must be an integer between 1 and 10000, inclusive",
            ArgumentName="partNumber",
            ArgumentValue=str(value),
        )
    return number


def _attrs_of(record: UploadRecord) -> WriteAttrs:
    return WriteAttrs(**record.attrs)


def _unavailable(exc: MetaUnavailable) -> errors.S3Error:
    return errors.ServiceUnavailable(f"The metadata store is unavailable: {exc}")


class Multipart:
    def __init__(self, gateway: Gateway, max_age: float) -> None:
        self.gw = gateway
        self.max_age = max_age

    async def create(self, bucket: str, key: str, attrs: WriteAttrs, access_key: str | None) -> str:
        handle = self.gw.writer.writable(bucket)
        with store_errors(key):
            store_id = await handle.store.create_multipart(key, attrs)
        upload_id = secrets.token_urlsafe(32)
        try:
            await self.gw.meta.create_upload(
                upload_id, handle.id, key, store_id, asdict(attrs), access_key
            )
        except MetaUnavailable as exc:
            await self._abort_quietly(handle, key, store_id)
            raise _unavailable(exc) from None
        return upload_id

    async def _upload(
        self, bucket: str, key: str, upload_id: str
    ) -> tuple[MountHandle, UploadRecord]:
        handle = self.gw.writer.writable(bucket)
        try:
            record = await self.gw.meta.get_upload(upload_id)
        except MetaUnavailable as exc:
            raise _unavailable(exc) from None
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
            await self.gw.meta.put_part(upload_id, part_number, part.etag, part.size)
        except UploadGone:
            raise errors.NoSuchUpload(UploadId=upload_id) from None
        except MetaUnavailable as exc:
            raise _unavailable(exc) from None
        return part

    async def upload_part_copy(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        part_number: int,
        src_bucket: str,
        src_key: str,
        src_range: tuple[int, int] | None,
        src_cond: Conditions,
    ) -> tuple[ObjectInfo, PartInfo]:
        src = self.gw.mount(src_bucket)
        info = await self.gw.stat(src, src_key)
        try:
            check_conditions(src_cond, info)
        except errors.NotModified:
            raise errors.PreconditionFailed(Condition="x-amz-copy-source-if-none-match") from None
        start, end = src_range if src_range is not None else (0, info.size)
        if not 0 <= start < end <= info.size and src_range is not None:
            raise errors.InvalidArgument(
                f"Range specified is not valid for source object of size: {info.size}",
                ArgumentName="x-amz-copy-source-range",
            )
        body = await self.gw.open_body(src, info, start, end)
        try:
            part = await self.upload_part(bucket, key, upload_id, part_number, body, end - start)
        finally:
            await body.aclose()
        return info, part

    async def all_parts(self, upload_id: str) -> list[PartRecord]:
        parts: list[PartRecord] = []
        while True:
            page = await self.gw.meta.list_parts(upload_id, parts[-1].part_number if parts else 0)
            parts.extend(page)
            if len(page) < 1000:
                return parts

    async def complete(
        self, bucket: str, key: str, upload_id: str, requested: list[tuple[int, str]]
    ) -> ObjectInfo:
        handle, record = await self._upload(bucket, key, upload_id)
        if not requested:
            raise errors.MalformedXML("You must specify at least one part.")
        numbers = [n for n, _ in requested]
        if numbers != sorted(numbers) or len(set(numbers)) != len(numbers):
            raise errors.InvalidPartOrder()
        try:
            stored = {p.part_number: p for p in await self.all_parts(upload_id)}
        except MetaUnavailable as exc:
            raise _unavailable(exc) from None
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
        with store_errors(key):
            info = await handle.store.complete_multipart(
                key, record.store_upload_id, chosen, _attrs_of(record)
            )
        await self.gw.writer.written(handle, key, info)
        try:
            await self.gw.meta.delete_upload(upload_id)
        except MetaUnavailable as exc:
            # The object is complete and visible; only the bookkeeping is left behind, and the
            # janitor removes it once the database answers again.
            log.warning("completed upload %s not yet forgotten: %s", upload_id, exc)
        return info

    async def abort(self, bucket: str, key: str, upload_id: str) -> None:
        handle, record = await self._upload(bucket, key, upload_id)
        with store_errors(key):
            await handle.store.abort_multipart(key, record.store_upload_id)
        try:
            await self.gw.meta.delete_upload(upload_id)
        except MetaUnavailable as exc:
            raise _unavailable(exc) from None

    async def list_parts(
        self, bucket: str, key: str, upload_id: str, marker: int, max_parts: int
    ) -> tuple[UploadRecord, list[PartRecord], bool]:
        _, record = await self._upload(bucket, key, upload_id)
        try:
            parts = await self.gw.meta.list_parts(upload_id, marker, max_parts + 1)
        except MetaUnavailable as exc:
            raise _unavailable(exc) from None
        return record, parts[:max_parts], len(parts) > max_parts

    async def list_uploads(
        self,
        bucket: str,
        prefix: str,
        delimiter: str | None,
        key_marker: str,
        upload_id_marker: str,
        max_uploads: int,
    ) -> UploadListing:
        handle = self.gw.mount(bucket)
        uploads: list[UploadRecord] = []
        prefixes: list[str] = []
        truncated = False
        try:
            while len(uploads) + len(prefixes) < max_uploads:
                page = await self.gw.meta.list_uploads(
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
            raise _unavailable(exc) from None
        return UploadListing(uploads, prefixes, truncated)

    async def clean_stale(self) -> int:
        """Abort uploads older than max_age (abandoned by their clients)."""
        cutoff = datetime.now(UTC) - timedelta(seconds=self.max_age)
        cleaned = 0
        for record in await self.gw.meta.stale_uploads(cutoff):
            handle = next((h for h in self.gw.list_buckets() if h.id == record.mount_id), None)
            if handle is not None:
                await self._abort_quietly(handle, record.key, record.store_upload_id)
            await self.gw.meta.delete_upload(record.upload_id)
            cleaned += 1
        return cleaned

    async def run_janitor(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                cleaned = await self.clean_stale()
                if cleaned:
                    log.info("aborted %d abandoned multipart uploads", cleaned)
            except MetaUnavailable as exc:
                log.warning("multipart janitor: metadata store unavailable: %s", exc)
            except Exception:
                log.exception("multipart janitor failed")

    @staticmethod
    async def _abort_quietly(handle: MountHandle, key: str, store_id: str) -> None:
        try:
            await handle.store.abort_multipart(key, store_id)
        except Exception as exc:
            log.warning("abort of store upload %s for %s failed: %s", store_id, key, exc)


def _rollup(key: str, prefix: str, delimiter: str | None) -> str | None:
    if not delimiter:
        return None
    cut = key.find(delimiter, len(prefix))
    return None if cut < 0 else key[: cut + len(delimiter)]
