"""Writes of the S3 store: PUTs streamed so that the origin commits only a whole body, native
multipart for large bodies and for the clients' own uploads, server-side copy, buckets."""

from __future__ import annotations

import abc
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import anyio

from gateway.stores.base import (
    ContainerExists,
    ObjectInfo,
    ObjectNotFound,
    PartInfo,
    PreconditionFailed,
    Store,
    StoreAccessDenied,
    StoreError,
    StoreUnavailable,
    UnsupportedKey,
    UploadNotFound,
    VersionChanged,
    WriteAttrs,
)
from gateway.stores.s3_body import (
    StreamedBody,
    answered_at,
    attr_args,
    checksum_args,
    checksums_of,
    drain,
    split,
)

log = logging.getLogger("gateway.stores.s3")

# Bodies above this go up as a multipart upload of PART_SIZE parts: memory holds one part,
# never the body, and a part that fails can be sent again.
MULTIPART_THRESHOLD = 16 << 20
PART_SIZE = 8 << 20
MAX_PARTS = 10000
# The largest source CopyObject takes; larger ones are copied part by part, server-side.
COPY_LIMIT = 5 << 30
COPY_PART_SIZE = 1 << 30


class S3Writes(Store):
    """put, copy, delete and multipart of the S3 store; S3Store provides client and errors."""

    bucket: str
    prefix: str
    _options: Mapping[str, str]
    # The failures of a call to the origin that _write_error turns into our typed errors.
    _failures: tuple[type[Exception], ...]

    @abc.abstractmethod
    async def _s3(self) -> Any: ...

    @abc.abstractmethod
    async def _head(
        self, key: str, if_match: str | None = None, checksums: bool = False
    ) -> dict[str, Any]: ...

    @abc.abstractmethod
    def _write_error(
        self, exc: Exception, key: str, *, conditional: bool = False, container: bool = False
    ) -> StoreError: ...

    @abc.abstractmethod
    def _info(self, key: str, head: Mapping[str, Any]) -> ObjectInfo: ...

    def _object(self, key: str) -> dict[str, Any]:
        if not key:
            raise UnsupportedKey("an object needs a non-empty key")
        return {"Bucket": self.bucket, "Key": self.prefix + key}

    async def _call(self, key: str, op: str, *, conditional: bool = False, **args: Any) -> Any:
        client = await self._s3()
        try:
            return await getattr(client, op)(**args)
        except self._failures as exc:
            raise self._write_error(exc, key, conditional=conditional) from None

    # -- put ---------------------------------------------------------------------------------

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
        where = self._object(key)
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
            r = await self._call(
                key, "put_object", conditional=bool(cond), Body=stream, ContentLength=size, **args
            )
        except Exception:
            if isinstance(stream, StreamedBody) and stream.error is not None:
                raise stream.error from None  # the body's own failure, not the cut it caused
            raise
        return self._written(key, size, r["ETag"], attrs, r, _known_sums(attrs, r))

    def _written(
        self,
        key: str,
        size: int,
        etag: str,
        attrs: WriteAttrs,
        response: Mapping[str, Any],
        checksums: Mapping[str, str],
    ) -> ObjectInfo:
        return ObjectInfo(
            key=key,
            size=size,
            etag=etag,
            last_modified=answered_at(response),
            content_type=attrs.content_type,
            content_encoding=attrs.content_encoding,
            content_disposition=attrs.content_disposition,
            content_language=attrs.content_language,
            cache_control=attrs.cache_control,
            expires=attrs.expires,
            metadata=dict(attrs.metadata),
            checksums=dict(checksums),
        )

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
        try:
            parts: list[PartInfo] = []
            async with contextlib.aclosing(split(body, size, part_size, key)) as pieces:
                async for data in pieces:
                    length = len(data)
                    try:
                        r = await self._call(
                            key,
                            "upload_part",
                            **self._object(key),
                            UploadId=upload_id,
                            PartNumber=len(parts) + 1,
                            Body=data,
                            ContentLength=length,
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
            etag: str | None = (await self._head(key))["ETag"]
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

    async def delete(self, key: str) -> None:
        if key:
            await self._call(key, "delete_object", **self._object(key))

    async def copy(
        self, src_key: str, dst_key: str, attrs: WriteAttrs | None, *, if_match: str | None = None
    ) -> ObjectInfo:
        where = self._object(dst_key)
        # The HEAD gives the size, the source's attributes, and the if_match check on origins
        # that ignore CopySourceIfMatch (moto does); the copy itself is pinned with it too.
        src = self._info(src_key, await self._head(src_key, if_match, checksums=True))
        source = {"Bucket": self.bucket, "Key": self.prefix + src_key}
        pin: dict[str, Any] = {"CopySourceIfMatch": if_match} if if_match is not None else {}
        keep = attrs if attrs is not None else WriteAttrs.of(src)
        if src.size > COPY_LIMIT:
            return await self._copy_parts(src, dst_key, source, keep)
        directive: dict[str, Any] = {"MetadataDirective": "COPY"}
        if attrs is not None:
            directive = {"MetadataDirective": "REPLACE", **attr_args(attrs)}
        try:
            r = await self._call(
                src_key, "copy_object", **where, CopySource=source, **pin, **directive
            )
        except PreconditionFailed:
            raise VersionChanged(f"{src_key}: is no longer {if_match}") from None
        result = r["CopyObjectResult"]
        # The bytes are the source's, so are their full-object checksums.
        return self._written(dst_key, src.size, result["ETag"], keep, r, src.checksums)

    async def _copy_parts(
        self, src: ObjectInfo, dst_key: str, source: dict[str, str], attrs: WriteAttrs
    ) -> ObjectInfo:
        part_size = max(COPY_PART_SIZE, -(-src.size // MAX_PARTS))
        upload_id = await self.create_multipart(dst_key, attrs)
        try:
            parts: list[PartInfo] = []
            for start in range(0, src.size, part_size):
                end = min(start + part_size, src.size)
                r = await self._call(
                    src.key,
                    "upload_part_copy",
                    **self._object(dst_key),
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
        r = await self._call(
            key, "create_multipart_upload", **self._object(key), **attr_args(attrs)
        )
        return str(r["UploadId"])

    async def upload_part(
        self, key: str, upload_id: str, part_number: int, body: AsyncIterator[bytes], size: int
    ) -> PartInfo:
        where = self._object(key)
        stream: StreamedBody | bytes = b""
        if size == 0:
            await drain(body, size, key)
        else:
            stream = StreamedBody(body, size, key)
        try:
            r = await self._call(
                key,
                "upload_part",
                **where,
                UploadId=upload_id,
                PartNumber=part_number,
                Body=stream,
                ContentLength=size,
            )
        except Exception as exc:
            if isinstance(stream, StreamedBody) and stream.error is not None:
                raise stream.error from None
            if isinstance(exc, StoreUnavailable):
                await self._known_upload(key, upload_id)
            raise
        return PartInfo(part_number, r["ETag"], size)

    async def _known_upload(self, key: str, upload_id: str) -> None:
        """UploadNotFound if the origin knows no such upload. moto answers 500, not
        NoSuchUpload, to parts and completions of unknown uploads; ask it plainly."""
        try:
            await self._call(key, "list_parts", **self._object(key), UploadId=upload_id, MaxParts=1)
        except UploadNotFound:
            raise
        except StoreError:
            pass  # no better answer than the first one

    async def complete_multipart(
        self, key: str, upload_id: str, parts: Sequence[PartInfo], attrs: WriteAttrs
    ) -> ObjectInfo:
        try:
            return await self._complete(key, upload_id, parts, attrs, {})
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
        r = await self._call(
            key,
            "complete_multipart_upload",
            conditional=bool(cond),
            **self._object(key),
            UploadId=upload_id,
            MultipartUpload={"Parts": listed},
            **cond,
        )
        size = sum(p.size for p in parts)
        return self._written(key, size, r["ETag"], attrs, r, _known_sums(attrs, r))

    async def abort_multipart(self, key: str, upload_id: str) -> None:
        with contextlib.suppress(UploadNotFound):
            await self._call(key, "abort_multipart_upload", **self._object(key), UploadId=upload_id)

    # -- the bucket itself -------------------------------------------------------------------

    async def create_container(self) -> None:
        """Create the bucket; ContainerExists if it is there, whoever owns it."""
        if self.prefix:
            raise ValueError(f"a bucket URI names no prefix: s3://{self.bucket}")
        try:
            await self._call("", "head_bucket", Bucket=self.bucket)
        except ObjectNotFound:
            pass
        except StoreAccessDenied:
            raise ContainerExists(f"bucket {self.bucket!r} exists (not ours)") from None
        else:
            # Checked first: us-east-1 answers 200 to creating a bucket one owns already.
            raise ContainerExists(f"bucket {self.bucket!r} exists")
        args: dict[str, Any] = {"Bucket": self.bucket}
        region = self._options.get("region")
        if region and region != "us-east-1":
            args["CreateBucketConfiguration"] = {"LocationConstraint": region}
        client = await self._s3()
        try:
            await client.create_bucket(**args)
        except self._failures as exc:
            raise self._write_error(exc, "", container=True) from None

    async def delete_container(self) -> None:
        if self.prefix:
            raise ValueError(f"a bucket URI names no prefix: s3://{self.bucket}")
        client = await self._s3()
        try:
            await client.delete_bucket(Bucket=self.bucket)
        except self._failures as exc:
            raise self._write_error(exc, "", container=True) from None


def _conditions(if_match: str | None, if_none_match: bool) -> dict[str, Any]:
    cond: dict[str, Any] = {"IfMatch": if_match} if if_match is not None else {}
    return {**cond, "IfNoneMatch": "*"} if if_none_match else cond


def _known_sums(attrs: WriteAttrs, response: Mapping[str, Any]) -> dict[str, str]:
    """The full-object checksums known once the body has gone: the writer's (verified, and
    complete only now when they came in a trailer) and those the origin kept."""
    return {**dict(attrs.checksums), **checksums_of(response)}
