"""Writes of the S3 store: PUTs streamed so that the origin commits only a whole body, native
multipart for large bodies and for the clients' own uploads, server-side copy, buckets."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import anyio

from gateway.stores.base import (
    ContainerExists,
    NoJournal,
    ObjectInfo,
    ObjectNotFound,
    PartInfo,
    PreconditionFailed,
    StoreAccessDenied,
    StoreError,
    StoreUnavailable,
    UploadJournal,
    UploadNotFound,
    VersionChanged,
    VersionDeleted,
    WriteAttrs,
)
from gateway.stores.bodies import REPLAY_LIMIT, StreamedBody, drain, split
from gateway.stores.s3.client import S3Client
from gateway.stores.s3.fields import (
    answered_at,
    attr_args,
    checksum_args,
    checksums_of,
    encryption_args,
    info_of,
)

log = logging.getLogger(__name__)

# Bodies above this go up as a multipart upload of PART_SIZE parts: memory holds one part,
# never the body, and a part that fails can be sent again. Up to it, a body goes in one
# request, all of it kept to be sent again.
MULTIPART_THRESHOLD = REPLAY_LIMIT
PART_SIZE = 8 << 20
MAX_PARTS = 10000
# The largest source CopyObject takes; larger ones are copied part by part, server-side.
COPY_LIMIT = 5 << 30
COPY_PART_SIZE = 1 << 30


class Writes:
    """put, copy, delete, multipart uploads and buckets of the S3 store, over its client.

    `journal` records the uploads that large puts and copies open on their own behalf (the
    store's, set by the node that serves it)."""

    def __init__(self, client: S3Client) -> None:
        self.client = client
        self.journal: UploadJournal = NoJournal()
        self._warned_no_etag = False

    async def put(
        self,
        key: str,
        body: AsyncIterator[bytes],
        size: int,
        attrs: WriteAttrs,
        *,
        if_match: str | None = None,
        if_none_match: bool = False,
    ) -> ObjectInfo:
        where = self.client.object_args(key)
        cond = _conditions(if_match, if_none_match)
        if size > MULTIPART_THRESHOLD:
            return await self._put_parts(key, body, size, attrs, cond)
        stream: StreamedBody | bytes = b""
        if size == 0:
            await drain(body, size, key)
        else:
            stream = StreamedBody(body, size, key)
        args = {**where, **attr_args(attrs), **checksum_args(attrs.checksums), **cond}
        try:
            r = await self.client.call(
                key, "put_object", conditional=bool(cond), Body=stream, ContentLength=size, **args
            )
        except Exception:
            if isinstance(stream, StreamedBody):
                if stream.error is not None:
                    raise stream.error from None  # the body's own failure, not the cut it caused
                if stream.refused_replay:
                    raise stream.replay_failure(self.client.where(key)) from None
            raise
        return await self._written(key, size, r.get("ETag"), attrs, r, _known_sums(attrs, r))

    async def _written(
        self,
        key: str,
        size: int,
        etag: str | None,
        attrs: WriteAttrs,
        response: Mapping[str, Any],
        checksums: Mapping[str, str],
    ) -> ObjectInfo:
        """The new version, as the origin's reply to the write gives it; from a HEAD where the
        reply has no ETag (Ceph RGW 16.2 answers CompleteMultipartUpload with an empty one):
        a version the origin did not give is never recorded, nor matched against If-Match."""
        if not etag or not etag.strip('"'):
            return await self._version_of(key)
        written = replace(attrs, checksums=checksums)
        info = written.info(key, size, etag, answered_at(response))
        # A versioned origin names the version it made: the writer's client is told it.
        version = response.get("VersionId")
        return replace(info, store_version=str(version)) if version else info

    async def _version_of(self, key: str) -> ObjectInfo:
        if not self._warned_no_etag:
            self._warned_no_etag = True
            log.warning(
                "%s: the origin answers writes without an ETag; asking it (HEAD)", self.client
            )
        info = info_of(key, await self.client.head(key, checksums=True))
        if not info.etag.strip('"'):
            raise StoreError(f"{self.client.where(key)}: the origin gives the object no ETag")
        return info

    async def _put_parts(
        self,
        key: str,
        body: AsyncIterator[bytes],
        size: int,
        attrs: WriteAttrs,
        cond: dict[str, Any],
    ) -> ObjectInfo:
        if cond:
            # Before the upload, not only at its completion: a doomed body is not sent.
            await self._precheck(key, cond)
        part_size = max(PART_SIZE, -(-size // MAX_PARTS))
        upload_id = await self.create_multipart(key, attrs)
        async with self.journal.holding(key, upload_id):
            return await self._send_parts(key, upload_id, body, size, part_size, attrs, cond)

    async def _send_parts(
        self,
        key: str,
        upload_id: str,
        body: AsyncIterator[bytes],
        size: int,
        part_size: int,
        attrs: WriteAttrs,
        cond: dict[str, Any],
    ) -> ObjectInfo:
        try:
            parts: list[PartInfo] = []
            async with contextlib.aclosing(split(body, size, part_size, key)) as pieces:
                async for data in pieces:
                    length = len(data)
                    try:
                        r = await self.client.call(
                            key,
                            "upload_part",
                            **self.client.object_args(key),
                            UploadId=upload_id,
                            PartNumber=len(parts) + 1,
                            Body=data,
                            ContentLength=length,
                            **_part_key(attrs),
                        )
                    finally:
                        data.release()  # the next part is gathered now: one in memory, not two
                    parts.append(PartInfo(len(parts) + 1, r["ETag"], length))
            return await self._complete(key, upload_id, parts, attrs, cond)
        except BaseException:
            await self._abort_quietly(key, upload_id)
            raise

    async def _precheck(self, key: str, cond: Mapping[str, str]) -> None:
        try:
            etag: str | None = (await self.client.head(key))["ETag"]
        except ObjectNotFound:
            etag = None
        if "IfNoneMatch" in cond and etag is not None:
            raise PreconditionFailed(f"{key} exists")
        if "IfMatch" in cond and (etag is None or etag.strip('"') != cond["IfMatch"].strip('"')):
            raise PreconditionFailed(f"{key} is {etag or 'missing'}, not {cond['IfMatch']}")

    async def _abort_quietly(self, key: str, upload_id: str) -> None:
        # Shielded: the write was cancelled or failed, and its parts must not linger (cost).
        with anyio.CancelScope(shield=True), anyio.move_on_after(30):
            try:
                await self.abort_multipart(key, upload_id)
            except StoreError as exc:
                log.warning("upload %s of %s not aborted: %s", upload_id, key, exc)

    # -- delete and copy ---------------------------------------------------------------------

    async def delete(self, key: str) -> VersionDeleted | None:
        if not key:
            return None
        r = await self.client.call(key, "delete_object", **self.client.object_args(key))
        # A versioned bucket keeps the object and makes a delete marker, which it names.
        if r.get("DeleteMarker") or r.get("VersionId"):
            return VersionDeleted(r.get("VersionId") or None, bool(r.get("DeleteMarker")))
        return None

    async def copy(
        self,
        src_key: str,
        dst_key: str,
        attrs: WriteAttrs | None,
        *,
        if_match: str | None = None,
        version_id: str | None = None,
    ) -> ObjectInfo:
        where = self.client.object_args(dst_key)
        # The HEAD gives the size, the source's attributes, and the if_match check on origins
        # that ignore CopySourceIfMatch (moto does); the copy itself is pinned with it too.
        head = await self.client.head(src_key, if_match, checksums=True, version_id=version_id)
        src = info_of(src_key, head)
        source = {"Bucket": self.client.bucket, "Key": self.client.prefix + src_key}
        if version_id is not None:
            source["VersionId"] = version_id
        pin: dict[str, Any] = {"CopySourceIfMatch": if_match} if if_match is not None else {}
        keep = attrs if attrs is not None else WriteAttrs.of(src)
        if src.size > COPY_LIMIT:
            return await self._copy_parts(src, dst_key, source, keep)
        directive: dict[str, Any] = {"MetadataDirective": "COPY"}
        if attrs is not None:
            # The tags with the other attributes: those given (none for none).
            directive = {
                "MetadataDirective": "REPLACE", "TaggingDirective": "REPLACE", **attr_args(attrs)
            }  # fmt: skip
        try:
            r = await self.client.call(
                src_key, "copy_object", **where, CopySource=source, **pin, **directive
            )
        except PreconditionFailed:
            raise VersionChanged(f"{src_key}: is no longer {if_match}") from None
        result = r.get("CopyObjectResult") or {}
        # The bytes are the source's, so are their full-object checksums.
        return await self._written(dst_key, src.size, result.get("ETag"), keep, r, src.checksums)

    async def _copy_parts(
        self,
        src: ObjectInfo,
        dst_key: str,
        source: dict[str, str],
        attrs: WriteAttrs,
    ) -> ObjectInfo:
        part_size = max(COPY_PART_SIZE, -(-src.size // MAX_PARTS))
        upload_id = await self.create_multipart(dst_key, attrs)
        async with self.journal.holding(dst_key, upload_id):
            return await self._copy_part_by_part(src, dst_key, source, attrs, upload_id, part_size)

    async def _copy_part_by_part(
        self,
        src: ObjectInfo,
        dst_key: str,
        source: dict[str, str],
        attrs: WriteAttrs,
        upload_id: str,
        part_size: int,
    ) -> ObjectInfo:
        try:
            parts: list[PartInfo] = []
            for start in range(0, src.size, part_size):
                end = min(start + part_size, src.size)
                r = await self.client.call(
                    src.key,
                    "upload_part_copy",
                    **self.client.object_args(dst_key),
                    UploadId=upload_id,
                    PartNumber=len(parts) + 1,
                    CopySource=source,
                    CopySourceIfMatch=src.etag,  # every part of the same version
                    CopySourceRange=f"bytes={start}-{end - 1}",
                )
                parts.append(PartInfo(len(parts) + 1, r["CopyPartResult"]["ETag"], end - start))
            return await self._complete(dst_key, upload_id, parts, attrs, {})
        except PreconditionFailed:
            await self._abort_quietly(dst_key, upload_id)
            raise VersionChanged(f"{src.key}: changed while being copied") from None
        except BaseException:
            await self._abort_quietly(dst_key, upload_id)
            raise

    # -- multipart ---------------------------------------------------------------------------

    async def create_multipart(self, key: str, attrs: WriteAttrs) -> str:
        r = await self.client.call(
            key, "create_multipart_upload", **self.client.object_args(key), **attr_args(attrs)
        )
        return str(r["UploadId"])

    async def upload_part(
        self, key: str, upload_id: str, part_number: int, body: AsyncIterator[bytes], size: int
    ) -> PartInfo:
        where = self.client.object_args(key)
        stream: StreamedBody | bytes = b""
        if size == 0:
            await drain(body, size, key)
        else:
            stream = StreamedBody(body, size, key)
        try:
            r = await self.client.call(
                key,
                "upload_part",
                **where,
                UploadId=upload_id,
                PartNumber=part_number,
                Body=stream,
                ContentLength=size,
            )
        except Exception as exc:
            if isinstance(stream, StreamedBody):
                if stream.error is not None:
                    raise stream.error from None
                if stream.refused_replay:
                    raise stream.replay_failure(self.client.where(key)) from None
            if isinstance(exc, StoreUnavailable):
                await self._known_upload(key, upload_id)
            raise
        return PartInfo(part_number, r["ETag"], size)

    async def _known_upload(self, key: str, upload_id: str) -> None:
        """UploadNotFound if the origin knows no such upload. moto answers 500, not
        NoSuchUpload, to parts and completions of unknown uploads; ask it plainly."""
        try:
            await self.client.call(
                key, "list_parts", **self.client.object_args(key), UploadId=upload_id, MaxParts=1
            )
        except UploadNotFound:
            raise
        except StoreError:
            pass  # no better answer than the first one

    async def complete_multipart(
        self,
        key: str,
        upload_id: str,
        parts: Sequence[PartInfo],
        attrs: WriteAttrs,
        *,
        if_match: str | None = None,
        if_none_match: bool = False,
    ) -> ObjectInfo:
        try:
            # S3's own conditional complete, atomic at the store; checked first too, for
            # S3 servers that ignore the headers on a complete (moto).
            cond: dict[str, Any] = {}
            if if_match is not None:
                cond["IfMatch"] = if_match
            if if_none_match:
                cond["IfNoneMatch"] = "*"
            if cond:
                await self._precheck(key, cond)
            return await self._complete(key, upload_id, parts, attrs, cond)
        except StoreUnavailable:
            await self._known_upload(key, upload_id)
            raise

    async def _complete(
        self,
        key: str,
        upload_id: str,
        parts: Sequence[PartInfo],
        attrs: WriteAttrs,
        cond: dict[str, Any],
    ) -> ObjectInfo:
        listed = [{"PartNumber": p.part_number, "ETag": p.etag} for p in parts]
        r = await self.client.call(
            key,
            "complete_multipart_upload",
            conditional=bool(cond),
            **self.client.object_args(key),
            UploadId=upload_id,
            MultipartUpload={"Parts": listed},
            **cond,
        )
        size = sum(p.size for p in parts)
        return await self._written(key, size, r.get("ETag"), attrs, r, _known_sums(attrs, r))

    async def abort_multipart(self, key: str, upload_id: str) -> None:
        with contextlib.suppress(UploadNotFound):
            await self.client.call(
                key, "abort_multipart_upload", **self.client.object_args(key), UploadId=upload_id
            )

    # -- the bucket itself -------------------------------------------------------------------

    async def create_container(self) -> None:
        """Create the bucket; ContainerExists if it is there, whoever owns it."""
        if self.client.prefix:
            raise ValueError(f"a bucket URI names no prefix: s3://{self.client.bucket}")
        try:
            await self.client.call("", "head_bucket", Bucket=self.client.bucket)
        except ObjectNotFound:
            pass
        except StoreAccessDenied:
            raise ContainerExists(f"bucket {self.client.bucket!r} exists (not ours)") from None
        else:
            # Checked first: us-east-1 answers 200 to creating a bucket one owns already.
            raise ContainerExists(f"bucket {self.client.bucket!r} exists")
        args: dict[str, Any] = {"Bucket": self.client.bucket}
        region = self.client.options.get("region")
        if region and region != "us-east-1":
            args["CreateBucketConfiguration"] = {"LocationConstraint": region}
        client = await self.client.botocore()
        try:
            await client.create_bucket(**args)
        except self.client.failures as exc:
            raise self.client.write_error(exc, "", container=True) from None

    async def delete_container(self) -> None:
        if self.client.prefix:
            raise ValueError(f"a bucket URI names no prefix: s3://{self.client.bucket}")
        client = await self.client.botocore()
        try:
            await client.delete_bucket(Bucket=self.client.bucket)
        except self.client.failures as exc:
            raise self.client.write_error(exc, "", container=True) from None


def _conditions(if_match: str | None, if_none_match: bool) -> dict[str, Any]:
    cond: dict[str, Any] = {"IfMatch": if_match} if if_match is not None else {}
    return {**cond, "IfNoneMatch": "*"} if if_none_match else cond


def _known_sums(attrs: WriteAttrs, response: Mapping[str, Any]) -> dict[str, str]:
    """The full-object checksums known once the body has gone: the writer's (verified, and
    complete only now when they came in a trailer) and those the origin kept."""
    return {**dict(attrs.checksums), **checksums_of(response)}


def _part_key(attrs: WriteAttrs) -> dict[str, Any]:
    """An SSE-C key goes with every part of the upload (S3 requires it), nothing else does."""
    if "customer_key" not in attrs.encryption:
        return {}
    return encryption_args({k: v for k, v in attrs.encryption.items() if k.startswith("customer")})
