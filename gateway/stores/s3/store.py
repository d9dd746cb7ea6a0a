"""The `s3://bucket[/prefix]` under-store: any S3-compatible origin; its reads through the
store's one transport (transport.py), the rest through aiobotocore (client.py, writes.py)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncGenerator, Mapping
from typing import Any
from urllib.parse import SplitResult, unquote

from botocore.exceptions import ClientError

from gateway.stores import base as store_base
from gateway.stores.base import (
    Answered,
    InvalidVersionId,
    ListPage,
    ListRequest,
    ObjectInfo,
    ObjectNotFound,
    StoreAccessDenied,
    StoreError,
    StoreRejected,
    UploadJournal,
    VersionChanged,
    VersionDeleted,
    VersionEntry,
    VersionsPage,
    WriteAttrs,
    check_answer,
    kept,
)
from gateway.stores.delegating import DelegatingStore
from gateway.stores.etags import quoted
from gateway.stores.s3.client import S3Client, parse_timestamp, status_of
from gateway.stores.s3.errors import RangeNotSatisfiable
from gateway.stores.s3.fields import CUSTOMER_KEY_MARK, customer_key_headers, info_of, utc
from gateway.stores.s3.listings import NotAListing, list_page, list_query
from gateway.stores.s3.transport import CHUNK_SIZE, Request, Transport
from gateway.stores.s3.writes import Writes

log = logging.getLogger(__name__)

__all__ = ["CHUNK_SIZE", "S3Store", "open_s3", "parse_timestamp"]

# partNumber of an object in more parts than this is not answered (a HEAD per part).
MAX_PARTS_ASKED = 1000


class S3Store(DelegatingStore):
    """Objects under `prefix` in one bucket of an S3-compatible origin.

    A mount prefix names a folder: 's3://b/pre/fix' holds 'pre/fix/<key>', never 'pre/fixture'.
    """

    scheme = "s3"
    encrypts = True
    writes: Writes

    def __init__(self, bucket: str, prefix: str = "", options: Mapping[str, str] | None = None):
        self.client = S3Client(bucket, prefix, options)
        self.bucket, self.prefix = self.client.bucket, self.client.prefix
        self.writes = self.uploads = Writes(self.client)
        # What the origin was seen to ignore: If-Match (it answered another version's bytes)
        # or Range (it answered a ranged GET with the whole object). Its answers are checked
        # either way (check_answer); these say so once in the log.
        self.ignores_if_match = False
        self.ignores_range = False
        # The origin refuses VersionId=null, and its bucket was never versioned: "null" is the
        # key's current version (see _null_is_current).
        self.null_is_current = False
        self._ever_versioned = False  # its bucket was seen versioned (get_versioning)

    def __repr__(self) -> str:
        return repr(self.client)

    @property
    def journal(self) -> UploadJournal:
        """The writes' journal: large puts and copies record the uploads they open there."""
        return self.writes.journal

    @journal.setter
    def journal(self, journal: UploadJournal) -> None:
        self.writes.journal = journal

    async def prepare(self) -> None:
        await self.client.prepare()

    async def close(self) -> None:
        await self.client.close()

    # The botocore client, the reads' transport and an answer's info, as tests look at them.
    async def _s3(self) -> Any:
        return await self.client.botocore()

    @property
    def _transport(self) -> Transport | None:
        return self.client.transport

    @staticmethod
    def _info(key: str, h: Mapping[str, Any]) -> ObjectInfo:
        return info_of(key, h)

    # -- reads -------------------------------------------------------------------------------

    async def stat(self, key: str) -> ObjectInfo:
        return _keyless(info_of(key, await self.client.head(key, checksums=True)))

    async def read(
        self, key: str, start: int = 0, end: int | None = None, if_match: str | None = None
    ) -> AsyncGenerator[bytes, None]:
        if end is not None and end <= start:
            # No bytes to send, but a missing key or a changed version must still be reported.
            await self.client.head(key, if_match)
            return
        async with contextlib.aclosing(self._get(key, start, end, if_match)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def _get(
        self,
        key: str,
        start: int,
        end: int | None,
        if_match: str | None,
        version_id: str | None = None,
        customer_key: Mapping[str, str] | None = None,
    ) -> AsyncGenerator[bytes, None]:
        """GET of bytes [start, end) (of version `version_id`; with an SSE-C key's headers),
        its answer checked."""
        if not key:
            raise ObjectNotFound(key)
        headers = dict(customer_key or {})
        # No Range for the whole object: S3 answers 416 to any range of an empty one.
        ranged = start > 0 or end is not None
        if ranged:
            headers["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        if if_match is not None:
            headers["If-Match"] = if_match
        query = () if version_id is None else (("versionId", version_id),)
        try:
            reply = await self.client.read(Request("GET", key, query, tuple(headers.items())))
        except RangeNotSatisfiable:
            return  # the range starts at or past the end: [start, end) is empty
        response, body = reply.fields, reply.body
        if version_id is not None:
            try:
                _check_version(key, version_id, response.get("VersionId"))
            except StoreError:
                await _drop(body)
                raise
        answered = await self._checked(key, response, body, start, end, ranged, if_match)
        async with contextlib.aclosing(kept(body, answered, self.scheme)) as chunks:
            if customer_key is None and CUSTOMER_KEY_MARK in response["Metadata"]:
                raise StoreRejected(f"{key}: encrypted with a customer key; the key is needed")
            async for chunk in chunks:
                yield chunk

    async def _null_is_current(self, version_id: str) -> bool:
        """Whether a refusal of VersionId=null means the key's current version: the origin
        refuses the id (moto does; S3 answers with the current object) and its bucket was never
        versioned, so that its one version of each key is the null one. Learnt once."""
        if version_id != "null":
            return False
        if await self.get_versioning() is None:
            self.null_is_current = True
        return self.null_is_current

    async def _checked(
        self, key: str, response: Mapping[str, Any], body: AsyncGenerator[bytes, None],
        start: int, end: int | None, ranged: bool, if_match: str | None,
    ) -> Answered:  # fmt: skip
        """The answer checked against the version and range asked for (check_answer); on a
        mismatch its body is dropped and the error raised, no byte of it used."""
        try:
            answered = check_answer(
                key, start, end, ranged, if_match, response.get("ETag"),
                response.get("ContentRange"), _length(response),
            )  # fmt: skip
        except VersionChanged:
            await _drop(body)
            store_base.answer_report(self.scheme, 0, True)
            if not self.ignores_if_match:
                self.ignores_if_match = True
                log.warning("%r ignores If-Match: its answers are checked by their ETag", self)
            raise
        except Exception:
            await _drop(body)
            raise
        if ranged and not response.get("ContentRange") and not self.ignores_range:
            self.ignores_range = True
            log.warning("%r answers ranged GETs whole: the bytes around a range are dropped", self)
        return answered

    async def open(
        self, key: str, length: int | None = None
    ) -> tuple[ObjectInfo, AsyncGenerator[bytes, None]]:
        if not key:
            raise ObjectNotFound(key)
        headers: tuple[tuple[str, str], ...] = ()
        if length is not None:
            # A range answers with Content-Range: bytes 0-N/TOTAL, so one request still tells
            # the whole object's size along with its first block.
            headers = (("Range", f"bytes=0-{max(length, 1) - 1}"),)
        try:
            reply = await self.client.read(Request("GET", key, (), headers))
        except RangeNotSatisfiable:
            if length is not None:
                # Any range of an empty object is unsatisfiable: it has no bytes to send.
                info = await self.stat(key)
                if info.size == 0:
                    return info, _no_bytes()
            raise
        response, body = reply.fields, reply.body
        info = info_of(key, response)
        if "customer_key_md5" in info.encryption:
            await _drop(body)  # the answer's connection goes back
            _keyless(info)
        answered = Answered()
        if length is not None:
            answered = await self._checked(key, response, body, 0, length, True, None)
        total = _total_size(response.get("ContentRange"))
        if total is not None:
            info = dataclasses.replace(info, size=total)
        return info, kept(body, answered, self.scheme)

    # -- versions: the origin's own (a bucket versioning was enabled on) -------------------

    versions = True

    async def stat_version(self, key: str, version_id: str) -> ObjectInfo:
        if version_id == "null" and self.null_is_current:
            return dataclasses.replace(await self.stat(key), version_id="null")
        try:
            r = await self.client.head(key, checksums=True, version_id=version_id)
        except InvalidVersionId:
            if await self._null_is_current(version_id):
                return dataclasses.replace(await self.stat(key), version_id="null")
            raise
        _check_version(key, version_id, r.get("VersionId"))
        return dataclasses.replace(_keyless(info_of(key, r)), version_id=version_id)

    async def read_version(
        self, key: str, version_id: str, start: int, end: int, if_match: str | None = None
    ) -> AsyncGenerator[bytes, None]:
        if end <= start:
            return
        if not (version_id == "null" and self.null_is_current):
            chunks = self._get(key, start, end, if_match, version_id)
            try:
                first = await anext(chunks, None)
            except InvalidVersionId:
                if not await self._null_is_current(version_id):
                    raise
            else:
                async with contextlib.aclosing(chunks):
                    if first is not None:
                        yield first
                    async for chunk in chunks:
                        yield chunk
                return
        async with contextlib.aclosing(self.read(key, start, end, if_match)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def list_versions(
        self,
        prefix: str,
        delimiter: str | None,
        key_marker: str | None,
        version_marker: str | None,
        max_keys: int,
    ) -> VersionsPage:
        c = self.client
        args: dict[str, Any] = {
            "Bucket": c.bucket,
            "Prefix": c.prefix + prefix,
            "MaxKeys": max_keys,
        }
        if delimiter:
            args["Delimiter"] = delimiter
        if key_marker:
            args["KeyMarker"] = c.prefix + key_marker
            if version_marker:
                args["VersionIdMarker"] = version_marker
        try:
            page = await (await c.botocore()).list_object_versions(**args)
        except c.failures as exc:
            if version_marker and isinstance(exc, ClientError) and status_of(exc) == 400:
                raise ValueError("invalid version id marker") from None
            raise c.error(exc, prefix) from None
        cut = len(c.prefix)
        entries = [
            VersionEntry(
                ObjectInfo(
                    key=v["Key"][cut:], size=int(v.get("Size") or 0), etag=quoted(v["ETag"]),
                    last_modified=utc(v["LastModified"]),
                    storage_class=v.get("StorageClass") or "STANDARD",
                    version_id=str(v.get("VersionId") or "null"),
                ),
                bool(v.get("IsLatest")),
            )
            for v in page.get("Versions", [])
        ] + [
            VersionEntry(
                ObjectInfo(
                    key=m["Key"][cut:], size=0, etag="", last_modified=utc(m["LastModified"]),
                    version_id=str(m.get("VersionId") or "null"),
                ),
                bool(m.get("IsLatest")),
                delete_marker=True,
            )
            for m in page.get("DeleteMarkers", [])
        ]  # fmt: skip
        # botocore parts versions from delete markers; S3's order is by key, newest first.
        entries.sort(key=lambda e: (e.info.key.encode(), -e.info.last_modified.timestamp()))
        prefixes = [p["Prefix"][cut:] for p in page.get("CommonPrefixes", [])]
        more = bool(page.get("IsTruncated"))
        next_key = page.get("NextKeyMarker") if more else None
        return VersionsPage(
            entries,
            prefixes,
            next_key[cut:] if next_key else None,
            (page.get("NextVersionIdMarker") or None) if more else None,
        )

    async def delete_version(self, key: str, version_id: str) -> VersionDeleted:
        if await self._never_versioned():
            # Its one version of each key is the null one; an origin may take any other id
            # for the current object (moto deletes it), so no other id is sent to it.
            if version_id != "null":
                raise InvalidVersionId(f"{key}: the origin keeps no versions; asked {version_id!r}")
            await self.writes.delete(key)
            return VersionDeleted("null", False)
        where = {**self.client.object_args(key), "VersionId": version_id}
        try:
            r = await (await self.client.botocore()).delete_object(**where)
        except self.client.failures as exc:
            raise self.client.error(exc, key, version_id) from None
        return VersionDeleted(str(r.get("VersionId") or version_id), bool(r.get("DeleteMarker")))

    async def get_versioning(self) -> str | None:
        r = await self.client.call("", "get_bucket_versioning", Bucket=self.client.bucket)
        status = str(r["Status"]) if r.get("Status") else None
        self._ever_versioned = self._ever_versioned or status is not None
        return status

    async def _never_versioned(self) -> bool:
        """Whether the origin's bucket was never versioned (asked until it is seen versioned:
        a bucket once versioned never goes back). Credentials that may not ask cannot tell:
        not known to be never versioned."""
        if self._ever_versioned:
            return False
        try:
            return await self.get_versioning() is None
        except StoreAccessDenied:
            return False

    async def copy(
        self,
        src_key: str,
        dst_key: str,
        attrs: WriteAttrs | None,
        *,
        if_match: str | None = None,
        version_id: str | None = None,
    ) -> ObjectInfo:
        if version_id == "null" and self.null_is_current:
            version_id = None  # the origin refuses the id; its one version is the current one
        return await self.writes.copy(
            src_key, dst_key, attrs, if_match=if_match, version_id=version_id
        )

    def versioning_settable(self) -> bool:
        # Versioning is its bucket's: a mount of a prefix must not change it for the rest.
        return not self.client.prefix

    async def put_versioning(self, status: str) -> None:
        await self.client.call(
            "", "put_bucket_versioning", Bucket=self.client.bucket,
            VersioningConfiguration={"Status": status},
        )  # fmt: skip

    # -- tags: the origin's own object tags --------------------------------------------------

    async def get_tags(self, key: str, version_id: str | None = None) -> dict[str, str]:
        where = self._tagged(key, version_id)
        r = await self.client.call(key, "get_object_tagging", **where)
        return {t["Key"]: t["Value"] for t in r.get("TagSet") or []}

    async def put_tags(
        self, key: str, tags: Mapping[str, str], version_id: str | None = None
    ) -> None:
        where = self._tagged(key, version_id)
        if tags:
            tag_set = [{"Key": k, "Value": v} for k, v in tags.items()]
            await self.client.call(key, "put_object_tagging", **where, Tagging={"TagSet": tag_set})
        else:
            await self.client.call(key, "delete_object_tagging", **where)

    def _tagged(self, key: str, version_id: str | None) -> dict[str, Any]:
        """The arguments that name the object (that version of it) whose tags are asked."""
        where = self.client.object_args(key)
        if version_id is not None and not (version_id == "null" and self.null_is_current):
            where["VersionId"] = version_id
        return where

    # -- parts: the origin says each part's size (HEAD ?partNumber=N) -----------------------

    async def part_sizes(self, key: str, etag: str) -> list[int] | None:
        async def part(number: int) -> tuple[int | None, int, int] | None:
            """(offset if the answer says it, size, parts count) of part `number` as the
            origin answers it; None for an answer that is not of a part (an origin that
            ignores partNumber answers the whole object, no parts count: Ceph RGW 16.2)."""
            # No If-Match: origins differ on what a part's ETag is (moto refuses the
            # object's); the caller checks the sizes add up to the version's.
            r = await self.client.head(key, part=number)
            count = int(r.get("PartsCount") or 0)
            if count < 1:
                return None
            return _range_start(r.get("ContentRange")), int(r["ContentLength"]), count

        first = await part(1)
        if first is None or first[2] != _etag_parts(etag):
            return None  # the origin does not tell the parts this version has
        count = first[2]
        if count > MAX_PARTS_ASKED:
            return None  # a request per part is too many
        answers: list[tuple[int | None, int, int] | None] = [first]
        for start in range(2, count + 1, 16):  # 16 at a time
            batch = range(start, min(start + 16, count + 1))
            answers += await asyncio.gather(*(part(n) for n in batch))
        sizes: list[int] = []
        for answer in answers:
            # Each its own part's answer: of this many parts, where the one before it ended.
            if answer is None or answer[2] != count or answer[0] not in (None, sum(sizes)):
                return None
            sizes.append(answer[1])
        return sizes

    # -- SSE-C: objects the origin encrypted with the client's key, read with it ------------

    async def stat_encrypted(self, key: str, encryption: Mapping[str, str]) -> ObjectInfo:
        keyed = customer_key_headers(encryption) if "customer_key" in encryption else {}
        info = info_of(key, await self.client.head(key, headers=keyed))
        mark = info.encryption.get("customer_key_md5")
        if mark is None:
            # S3 refuses a key for an object not encrypted with one, as this.
            raise StoreRejected(f"{key}: not encrypted with a customer key")
        if mark != encryption.get("customer_key_md5"):
            raise StoreAccessDenied(f"{key}: encrypted with another customer key")
        return info

    async def read_encrypted(
        self, key: str, encryption: Mapping[str, str], start: int, end: int, if_match: str
    ) -> AsyncGenerator[bytes, None]:
        if end <= start:
            return
        keyed = customer_key_headers(encryption)
        async with contextlib.aclosing(
            self._get(key, start, end, if_match, customer_key=keyed)
        ) as chunks:
            async for chunk in chunks:
                yield chunk

    async def _list_page(self, q: ListRequest) -> ListPage:
        full = self.client.prefix
        query = list_query(full + q.prefix, q.delimiter, q.token,
                           full + q.start_after if q.start_after else None, q.max_keys)  # fmt: skip
        body = await self.client.listing(query)
        try:
            return list_page(body, len(full))
        except NotAListing as exc:
            raise StoreError(f"s3://{self.client.bucket}/{full}{q.prefix}: {exc}") from None


def open_s3(parts: SplitResult, options: Mapping[str, str]) -> S3Store:
    """`s3://bucket[/prefix]`."""
    bucket = parts.netloc
    if not bucket or ":" in bucket:
        raise ValueError(f"s3 URI {parts.geturl()!r} needs a bucket name: s3://bucket[/prefix]")
    return S3Store(bucket, unquote(parts.path), options)


def _total_size(content_range: str | None) -> int | None:
    """TOTAL of 'bytes START-END/TOTAL'."""
    if not content_range:
        return None
    _, slash, total = content_range.rpartition("/")
    return int(total) if slash and total.isdigit() else None


def _length(response: Mapping[str, Any]) -> int | None:
    value = response.get("ContentLength")
    return None if value is None else int(value)


async def _drop(body: AsyncGenerator[bytes, None]) -> None:
    """Close an answer's body unread: its connection is closed rather than pooled (a body
    never started would leave its response open)."""
    with contextlib.suppress(StopAsyncIteration, Exception):
        await anext(body)
    await body.aclose()


async def _no_bytes() -> AsyncGenerator[bytes, None]:
    return
    yield


def _check_version(key: str, asked: str, answered: str | None) -> None:
    """An answer to a request for version `asked` is of that version. An origin that answers
    without a version id ignored it (its bucket was never versioned, where S3 refuses any id
    but "null"; moto answers with the current object): never taken for the version asked."""
    if answered is None:
        if asked != "null":
            raise InvalidVersionId(f"{key}: the origin keeps no versions; asked for {asked!r}")
    elif answered != asked:
        raise StoreError(f"{key}: asked for version {asked!r}, the origin answered {answered!r}")


def _keyless(info: ObjectInfo) -> ObjectInfo:
    """`info`, unless its object was written with an SSE-C key: a read without the key is
    refused (S3 answers 400), whether or not the origin itself would serve it."""
    if "customer_key_md5" in info.encryption:
        raise StoreRejected(f"{info.key}: encrypted with a customer key; the key is needed")
    return info


def _range_start(content_range: str | None) -> int | None:
    """The first byte of a `Content-Range: bytes a-b/n` answer; None without one."""
    if not content_range or not content_range.startswith("bytes "):
        return None
    first, dash, _ = content_range[6:].partition("-")
    return int(first) if dash and first.isdigit() else None


def _etag_parts(etag: str) -> int | None:
    """N of a multipart ETag ("<md5>-N"); None for one that does not say."""
    _, dash, count = etag.strip('"').rpartition("-")
    return int(count) if dash and count.isdigit() else None
